"""The replica actor's body on its own (no Ray): start, signals, exit status, logs, and
the watchdog that kills the replica when its actor process dies."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pollux.backends.processes import is_alive
from pollux.backends.ray.replica import (
    CANNOT_START_EXIT_CODE,
    ReplicaProcess,
    replica_environment,
)
from pollux.jobenv import RESCALE_EXIT_CODE

FAKE_JOB = str(Path(__file__).with_name("fake_job.py"))


def wait_in_thread(replica: ReplicaProcess, timeout_s: float = 20.0) -> int:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(replica.wait()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert result, "the replica did not end"
    return result[0]


def test_environment_drops_stale_pollux_variables():
    env = replica_environment({"PATH": "/bin", "POLLUX_RANK": "9", "ADAPTDL_NUM_REPLICAS": "4"},
                              {"POLLUX_JOB_ID": "j", "ADAPTDL_JOB_ID": "mine"})
    assert env == {"PATH": "/bin", "POLLUX_JOB_ID": "j", "ADAPTDL_JOB_ID": "mine"}


def test_start_log_sigterm_and_exit_status(tmp_path):
    replica = ReplicaProcess()
    log = tmp_path / "logs" / "replica-0.log"
    pid = replica.start([sys.executable, FAKE_JOB, "--steps", "1000", "--step-s", "0.02"],
                        str(tmp_path), {"POLLUX_CHECKPOINT_DIR": str(tmp_path / "ckpt")},
                        str(log), "=== header ===\n")
    assert isinstance(pid, int)
    deadline = time.monotonic() + 20
    while "starting" not in log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    replica.signal(signal.SIGTERM)
    assert wait_in_thread(replica) == RESCALE_EXIT_CODE
    assert log.read_text().startswith("=== header ===\nrank 0 starting")


def test_a_stop_before_the_start_means_no_start(tmp_path):
    replica = ReplicaProcess()
    replica.signal(signal.SIGTERM)
    assert replica.start([sys.executable, FAKE_JOB], str(tmp_path), {},
                         str(tmp_path / "r.log"), "") is None
    assert wait_in_thread(replica) == -signal.SIGTERM


def test_a_missing_program_is_reported_in_the_log(tmp_path):
    replica = ReplicaProcess()
    assert replica.start(["/no/such/program"], str(tmp_path), {}, str(tmp_path / "r.log"),
                         "") is None
    assert wait_in_thread(replica) == CANNOT_START_EXIT_CODE
    assert "cannot start '/no/such/program'" in (tmp_path / "r.log").read_text()


def test_a_replicas_output_stays_within_its_log_budget(tmp_path):
    # the actor used to hand the log file to the command as its stdout: no bound at all
    flood = ("import sys\nfor i in range(60000):\n"
             "    sys.stdout.write(f'flood line {i:06d}\\n')\n")
    replica = ReplicaProcess()
    log = tmp_path / "replica-0.log"
    replica.start([sys.executable, "-c", flood], str(tmp_path), {}, str(log),
                  "=== header ===\n", log_budget_bytes=256 << 10)
    assert wait_in_thread(replica) == 0
    rotated = tmp_path / "replica-0.log.1"
    assert log.stat().st_size + rotated.stat().st_size <= (256 << 10) + 1024  # 1.1 MB written
    assert log.read_text().endswith("flood line 059999\n")  # the newest kept, to the end
    assert "reached half its budget" in log.read_text()


def test_a_budget_out_of_bounds_is_refused_naming_it():
    from pollux.backends.ray.backend import RayBackend
    from pollux.errors import ConfigError

    with pytest.raises(ConfigError, match="log_budget"):
        RayBackend("x", log_budget_bytes=10)


def test_the_watchdog_kills_the_replica_when_its_owner_dies(tmp_path):
    # an "actor" process that starts a replica and reports its pid, then is SIGKILLed
    owner_code = textwrap.dedent(f"""
        import sys, time
        from pollux.backends.ray.replica import ReplicaProcess
        replica = ReplicaProcess()
        pid = replica.start([sys.executable, "-c", "import time; time.sleep(600)"],
                            {str(tmp_path)!r}, {{}}, {str(tmp_path / 'r.log')!r}, "")
        print(pid, flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert is_alive(pid)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 10
        while is_alive(pid):
            assert time.monotonic() < deadline, "the replica outlived its owner"
            time.sleep(0.05)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
