"""The slurm backend itself on a real Slurm, with small replicas (no training): Slurm
unreachable for a while, a previous server's work found by name, and a launch that
Slurm would requeue."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pollux.backends.base import LaunchRequest, LiveReplica, ReplicaState, ReplicaStatus
from pollux.backends.slurm import SlurmBackend
from pollux.backends.slurm.commands import SlurmCommands
from pollux.backends.slurm.watch import POLL_CACHE_S
from pollux.errors import ConfigError, JobSpecError
from pollux.job_spec import JobSpec
from pollux.jobenv import RESCALE_EXIT_CODE
from tests.backends.slurm.cluster import URGENT_PARTITION, SlurmCluster

pytestmark = pytest.mark.timeout(120)

REPLICA = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
print("replica up", os.environ.get("POLLUX_HINTS_TOKEN"), flush=True)
time.sleep(120)
"""


def request(tmp_path: Path, job_id: str, allocation: tuple[str, ...],
            hints_token: str | None = None) -> LaunchRequest:
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    spec = JobSpec.from_dict({"name": job_id, "command": [sys.executable, str(script)],
                              "working_dir": str(tmp_path), "max_replicas": len(allocation)})
    return LaunchRequest(job_id=job_id, generation=1, spec=spec, allocation=allocation,
                         checkpoint_dir=str(tmp_path / job_id / "checkpoint"),
                         log_dir=str(tmp_path / job_id / "logs"), hints_token=hints_token,
                         gpu_type="t4" if allocation[0] in ("n1", "n2") else "a100")


def wait_up(tmp_path: Path, job_id: str, ranks: int, timeout_s: float = 30.0) -> None:
    """Until every replica printed that it is up (its SIGTERM handler is installed)."""
    logs = [tmp_path / job_id / "logs" / f"replica-{r}.log" for r in range(ranks)]
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() and "replica up" in p.read_text() for p in logs):
        assert time.monotonic() < deadline, f"{job_id}'s replicas not up"
        time.sleep(0.2)


def wait_states(backend: SlurmBackend, job_id: str, state: ReplicaState,
                timeout_s: float = 30.0) -> list[ReplicaStatus]:
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = backend.poll(job_id)
        if statuses and all(s.state is state for s in statuses):
            return statuses
        assert time.monotonic() < deadline, f"{job_id}: {statuses}, not all {state}"
        time.sleep(0.2)


def test_slurm_unreachable_is_unknown_never_exited(slurm: SlurmCluster, tmp_path: Path
                                                   ) -> None:
    # no retries: a Slurm client takes ~4 s to give up on a controller that is down
    backend = SlurmBackend("unreachable0001", mode="cluster",
                           commands=SlurmCommands(retries=0))
    nodes = backend.nodes()
    backend.launch(request(tmp_path, "job-a", ("n1", "n2")))
    wait_states(backend, "job-a", ReplicaState.RUNNING)
    wait_up(tmp_path, "job-a", 2)
    slurm.stop_controller()
    time.sleep(POLL_CACHE_S)  # the last answer has aged
    try:
        statuses = backend.poll("job-a")
        assert [s.state for s in statuses] == [ReplicaState.UNKNOWN] * 2
        assert backend.nodes() == nodes  # the last nodes read
        backend.stop("job-a")  # remembered, sent once Slurm answers
    finally:
        slurm.start_controller()
    statuses = wait_states(backend, "job-a", ReplicaState.EXITED)
    assert [s.exit_code for s in statuses] == [RESCALE_EXIT_CODE] * 2


def test_a_restarted_server_finds_its_work_by_name(slurm: SlurmCluster, tmp_path: Path
                                                   ) -> None:
    before = SlurmBackend("restarted00001", mode="cluster")
    launched = before.launch(request(tmp_path, "job-b", ("n3",), hints_token="s3cr3t-t0k3n"))
    wait_states(before, "job-b", ReplicaState.RUNNING)
    wait_up(tmp_path, "job-b", 1)
    # the replica got its hints token, which no command line nor the job's script shows
    logs = tmp_path / "job-b" / "logs"
    assert "replica up s3cr3t-t0k3n" in (logs / "replica-0.log").read_text()
    assert "s3cr3t" not in (logs / "launch-1.sbatch").read_text()
    slurm_id = launched[0].handle["slurm_job_id"]
    assert "s3cr3t" not in slurm.scontrol("show", "job", slurm_id)
    assert (logs / "replica-0.launch-1.env").stat().st_mode & 0o077 == 0
    names = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True,
                           env=slurm.env, check=True).stdout
    assert "job-b" in names
    other = SlurmBackend("someoneelse001", mode="cluster")  # another data directory
    assert other.recover([], grace_s=5) == []
    after = SlurmBackend("restarted00001", mode="cluster")  # the same data directory
    stopped = after.recover([], grace_s=20)  # no handles: found by name alone
    assert stopped == [f"Slurm job {launched[0].handle['slurm_job_id']} "
                       f"({launched[0].handle['slurm_job_name']})"]
    status = Path(launched[0].handle["status_file"])
    assert status.read_text().strip() == '{"exit_code": 75}'


def test_slurm_never_runs_a_launch_twice(slurm: SlurmCluster, tmp_path: Path) -> None:
    backend = SlurmBackend("requeue0000001", mode="cluster")
    launched = backend.launch(request(tmp_path, "job-c", ("n4",)))
    wait_states(backend, "job-c", ReplicaState.RUNNING)
    slurm_id = launched[0].handle["slurm_job_id"]
    refused = subprocess.run(["scontrol", "requeue", slurm_id], capture_output=True,
                             text=True, env=slurm.env)
    assert refused.returncode != 0  # submitted --no-requeue
    backend.stop("job-c", force=True)
    statuses = wait_states(backend, "job-c", ReplicaState.EXITED)
    assert statuses[0].exit_code not in (0, None)


def test_a_launch_that_waits_too_long_for_its_gpus_is_withdrawn(slurm: SlurmCluster,
                                                                 tmp_path: Path) -> None:
    # GPUs a foreign job took after the round (not free, but the launch was decided
    # before): the launch would wait for them forever
    foreign = subprocess.run(
        ["sbatch", "--parsable", "-J", "foreign", "-w", "n2", "--gres=gpu:t4:2",
         f"--output={tmp_path / 'foreign.out'}", "--wrap", "sleep 300"],
        capture_output=True, text=True, env=slurm.env, check=True).stdout.strip()
    deadline = time.monotonic() + 20
    while "RUNNING" not in slurm.scontrol("show", "job", foreign):
        assert time.monotonic() < deadline, "the foreign job did not start"
        time.sleep(0.2)
    backend = SlurmBackend("withdrawn00001", mode="cluster", pending_timeout_s=1.0)
    assert [n.num_gpus for n in backend.nodes() if n.name == "n2"] == [0]
    backend.launch(request(tmp_path, "job-d", ("n2",)))
    assert [s.state for s in backend.poll("job-d")] == [ReplicaState.STARTING]
    statuses = wait_states(backend, "job-d", ReplicaState.EXITED)
    assert statuses[0].exit_code not in (0, None)
    assert "RUNNING" in slurm.scontrol("show", "job", foreign)  # never touched


def test_allocation_mode_steps_and_their_recovery(slurm: SlurmCluster, tmp_path: Path
                                                  ) -> None:
    allocation = subprocess.run(
        ["sbatch", "--parsable", "-J", "my-allocation", "-N1", "-w", "n1",
         "--ntasks-per-node=2", "--gres=gpu:t4:2", f"--output={tmp_path / 'alloc.out'}",
         "--wrap", "sleep 300"],
        capture_output=True, text=True, env=slurm.env, check=True).stdout.strip()
    deadline = time.monotonic() + 20
    while "RUNNING" not in slurm.scontrol("show", "job", allocation):
        assert time.monotonic() < deadline, "the allocation did not start"
        time.sleep(0.2)
    before = SlurmBackend("allocation0001", mode="allocation", allocation_job_id=allocation)
    assert [(n.name, n.gpu_type, n.num_gpus) for n in before.nodes()] == [("n1", "t4", 2)]
    launched = before.launch(request(tmp_path, "job-e", ("n1",)))
    kept = before.launch(request(tmp_path, "job-f", ("n1",)))
    assert {r.handle["slurm_job_id"] for r in launched + kept} == {allocation}
    wait_up(tmp_path, "job-e", 1)
    wait_up(tmp_path, "job-f", 1)
    # a new server on the same data directory (the old one SIGKILLed: its sruns, each in
    # its own session, and their steps live on): job-f is adopted as it runs (the store
    # offers it), the rest of the work found by name is stopped
    after = SlurmBackend("allocation0001", mode="allocation", allocation_job_id=allocation)
    offered = [LiveReplica("job-f", 1, r.rank, r.node, r.handle) for r in kept]
    assert after.adopt(offered) == {"job-f"}
    stopped = after.recover([], grace_s=20)
    assert len(stopped) == 1 and "job-e-g1-r0" in stopped[0], stopped
    status = Path(launched[0].handle["status_file"])
    assert status.read_text().strip() == '{"exit_code": 75}'
    statuses = wait_states(before, "job-e", ReplicaState.EXITED)  # the old srun ended
    assert [s.exit_code for s in statuses] == [RESCALE_EXIT_CODE]
    # the adopted step is watched through the allocation's steps, stopped like any other
    assert [s.state for s in after.poll("job-f")] == [ReplicaState.RUNNING]
    after.stop("job-f")
    statuses = wait_states(after, "job-f", ReplicaState.EXITED)
    assert [s.exit_code for s in statuses] == [RESCALE_EXIT_CODE]
    wait_states(before, "job-f", ReplicaState.EXITED)  # (its srun reaped)


def test_a_preempted_launch_ends_non_zero_and_never_runs_again(slurm: SlurmCluster,
                                                               tmp_path: Path) -> None:
    backend = SlurmBackend("preempted00001", mode="cluster")
    launched = backend.launch(request(tmp_path, "job-f", ("n4",)))
    wait_states(backend, "job-f", ReplicaState.RUNNING)
    wait_up(tmp_path, "job-f", 1)
    subprocess.run(["sbatch", "-p", URGENT_PARTITION, "-w", "n4", "--gres=gpu:a100:2",
                    f"--output={tmp_path / 'urgent.out'}", "--wrap", "sleep 300"],
                   capture_output=True, text=True, env=slurm.env, check=True)
    statuses = wait_states(backend, "job-f", ReplicaState.EXITED)
    assert statuses[0].exit_code not in (0, None)  # the service resumes from a checkpoint
    slurm_id = launched[0].handle["slurm_job_id"]
    time.sleep(1.0)
    assert "JobState=PREEMPTED" in slurm.scontrol("show", "job", slurm_id)


def test_bad_options_are_refused_naming_the_field(slurm: SlurmCluster) -> None:
    with pytest.raises(ConfigError, match="slurm_partition.*no such partition; Slurm has pollux, urgent"):
        SlurmBackend("badoptions0001", mode="cluster", partition="nope")
    with pytest.raises(ConfigError, match="slurm_mode"):
        SlurmBackend("badoptions0001", mode="cluster-ish")
    with pytest.raises(ConfigError, match="no longer lists allocation 999999"):
        SlurmBackend("badoptions0001", mode="allocation", allocation_job_id="999999")
    assert [n.name for n in SlurmBackend("badoptions0001", partition="pollux").nodes()] == [
        "n1", "n2", "n3", "n4"]


WHERE = """
import os
print("replica in", os.getcwd(), "with", os.environ.get("SBATCH_JOB_NAME"), flush=True)
"""


def test_job_input_and_the_servers_environment_cannot_change_a_launchs_options(
        slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a site's SBATCH_*/SRUN_* variables would beat the directives (command line >
    # environment > script): the job renamed (no adoption by name), another partition
    monkeypatch.setenv("SBATCH_JOB_NAME", "renamed")
    monkeypatch.setenv("SBATCH_PARTITION", URGENT_PARTITION)
    monkeypatch.setenv("SRUN_JOB_NAME", "renamed-step")
    odd = tmp_path / "a dir --nodelist=n9 %j"  # a space, an option, a Slurm pattern
    odd.mkdir()
    script = odd / "where.py"
    script.write_text(WHERE)
    backend = SlurmBackend("slurminput0001", mode="cluster", partition="pollux")
    spec = JobSpec.from_dict({"name": "job-g", "command": [sys.executable, str(script)],
                              "working_dir": str(odd), "env": {"SEED": "1"}})
    launched = backend.launch(LaunchRequest(
        job_id="job-g", generation=1, spec=spec, allocation=("n1",),
        checkpoint_dir=str(tmp_path / "job-g" / "checkpoint"),
        log_dir=str(tmp_path / "job-g" / "logs"), gpu_type="t4"))
    statuses = wait_states(backend, "job-g", ReplicaState.EXITED)
    assert [s.exit_code for s in statuses] == [0]
    log = (tmp_path / "job-g" / "logs" / "replica-0.log").read_text()
    assert f"replica in {odd} with None" in log, log
    shown = slurm.scontrol("show", "job", launched[0].handle["slurm_job_id"])
    assert "JobName=pollux-slurminput00-job-g-g1" in shown and "Partition=pollux" in shown
    assert "#SBATCH" not in (tmp_path / "job-g" / "logs" / "launch-1.sbatch").read_text()
    # a job's own env may not set them; a newline in a path is refused at submit
    bad = {"name": "job-h", "command": ["true"], "working_dir": str(tmp_path)}
    with pytest.raises(JobSpecError, match="env.SBATCH_ACCOUNT"):
        backend.validate(JobSpec.from_dict({**bad, "env": {"SBATCH_ACCOUNT": "theirs"}}))
    with pytest.raises(JobSpecError, match="env.SRUN_CPUS_PER_TASK"):
        backend.validate(JobSpec.from_dict({**bad, "env": {"SRUN_CPUS_PER_TASK": "64"}}))
    with pytest.raises(JobSpecError, match="working_dir"):
        JobSpec.from_dict({**bad, "working_dir": f"{tmp_path}\n#SBATCH --nodelist=n9"})


FLOOD = """
import sys
for i in range(60000):
    sys.stdout.write(f"flood line {i:06d}\\n")
"""


def test_a_replicas_output_stays_within_its_log_budget(slurm: SlurmCluster, tmp_path: Path
                                                       ) -> None:
    # srun --output used to append the job's output straight to the replica's log
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    backend = SlurmBackend("logbudget00001", mode="cluster", log_budget_bytes=256 << 10)
    spec = JobSpec.from_dict({"name": "job-i", "command": [sys.executable, str(script)],
                              "working_dir": str(tmp_path)})
    backend.launch(LaunchRequest(
        job_id="job-i", generation=1, spec=spec, allocation=("n1",),
        checkpoint_dir=str(tmp_path / "job-i" / "checkpoint"),
        log_dir=str(tmp_path / "job-i" / "logs"), gpu_type="t4"))
    statuses = wait_states(backend, "job-i", ReplicaState.EXITED)
    assert [s.exit_code for s in statuses] == [0]
    logs = tmp_path / "job-i" / "logs"
    log, rotated = logs / "replica-0.log", logs / "replica-0.log.1"
    assert log.stat().st_size + rotated.stat().st_size <= (256 << 10) + 1024  # 1.1 MB written
    assert log.read_text().endswith("flood line 059999\n")  # the newest kept
    assert "reached half its budget" in log.read_text()
    assert (logs / "replica-0.launch-1.wrapper.out").stat().st_size < 4096
