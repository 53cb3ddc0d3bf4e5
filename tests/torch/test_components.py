"""Small parts of the agent: launch environment, scaling rules, batch decisions,
agreement encoding, hints delivery, layering."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from pollux.errors import ConfigError, UnknownPluginError
from pollux.jobenv import JobEnvironment
from pollux.models import GradientStats, JobHints, ThroughputParams
from pollux.models.typed import TypeProfile
from pollux.server_proof import server_proof
from pollux.torch.agreement import Agreement, _decode, _encode
from pollux.torch.batch_size import (
    BatchConfig,
    BatchLimits,
    choose_batch_config,
    initial_batch_config,
)
from pollux.torch.distributed import LaunchSource, read_launch_environment
from pollux.torch.hints_reporter import HintsReporter, send_hints
from pollux.torch.job import AgentConfig
from pollux.torch.scaling_rules import (
    AdaScale,
    LinearScale,
    SqrtScale,
    WarmupScale,
    scaling_rule_by_name,
)

# -- launch environment ------------------------------------------------------------------


def test_pollux_variables_win() -> None:
    env = JobEnvironment(job_id="j1", rank=2, num_replicas=4, local_rank=0, node_rank=1,
                         num_nodes=2, master_addr="10.0.0.1", master_port=2900,
                         checkpoint_dir="/ck", hints_target="http://s/h", hints_token="t",
                         num_restarts=3).to_env()
    launch = read_launch_environment({**env, "RANK": "2", "WORLD_SIZE": "4",
                                      "MASTER_PORT": "2900", "TORCHELASTIC_RUN_ID": "tr"})
    assert launch.source is LaunchSource.POLLUX and launch.job_id == "j1"
    assert (launch.rank, launch.num_replicas, launch.num_nodes, launch.node_rank) == (2, 4, 2, 1)
    assert (launch.master_addr, launch.master_port) == ("10.0.0.1", 2900)
    assert (launch.checkpoint_dir, launch.hints_target, launch.hints_token,
            launch.num_restarts) == ("/ck", "http://s/h", "t", 3)


def test_torchrun_variables() -> None:
    launch = read_launch_environment({
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234",
        "POLLUX_CHECKPOINT_DIR": "/ck"})
    assert launch.source is LaunchSource.TORCHRUN
    assert (launch.rank, launch.num_replicas, launch.local_rank) == (3, 4, 1)
    assert (launch.num_nodes, launch.node_rank, launch.master_port) == (2, 1, 1234)
    assert launch.checkpoint_dir == "/ck"


def test_nothing_means_a_single_process() -> None:
    launch = read_launch_environment({})
    assert launch.source is LaunchSource.SINGLE
    assert (launch.rank, launch.num_replicas, launch.checkpoint_dir) == (0, 1, None)


@pytest.mark.parametrize("env, field", [
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "RANK"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "rank"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_PORT"),
])
def test_bad_launch_variables_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        read_launch_environment(env)


# -- scaling rules -----------------------------------------------------------------------


def test_scaling_rules() -> None:
    assert AdaScale().lr_factor(4.0, 2.5, 0.0) == 2.5
    assert SqrtScale().lr_factor(4.0, 2.5, 0.0) == 2.0
    assert LinearScale().lr_factor(4.0, 2.5, 0.0) == 4.0
    warm = WarmupScale(warmup_steps=10, base=LinearScale())
    assert warm.lr_factor(2.0, 1.0, 0.0) == pytest.approx(2.0 * 1.0 / 20)
    assert warm.lr_factor(2.0, 1.0, 9.0) == pytest.approx(1.0)
    assert warm.lr_factor(2.0, 1.0, 100.0) == 2.0
    assert isinstance(scaling_rule_by_name("sqrt"), SqrtScale)
    with pytest.raises(UnknownPluginError, match="adascale, linear, sqrt"):
        scaling_rule_by_name("cubic")
    with pytest.raises(ConfigError, match="warmup_steps"):
        WarmupScale(warmup_steps=0)


# -- batch decisions ---------------------------------------------------------------------

PARAMS = ThroughputParams(alpha_c=0.05, beta_c=0.0005, alpha_n=0.1, beta_n=0.0,
                          alpha_r=0.02, beta_r=0.0, gamma=1.0)


def test_initial_configuration() -> None:
    limits = BatchLimits(64, 1024, (8, 32), accumulation=True)
    assert initial_batch_config(limits, 2) == BatchConfig(32, 0)
    assert initial_batch_config(limits, 1) == BatchConfig(32, 1)
    assert initial_batch_config(BatchLimits(64, 64, (1, 64), accumulation=False), 1) \
        == BatchConfig(64, 0)
    assert initial_batch_config(BatchLimits(64, 512, (4, 16)), 2) == BatchConfig(16, 1)


def test_choose_switches_only_for_a_large_enough_gain() -> None:
    limits = BatchLimits(32, 1024, (8, 256), accumulation=True)
    noisy = GradientStats(sqr=1.0, var=100.0)  # large noise scale: big batches pay off
    current = BatchConfig(16, 0)
    best = choose_batch_config(limits, PARAMS, noisy, 1, 2, current)
    assert best.total(2) > 32
    assert choose_batch_config(limits, PARAMS, noisy, 1, 2, best) == best
    assert choose_batch_config(limits, PARAMS, noisy, 1, 2, current, min_gain=1e6) == current
    assert choose_batch_config(limits, None, noisy, 1, 2, current) == current
    assert choose_batch_config(limits, PARAMS, None, 1, 2, None) == \
        initial_batch_config(limits, 2)


def test_batch_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match="max_batch_size"):
        BatchLimits(64, 32, (1, 64))
    with pytest.raises(ConfigError, match="local_bsz_bounds"):
        BatchLimits(64, 128, (0, 64))
    with pytest.raises(ConfigError, match="local_bsz"):
        BatchConfig(0)


# -- agreement encoding ------------------------------------------------------------------


def test_agreement_round_trip_and_stop_flags_add_up() -> None:
    proposal = Agreement(stop=False, save_checkpoint=True, batch_config=BatchConfig(48, 2),
                         next_sync_steps=17, grad_stats=GradientStats(0.5, 3.25))
    assert _decode(_encode(False, proposal)) == proposal
    summed = _encode(False, proposal) + _encode(True, None) + _encode(False, None)
    decoded = _decode(summed)
    assert decoded.stop and decoded.batch_config == BatchConfig(48, 2)
    no_stats = Agreement(False, False, BatchConfig(8), 1, None)
    assert _decode(_encode(False, no_stats)).grad_stats is None


# -- hints -------------------------------------------------------------------------------

HINTS = JobHints(init_batch_size=32, max_batch_size=512, local_bsz_bounds=(8, 64),
                 throughput_params=PARAMS, grad_stats=GradientStats(1.0, 2.0), batch_size=64)


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str | None, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.headers.get("Authorization"), json.loads(body)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self) -> None:  # noqa: N802 - the server proof (pollux.server_proof)
        query = parse_qs(urlsplit(self.path).query)
        origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        body = json.dumps({"proof": server_proof("secret", query["nonce"][0], origin,
                                                 query["job"][0])}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def http_server() -> Iterator[tuple[str, type[_Collector]]]:
    handler = type("Collector", (_Collector,), {"received": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/jobs/j/hints", handler
    server.shutdown()
    server.server_close()


def test_hints_are_posted_with_the_token(http_server: tuple[str, type[_Collector]]) -> None:
    url, handler = http_server
    reporter = HintsReporter(url, token="secret", interval_s=60)
    reporter.update(HINTS, urgent=True)
    deadline = time.monotonic() + 10
    while not handler.received and time.monotonic() < deadline:
        time.sleep(0.01)
    reporter.close()
    auth, body = handler.received[0]
    assert auth == "Bearer secret"
    assert JobHints.from_dict(body) == HINTS


def test_a_jobs_hints_token_goes_only_to_the_server_itself() -> None:
    """Hostile: the process on the hints URL's port is not the server (it took the port
    after the server died, and answers nothing useful): the token is never sent."""
    received = bytearray()
    squatter = socket.create_server(("127.0.0.1", 0))
    squatter.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = squatter.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(0.3)
                try:
                    received.extend(conn.recv(65536))
                    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n{\"proof\": \"" + b"0" * 64 + b"\"}")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{squatter.getsockname()[1]}/api/jobs/j-1/hints"
        reporter = HintsReporter(url, token="the-jobs-token", interval_s=0.05, timeout_s=0.5)
        reporter.update(HINTS, urgent=True)
        deadline = time.monotonic() + 5
        while reporter.num_failed < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        reporter.close(timeout_s=1.0)
        assert reporter.num_failed >= 2 and reporter.num_sent == 0
        assert b"/api/auth/proof" in received  # it was asked to prove itself ...
        assert b"the-jobs-token" not in received  # ... and never got the token
        assert b"Authorization" not in received
    finally:
        stop.set()
        thread.join(timeout=5)
        squatter.close()


def test_hints_file_target_is_written_atomically(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "hints.json"
    send_hints(str(target), HINTS.to_dict())
    assert JobHints.from_dict(json.loads(target.read_text())) == HINTS
    assert [p.name for p in target.parent.iterdir()] == ["hints.json"]


def test_a_dead_scheduler_never_blocks_the_caller() -> None:
    reporter = HintsReporter("http://127.0.0.1:9/hints", interval_s=0.05, timeout_s=0.5)
    start = time.monotonic()
    for _ in range(100):
        reporter.update(HINTS, urgent=True)
    assert time.monotonic() - start < 0.5
    time.sleep(0.2)
    reporter.close(timeout_s=1.0)
    assert reporter.num_failed >= 1 and reporter.num_sent == 0


# -- layering ----------------------------------------------------------------------------


def test_agent_does_not_import_the_scheduler_side() -> None:
    code = ("import sys, pollux.torch\n"
            "bad = [m for m in sys.modules if m.startswith(('pollux.policies', 'pollux.sim', "
            "'pollux.service', 'pollux.backends', 'fastapi', 'tensorboard'))]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_public_api_is_importable() -> None:
    import pollux.torch as agent

    assert all(hasattr(agent, name) for name in agent.__all__)


# -- profile -------------------------------------------------------------------------------


def test_profile_separates_compute_and_sync_and_fits_in_the_background() -> None:
    import torch

    from pollux.torch.profiler import MicroStepTiming, StepProfiler

    truth = ThroughputParams(alpha_c=0.01, beta_c=0.001, alpha_n=0.05, beta_n=0.0,
                             alpha_r=0.02, beta_r=0.0, gamma=1.0)
    profiler = StepProfiler(torch.device("cpu"), refit_interval_s=0.0)

    def measure(replicas: int, with_micro_steps: bool) -> None:
        for bsz in (16, 32, 64):
            compute = truth.alpha_c + truth.beta_c * bsz
            sync = 0.0 if replicas == 1 else truth.alpha_r
            for _ in range(3):  # marks are plain seconds on the CPU
                if with_micro_steps:
                    profiler.record(MicroStepTiming((1, replicas, bsz), False, 0.0, compute))
                profiler.record(MicroStepTiming((1, replicas, bsz), True, 0.0,
                                                compute + sync, compute_end=compute))

    def refit_recovers_the_truth() -> ThroughputParams:
        assert profiler.maybe_refit()
        profiler.wait_for_fit(30)
        params = profiler.params
        assert params is not None
        assert params.beta_c == pytest.approx(truth.beta_c, rel=0.1)
        assert params.alpha_r == pytest.approx(truth.alpha_r, rel=0.2)
        return params

    measure(1, True)
    measure(2, True)
    assert profiler.collect() == 36
    observations = profiler.observations()
    assert observations is not None and len(observations) == 6
    assert profiler.max_profiled_replicas == 2
    refit_recovers_the_truth()
    # a refit on more data starts from the previous fit and still recovers the truth
    measure(4, False)
    assert profiler.collect() == 9
    params = refit_recovers_the_truth()
    observations = profiler.observations()
    assert observations is not None and len(observations) == 9
    restored = StepProfiler(torch.device("cpu"))
    restored.load_state_dict(profiler.state_dict())
    assert restored.params == params and restored.max_profiled_replicas == 4
    again = restored.observations()
    assert again is not None
    np.testing.assert_allclose(again.step_time, observations.step_time)


def test_each_gpu_type_keeps_its_own_profile_across_restarts() -> None:
    """A job that ran on type a, then on b, then on a again: b's profile starts empty
    (a's step times are never pooled into it), a's comes back when it returns, and the
    hints carry both under their names."""
    import torch

    from pollux.torch.profiler import MicroStepTiming, ProfilesByType, StepProfiler

    def launch(gpu_type: str, state: dict[str, Any] | None) -> ProfilesByType:
        profiles = ProfilesByType(gpu_type, StepProfiler(torch.device("cpu")))
        if state is not None:
            profiles.load_state_dict(state)
        return profiles

    def run(profiles: ProfilesByType, replicas: int, step_s: float) -> None:
        for bsz in (16, 32, 64):
            for _ in range(2):
                profiles.live.record(MicroStepTiming((1, replicas, bsz), True, 0.0,
                                                     step_s * bsz, compute_end=step_s * bsz))
        profiles.live.collect()
        profiles.live.maybe_refit(force=True)
        profiles.live.wait_for_fit(30)

    on_a = launch("a", None)
    run(on_a, 2, 0.001)
    fitted_a = on_a.live.params
    assert fitted_a is not None
    on_b = launch("b", on_a.state_dict())
    assert on_b.live.observations() is None and on_b.live.max_profiled_replicas == 0
    assert on_b.type_profiles() == {"a": TypeProfile(fitted_a, 2), "b": TypeProfile(None, 0)}
    run(on_b, 1, 0.004)  # four times slower per sample
    back_on_a = launch("a", on_b.state_dict())
    observations = back_on_a.live.observations()
    assert observations is not None and set(observations.num_replicas) == {2}
    profiles = back_on_a.type_profiles()
    assert profiles["a"] == TypeProfile(fitted_a, 2) and profiles["b"].max_profiled_replicas == 1
    b_params = profiles["b"].throughput_params
    assert b_params is not None and b_params.beta_c > 2 * fitted_a.beta_c
    # a checkpoint from before GPU types is this launch's type's profile
    old = StepProfiler(torch.device("cpu"))
    old.load_state_dict(on_a.live.state_dict())
    legacy = launch("rtx", old.state_dict())
    assert legacy.type_profiles() == {"rtx": TypeProfile(fitted_a, 2)}


def test_the_device_type_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pollux.torch.profiler import device_gpu_type

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Fake 80GB")
    cuda = torch.device("cuda", 0)
    assert device_gpu_type(cuda) == "NVIDIA Fake 80GB"
    assert device_gpu_type(torch.device("cpu")) == "cpu"
    assert device_gpu_type(torch.device("cpu"), configured="my-box") == "my-box"
    # the scheduler's name for the node's type wins: the policy looks the profile up by it
    assert device_gpu_type(cuda, launched="a100", configured="my-box") == "a100"
    with pytest.raises(ConfigError):
        device_gpu_type(torch.device("cpu"), configured=" ")
    with pytest.raises(ConfigError) as info:
        AgentConfig(gpu_type="x" * 101)
    assert info.value.field == "gpu_type"
    for environ in ({"POLLUX_GPU_TYPE": "rtx"},
                    {"POLLUX_GPU_TYPE": "rtx", "RANK": "0", "WORLD_SIZE": "1",
                     "MASTER_PORT": "1"},
                    JobEnvironment(job_id="j", rank=0, num_replicas=1, master_port=1,
                                   gpu_type="rtx").to_env()):
        assert read_launch_environment(environ).gpu_type == "rtx"
    assert read_launch_environment({}).gpu_type is None


def test_metrics_writer_is_optional(tmp_path: Path) -> None:
    from pollux.torch.metrics import MetricsWriter, tensorboard_available

    writer = MetricsWriter(tmp_path / "tb")
    assert writer.enabled == tensorboard_available()
    writer.write(3, {"goodput": 1.0, "noise_scale": None, "bad": float("nan")})
    writer.close()
    assert not MetricsWriter(None).enabled
