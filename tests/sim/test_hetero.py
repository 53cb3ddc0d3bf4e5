"""The heterogeneous simulator on the Sia artifact's per-type traces."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from pollux.cluster_spec import allocation_gpu_type, parse_cluster_spec
from pollux.errors import WorkloadError
from pollux.policies.base import Allocations, JobInfo, NodeInfo, Policy, PolicyDecision
from pollux.policies.sia import SiaPolicy
from pollux.sim.applications import TypedApplication, load_typed_applications
from pollux.sim.config import ClusterConfig
from pollux.sim.job import BatchMode, JobSpec, SimJob
from pollux.sim.metrics import summarize_run
from pollux.sim.semantics import SIA_ARTIFACT
from pollux.sim.simulator import Simulator
from pollux.sim.workload import Workload

SIA = Path(__file__).resolve().parents[2].parent / "shared" / "sia-artifact"
needs_sia = pytest.mark.skipif(not (SIA / "traces").is_dir(),
                               reason=f"the Sia artifact data is not at {SIA}")
SPEC = parse_cluster_spec("aws:6x4,dgx-ext:2x8,rtx:3x8")


def typed(**options: object) -> ClusterConfig:
    """The typed cluster with the Sia artifact's semantics."""
    options.setdefault("semantics", SIA_ARTIFACT)
    return ClusterConfig(cluster=SPEC, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def apps() -> dict[str, TypedApplication]:
    return load_typed_applications(SIA / "traces", SPEC.gpu_types)


@needs_sia
def test_reference_facts_of_the_typed_applications(apps: dict[str, TypedApplication]) -> None:
    speeds = apps["cifar10"].type_speeds()
    assert speeds["dgx-ext"] / speeds["aws"] == pytest.approx(6.90, abs=0.005)
    assert speeds["rtx"] / speeds["aws"] == pytest.approx(2.27, abs=0.005)
    yolo = apps["yolov3"].type_speeds()
    assert yolo["rtx"] / yolo["aws"] == pytest.approx(0.42, abs=0.005)
    assert apps["deepspeech2"].by_type["rtx"].spec.max_local_bsz == 57
    assert apps["deepspeech2"].by_type["dgx-ext"].spec.max_local_bsz == 320
    assert SIA_ARTIFACT.calibration("cifar10") == pytest.approx(1 / 1.8)
    assert SIA_ARTIFACT.restart_delay_s("imagenet", 30.0) == 250.0
    with pytest.raises(WorkloadError, match="placements-h100.csv"):
        load_typed_applications(SIA / "traces", ["aws", "h100"])


class SpanningPolicy(Policy):
    """Puts every job on one aws and one rtx GPU."""

    name: ClassVar[str] = "spanning"
    adaptive_jobs: ClassVar[bool] = True

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        return PolicyDecision({jobs[0].name: ("aws-0", "rtx-0")})


def workload() -> Workload:
    return Workload("three", (JobSpec("bert-0", 0.0, "bert", 1, 12),
                              JobSpec("deepspeech2-1", 30.0, "deepspeech2", 2, 40),
                              JobSpec("bert-2", 100.0, "bert", 1, 12)))


@needs_sia
def test_an_allocation_that_spans_types_is_refused(apps: dict[str, TypedApplication],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    config = typed(max_time_s=600.0)
    result = Simulator(workload(), apps, SpanningPolicy(), config).run()
    assert not any(r.gpus for r in result.rounds)  # never applied...
    assert "spans GPU types" in caplog.text  # ...and reported, once, as the job's event
    (event,) = [e for job in result.jobs for e in job.events]
    assert "spans GPU types" in event[1]


@needs_sia
def test_sia_runs_a_small_workload_with_the_reference_accounting(apps: dict[str, TypedApplication]) -> None:
    result = Simulator(workload(), apps, SiaPolicy(), typed()).run()
    record = summarize_run(result, apps)
    assert record.num_completed == 3
    for job in result.jobs:
        assert job.completion_time_s is not None
        assert job.completion_time_s == int(job.completion_time_s)  # 1 s resolution
        # whole rounds held: a multiple of one GPU-minute, and at least the time trained
        assert job.held_gpu_s % 60.0 == 0
        assert job.held_gpu_s >= job.attained_service_s - 1e-6
        assert sum(result.gpu_types[job.name].values()) * 60.0 <= job.held_gpu_s
        assert job.num_restarts is not None and job.num_restarts >= 0
    # bert gains 10.8x on an A100 over a T4: it ends up on the A100s
    assert "dgx-ext" in result.gpu_types["bert-0"]
    assert record.gpu_hours_per_job == pytest.approx(
        sum(j.held_gpu_s for j in result.jobs) / 3600 / 3)
    assert record.round_s.median < 1.0


@needs_sia
@pytest.mark.parametrize("name", ["tiresias", "optimus", "fifo"])
def test_fixed_batch_baselines_complete_a_small_typed_workload(
        apps: dict[str, TypedApplication], name: str) -> None:
    from pollux.policies.registry import make_policy

    result = Simulator(workload(), apps, make_policy(name, seed=0),
                             typed()).run()
    assert summarize_run(result, apps).num_completed == 3
    nodes = {node.name: node for node in SPEC.node_infos()}
    for job in result.jobs:
        assert job.target_batch_size == job.spec.batch_size
        assert not job.events  # every decision applied: none spanned types
        assert all(not p.observations for p in job.profiles.values())
        assert allocation_gpu_type(job.allocation, nodes) is None  # released at the end
    if name != "optimus":  # tuned GPU counts: bert-0 and bert-2 on 1 GPU, deepspeech2 on 2
        assert all(set(r.gpus.values()) <= {1, 2} for r in result.rounds)


@needs_sia
def test_cli_runs_a_typed_cluster_and_keeps_the_record_keys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pollux.cli.main import main
    from pollux.sim.workload import write_workload
    from tests.sim.test_cli import RUN_FIELDS

    path = tmp_path / "three.csv"
    write_workload(workload(), path)
    out = tmp_path / "out.json"
    assert main(["simulate", str(path), "--cluster", str(SPEC), "--traces",
                 str(SIA / "traces"), "--policy", "sia", "--processes", "1",
                 "--json", str(out)]) == 0
    assert "sia" in capsys.readouterr().out
    run = json.loads(out.read_text())["runs"][0]
    assert RUN_FIELDS <= set(run)
    assert run["num_completed"] == 3 and run["gpu_hours_per_job"] > 0
    assert main(["simulate", str(path), "--cluster", str(SPEC), "--policy", "sia"]) != 0
    assert "needs per-type traces" in capsys.readouterr().err
    assert main(["simulate", str(path), "--cluster", "aws:6", "--policy", "sia"]) != 0
    assert "type:NODESxGPUS" in capsys.readouterr().err


@needs_sia
def test_unaware_jobs_pool_one_model(apps: dict[str, TypedApplication]) -> None:
    from pollux.policies.pollux_unaware import PolluxUnawarePolicy

    result = Simulator(workload(), apps, PolluxUnawarePolicy(),
                             typed()).run()
    assert summarize_run(result, apps).num_completed == 3
    for job in result.jobs:
        assert job.pooled is not None and job.pooled.observations
        assert all(not p.observations for p in job.profiles.values())


@needs_sia
def test_a_fixed_batch_job_trains_its_tuned_batch_on_every_type(
        apps: dict[str, TypedApplication]) -> None:
    job = SimJob(JobSpec("deepspeech2-0", 0.0, "deepspeech2", 6, 320),
                 apps["deepspeech2"], BatchMode.FIXED, placement_limits=True)
    for gpu_type, placement in (("aws", (4, 2)), ("rtx", (6,)), ("dgx-ext", (3,))):
        job.reallocate(("x",) * sum(placement), placement, 0.0, gpu_type)
        steps = (job.accum_steps + 1) * sum(placement)  # atomic batches per step
        assert 320 <= job.atomic_bsz * steps < 320 + steps  # the tuned batch, rounded up
        assert job.atomic_bsz <= apps["deepspeech2"].by_type[gpu_type].max_local_bsz_at(
            placement)


class PinnedPolicy(Policy):
    """Keeps every job on one dgx-ext GPU and records what it is told of it."""

    name: ClassVar[str] = "pinned"
    adaptive_jobs: ClassVar[bool] = True

    def __init__(self) -> None:
        self.seen: list[tuple[float, JobInfo]] = []

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        self.seen += [(job.age_s, job) for job in jobs]
        return PolicyDecision({job.name: ("dgx-ext-0",) for job in jobs[:1]})


@needs_sia
def test_remaining_seconds_match_the_time_the_job_takes(
        apps: dict[str, TypedApplication]) -> None:
    policy = PinnedPolicy()
    one = Workload("one", (JobSpec("cifar10-0", 0.0, "cifar10", 1, 128),))
    result = Simulator(one, apps, policy, typed()).run()
    done = result.jobs[0].completion_time_s
    assert done is not None
    age_s, info = next((age, j) for age, j in policy.seen if j.remaining_s)
    model = info.typed_goodput
    assert model is not None and info.remaining_s is not None
    on_dgx_s = info.remaining_s * model.reference_goodput / float(
        model.goodput("dgx-ext", 1, 1))
    # within 2x (a model fitted after one round); steps vs samples would be 128x off
    assert 0.5 < (done - age_s) / on_dgx_s < 2.0


class FastGrowthPolicy(PinnedPolicy):
    """PinnedPolicy that lets jobs grow 4x the replicas they ran with (not the reference's
    2x)."""

    exploration_factor = 4.0


@needs_sia
@pytest.mark.parametrize(("policy", "cap"), [(PinnedPolicy(), 2), (FastGrowthPolicy(), 4)])
def test_a_policy_sets_the_growth_cap_of_its_jobs(apps: dict[str, TypedApplication],
                                                  policy: PinnedPolicy, cap: int) -> None:
    one = Workload("one", (JobSpec("cifar10-0", 0.0, "cifar10", 1, 128),))
    Simulator(one, apps, policy, typed(max_time_s=600.0)).run()
    ran = [job for _, job in policy.seen if job.typed_goodput is not None]
    assert ran  # ran on 1 dgx-ext GPU: caps from that, 1 on the types it never ran on
    assert ran[-1].own_caps() == {"aws": 1, "dgx-ext": cap, "rtx": 1}
    assert ran[-1].max_replicas == cap


@needs_sia
def test_projection_speeds_from_other_applications(apps: dict[str, TypedApplication]) -> None:
    """``others``: the table a cluster learns from the other applications (leave one
    out), not the job's own ratios; yolov3 runs 0.42x a T4 on an RTX, the others 1.4x+."""
    from pollux.errors import ConfigError
    from pollux.sim.simulator import projection_speeds

    own = projection_speeds(apps, "own")
    others = projection_speeds(apps, "others")
    assert own["yolov3"]["rtx"] / own["yolov3"]["aws"] == pytest.approx(0.42, abs=0.005)
    assert others["yolov3"]["rtx"] / others["yolov3"]["aws"] > 1.3
    assert set(others["yolov3"]) == set(SPEC.gpu_types)
    with pytest.raises(ConfigError, match="speeds_from"):
        typed(speeds_from="mine")


@needs_sia
def test_typed_cli_takes_every_option_and_writes_every_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pollux.cli.main import main
    from pollux.sim.workload import write_workload

    path = tmp_path / "three.csv"
    write_workload(workload(), path)
    typed = ["simulate", str(path), "--cluster", str(SPEC), "--traces", str(SIA / "traces"),
             "--policy", "sia", "--processes", "1"]
    assert main([*typed, "--nodes", "4"]) != 0  # the one option that cannot work
    assert "a typed --cluster gives the nodes" in capsys.readouterr().err
    out = tmp_path / "options.json"
    assert main([*typed, "--policy", "pollux", "--restart-delay", "0", "--interference",
                 "0.5", "--job-knowledge", "oracle", "--json", str(out)]) == 0
    capsys.readouterr()
    run = json.loads(out.read_text())["runs"][0]
    assert run["num_completed"] == 3 and run["max_ftf"] > 0  # fairness on typed clusters
    generated = ["simulate", "--cluster", str(SPEC), "--traces", str(SIA / "traces"),
                 "--policy", "tiresias", "--jobs", "4", "--hours", "0.2", "--json", "-"]
    assert main(generated) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["num_jobs"] == 4
    assert main([*typed, "--json", "-", "--plot", str(tmp_path / "plots"),
                 "--html", str(tmp_path / "report.html")]) == 0
    out_text = capsys.readouterr().out
    assert json.loads(out_text)["runs"][0]["num_completed"] == 3
    assert not (Path.cwd() / "-").exists()
    assert {p.name for p in (tmp_path / "plots").glob("*.png")} == {
        "jct_cdf.png", "avg_jct.png", "timeline-sia-three.png", "gpus-three.png"}
    assert "typed cluster" in (tmp_path / "report.html").read_text()


@needs_sia
def test_options_change_the_typed_run(apps: dict[str, TypedApplication]) -> None:
    """--restart-delay replaces the per-application delays, interference slows distributed
    jobs sharing a node, and oracle knowledge hands jobs their true model per type."""
    from dataclasses import replace

    from pollux.policies.registry import make_policy

    def run(config: ClusterConfig, knowledge: str = "measured") -> Simulator:
        sim = Simulator(workload(), apps, make_policy("pollux", seed=0), config,
                        job_knowledge=knowledge)
        sim.run()
        return sim

    base = run(typed())
    free = run(typed(semantics=replace(SIA_ARTIFACT, restart_delays_s=None),
                     restart_delay_s=0.0))
    assert all(j.completion_time_s is not None for j in base.jobs + free.jobs)
    assert sum(j.completion_time_s or 0 for j in free.jobs) < sum(
        j.completion_time_s or 0 for j in base.jobs)
    oracle = run(typed(), "oracle")
    assert all(p.params is p.known_params for j in oracle.jobs for p in j.profiles.values()
               if p.params is not None)
    assert all(p.known_params is None for j in base.jobs for p in j.profiles.values())


class BigStartPolicy(PinnedPolicy):
    """PinnedPolicy that lets a job that has not run yet start with 4 replicas."""

    initial_replicas = 4


@needs_sia
def test_a_policy_sets_how_many_replicas_a_new_job_may_start_with(
        apps: dict[str, TypedApplication]) -> None:
    from pollux.policies.base import TYPE_SPEEDS_KEY

    for policy, first_cap in ((PinnedPolicy(), 1), (BigStartPolicy(), 4)):
        one = Workload("one", (JobSpec("cifar10-0", 0.0, "cifar10", 1, 128),))
        Simulator(one, apps, policy, typed(max_time_s=600.0)).run()
        first = policy.seen[0][1]
        assert first.typed_goodput is None
        assert first.own_caps() == dict.fromkeys(SPEC.gpu_types, first_cap)
        assert first.extras[TYPE_SPEEDS_KEY] == apps["cifar10"].type_speeds()
        ran = [job for _, job in policy.seen if job.typed_goodput is not None][-1]
        # once it has run (1 dgx-ext GPU here), the growth rule alone
        assert ran.own_caps() == {"aws": 1, "dgx-ext": 2, "rtx": 1}
