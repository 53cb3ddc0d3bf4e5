"""pollux.adaptdl in one process: AdaptDL's module tree, call shapes and the default job."""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import torch

from pollux import adaptdl
from pollux.adaptdl.default_job import DEFAULT_JOB, NotInitializedError

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                    "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in list(os.environ):
        if key.startswith(("POLLUX_", "ADAPTDL_")) or key in LAUNCH_VARIABLES:
            monkeypatch.delenv(key)
    checkpoints = tmp_path / "checkpoints"
    monkeypatch.setenv("POLLUX_CHECKPOINT_DIR", str(checkpoints))
    return checkpoints


@pytest.fixture
def adl(clean_env: Path) -> Iterator[object]:
    import pollux.adaptdl.torch as adl

    assert DEFAULT_JOB.job is None
    yield adl
    adl.destroy_process_group()


def test_the_module_tree_has_adaptdls_shape() -> None:
    """`from pollux import adaptdl` + `import pollux.adaptdl.torch` give adaptdl.torch.X."""
    torch_api = importlib.import_module("pollux.adaptdl.torch")
    assert adaptdl.torch is torch_api  # type: ignore[attr-defined]
    for name in ("init_process_group", "AdaptiveDataLoader", "AdaptiveDataParallel",
                 "AdaptiveDataLoaderMixin", "remaining_epochs_until", "current_epoch",
                 "finished_epochs", "current_dataloader", "Accumulator"):
        assert callable(getattr(torch_api, name)), name
    for module, names in {adaptdl.env: ("share_path", "checkpoint_path", "replica_rank",
                                        "num_replicas", "num_nodes", "num_restarts", "job_id",
                                        "master_addr", "master_port"),
                          adaptdl.collective: ("allreduce", "allreduce_async", "broadcast"),
                          adaptdl.checkpoint: ("State", "load_state", "save_all_states",
                                               "save_state")}.items():
        for name in names:
            assert callable(getattr(module, name)), (module, name)
    rules = importlib.import_module("pollux.adaptdl.torch.scaling_rules")
    for name in ("AdaScale", "AdamScale", "LinearScale", "SqrtScale", "LEGWScale",
                 "ScalingRuleBase"):
        assert hasattr(rules, name)


def test_env_reads_the_launch_before_and_the_job_after_init(
        adl: object, clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = adaptdl.env
    assert (env.replica_rank(), env.num_replicas(), env.num_nodes(), env.num_restarts()) == \
        (0, 1, 1, 0)
    assert env.checkpoint_path() == str(clean_env) and env.share_path() is None
    monkeypatch.setenv("ADAPTDL_SHARE_PATH", "/data/adaptdl")
    assert env.share_path() == "/data/adaptdl"
    monkeypatch.setenv("POLLUX_SHARE_DIR", "/data/pollux")
    assert env.share_path() == "/data/pollux"
    job = adl.init_process_group("gloo")  # type: ignore[attr-defined]
    assert DEFAULT_JOB.job is job and env.job_id() == "local"


def test_calls_that_need_the_job_say_to_init_first(clean_env: Path) -> None:
    import pollux.adaptdl.torch as adl

    with pytest.raises(NotInitializedError, match="init_process_group"):
        adaptdl.collective.allreduce(1)
    with pytest.raises(NotInitializedError, match="init_process_group"):
        adl.Accumulator()
    with pytest.raises(NotInitializedError, match="init_process_group"):
        adl.AdaptiveDataParallel(torch.nn.Linear(2, 1),
                                 torch.optim.SGD([torch.zeros(1)], lr=0.1))
    assert adl.current_epoch() is None and adl.current_dataloader() is None


def test_init_twice_is_an_error_and_destroy_allows_a_new_job(adl: object) -> None:
    adl.init_process_group("gloo")  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="already"):
        adl.init_process_group("gloo")  # type: ignore[attr-defined]
    adl.destroy_process_group()  # type: ignore[attr-defined]
    assert DEFAULT_JOB.job is None
    adl.init_process_group("gloo")  # type: ignore[attr-defined]


def test_object_collectives_on_one_replica(adl: object) -> None:
    adl.init_process_group("gloo")  # type: ignore[attr-defined]
    assert adaptdl.collective.allreduce(3) == 3
    assert adaptdl.collective.allreduce_async({"a": 1}, lambda a, b: a).result() == {"a": 1}
    assert adaptdl.collective.broadcast([1, 2]) == [1, 2]


class Best(adaptdl.checkpoint.State):
    def __init__(self) -> None:
        super().__init__("best")
        self.value = 0.0
        self.syncs = 0

    def save(self, fileobj: IO[bytes]) -> None:
        pickle.dump(self.value, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        self.value = pickle.load(fileobj)

    def sync(self) -> None:
        self.syncs += 1


def test_a_state_made_before_init_is_saved_and_restored_in_a_new_job(adl: object) -> None:
    best = Best()  # before init_process_group, as AdaptDL allows
    adl.init_process_group("gloo")  # type: ignore[attr-defined]
    assert adaptdl.checkpoint.load_state(best) is False  # fresh start
    best.value = 0.93
    assert adaptdl.checkpoint.save_all_states() is not None
    assert best.syncs == 1
    with pytest.raises(ValueError, match="best"):
        Best()  # names are unique
    adl.destroy_process_group()  # type: ignore[attr-defined]

    adl.init_process_group("gloo")  # type: ignore[attr-defined]  # "after a restart"
    again = Best()
    assert again.value == 0.0
    assert adaptdl.checkpoint.load_state(again) is True and again.value == 0.93


def test_accumulator_synchronized_mode_is_a_dict_whose_writes_stay(adl: object) -> None:
    adl.init_process_group("gloo")  # type: ignore[attr-defined]
    stats = adl.Accumulator()  # type: ignore[attr-defined]
    stats["correct"] += 30
    stats["total"] += 40
    stats.update({"total": 10})
    with stats.synchronized():
        assert stats["total"] == 50
        stats["accuracy"] = stats["correct"] / stats["total"]
        assert "'accuracy': 0.6" in repr(stats)
    stats["correct"] += 5
    with stats.synchronized():
        assert stats["accuracy"] == pytest.approx(0.6) and stats["correct"] == 35
        stats.clear()
    with stats.synchronized():
        assert dict(stats) == {}


def test_model_arguments_are_adaptdls(adl: object) -> None:
    adl.init_process_group("gloo")  # type: ignore[attr-defined]
    net, gen = torch.nn.Linear(4, 2), torch.nn.Linear(3, 4)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    model = adl.AdaptiveDataParallel(net, opt, sched, None)  # type: ignore[attr-defined]
    from pollux.torch.adam_scale import AdamGainScale

    assert isinstance(model.scaling_rule, AdamGainScale)  # AdaptDL's default for Adam
    with pytest.raises(ValueError, match="name="):
        adl.AdaptiveDataParallel(  # type: ignore[attr-defined]
            gen, torch.optim.SGD(gen.parameters(), lr=0.1))
    # AdaptDL's DCGAN example passes the name 4th; name= is the documented way
    second = adl.AdaptiveDataParallel(  # type: ignore[attr-defined]
        gen, torch.optim.SGD(gen.parameters(), lr=0.1), None, "generator")
    assert second.name == "generator" and DEFAULT_JOB.job is not None
    assert DEFAULT_JOB.job.model is model and DEFAULT_JOB.job.followers() == [second]
    assert model.gns.sqr_avg() == 0.0 and model.gns.gain(4.0) == 1.0


def test_scaling_rules_map_to_the_agents(adl: object) -> None:
    from pollux.adaptdl.torch import scaling_rules as rules
    from pollux.torch import scaling_rules as native

    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    assert isinstance(rules.native_rule(None, sgd), native.AdaScale)
    assert isinstance(rules.native_rule(rules.SqrtScale(), sgd), native.SqrtScale)
    assert isinstance(rules.native_rule(rules.LinearScale(), sgd), native.LinearScale)
    assert rules.native_rule(rules.AdamScale(), sgd).lr_factor(8.0, 4.0, 0.0) == 2.0

    class Half(rules.ScalingRuleBase):
        def scale_lr(self, scale: float) -> float:
            return 1 + (scale - 1) / 2

    assert rules.native_rule(Half(), sgd).lr_factor(3.0, 1.0, 0.0) == 2.0
    with pytest.raises(ValueError, match="scaling_rule"):
        rules.native_rule("adascale", sgd)


def test_loaders_made_before_init_join_the_job_and_run_an_epoch(adl: object) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    loader = adl.AdaptiveDataLoader(data, batch_size=8, drop_last=True)  # type: ignore[attr-defined]
    assert len(loader) == 5 and loader.current_local_bsz is None
    with pytest.raises(ValueError, match="sampler"):
        adl.AdaptiveDataLoader(data, sampler=[0, 1])  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="max_batch_size"):
        loader.autoscale_batch_size(4)
    loader.autoscale_batch_size(32, local_bsz_bounds=(4, 16))
    adl.init_process_group("gloo")  # type: ignore[attr-defined]
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model = adl.AdaptiveDataParallel(net, opt)  # type: ignore[attr-defined]
    seen = 0
    for epoch in adl.remaining_epochs_until(1):  # type: ignore[attr-defined]
        assert adl.current_epoch() == epoch == 0  # type: ignore[attr-defined]
        for x, y in loader:
            assert adl.current_dataloader() is loader  # type: ignore[attr-defined]
            assert len(x) <= loader.current_local_bsz and loader.accumulation_steps == 0
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            seen += len(x)
    assert adl.finished_epochs() == 1 and adl.current_epoch() is None  # type: ignore[attr-defined]
    assert seen >= 40 and loader.current_batch_size is not None

    class Writer:
        def __init__(self) -> None:
            self.tags: list[str] = []

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.tags.append(tag)

    writer = Writer()
    loader.to_tensorboard(writer, 0, tag_prefix="AdaptDL/Data")
    model.to_tensorboard(writer, 0, tag_prefix="AdaptDL/Model/")
    assert "AdaptDL/Data/Total_Batch_Size" in writer.tags
    assert "AdaptDL/Model/Gain" in writer.tags and "AdaptDL/Model/Progress" in writer.tags


def test_an_explicit_init_method_names_the_rendezvous(adl: object) -> None:
    from tests.torch.launcher import free_port

    with pytest.raises(ValueError, match="init_method"):
        adl.init_process_group("gloo", init_method="env://")  # type: ignore[attr-defined]
    port = free_port()
    job = adl.init_process_group(  # type: ignore[attr-defined]
        "gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    assert job.launch.source.value == "torchrun" and adaptdl.env.master_port() == port


def test_drop_last_and_shuffle_are_pytorchs(adl: object) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(44, dtype=torch.float32))
    kept = adl.AdaptiveDataLoader(data, batch_size=8, drop_last=True)  # type: ignore[attr-defined]
    every = adl.AdaptiveDataLoader(data, batch_size=8)  # type: ignore[attr-defined]
    adl.init_process_group("gloo")  # type: ignore[attr-defined]
    net = torch.nn.Linear(1, 1)
    adl.AdaptiveDataParallel(net, torch.optim.SGD(net.parameters(), lr=0.0))  # type: ignore[attr-defined]
    seen: dict[str, list[float]] = {"kept": [], "every": []}
    for _ in adl.remaining_epochs_until(1):  # type: ignore[attr-defined]
        for name, loader in (("kept", kept), ("every", every)):
            for (x,) in loader:
                seen[name].extend(x.tolist())
    assert seen["kept"] == list(range(40))  # in order (shuffle=False), the last 4 dropped
    assert seen["every"] == list(range(44))
