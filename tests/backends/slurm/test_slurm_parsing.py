"""The slurm backend's reading of Slurm, without a Slurm: the job-state table, GRES and
host lists, node states, foreign GPUs, what a launch's replicas are for each answer, and
the command runner's retries."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from pollux.backends.base import LiveReplica, ReplicaState
from pollux.backends.exit_status import write_exit_status
from pollux.backends.slurm.commands import SlurmCommandError, SlurmCommands, SlurmUnavailable
from pollux.backends.slurm.launches import ALLOCATION, CLUSTER, SlurmLaunch, SlurmReplica
from pollux.backends.slurm.nodes import (
    expand_hostlist,
    gpu_gres,
    held_gpus,
    is_schedulable,
    main_gpu_type,
    node_views,
)
from pollux.backends.slurm.recovery import adoptable
from pollux.backends.slurm.states import (
    JOB_STATES,
    KILLED,
    Phase,
    UnknownSlurmState,
    job_state,
)

# every job state of Slurm 22.05's job_state_string() (src/common/slurm_protocol_defs.c)
SLURM_2205_JOB_STATES = (
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "COMPLETING",
    "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT",
    "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT", "POWER_UP_NODE",
    "UPDATE_DB")


def test_every_slurm_job_state_is_in_the_table_and_an_unknown_one_is_an_error() -> None:
    assert set(SLURM_2205_JOB_STATES) == set(JOB_STATES)
    with pytest.raises(UnknownSlurmState, match="MYSTERY"):
        job_state("MYSTERY")
    # newer Slurm lists the base state and its flags: a flag that ends the run wins
    assert job_state(["RUNNING", "COMPLETING"]).phase is Phase.ENDING
    assert job_state(["PENDING", "REQUEUED"]).phase is Phase.REQUEUED
    assert job_state(["RUNNING"]).phase is Phase.RUNNING
    # a replica that recorded nothing is never reported as exited 0
    assert all(s.lost_code != 0 for s in JOB_STATES.values())


def test_host_lists_and_gres() -> None:
    assert expand_hostlist("n[1-3,5],gpu-a[01-02],login") == [
        "n1", "n2", "n3", "n5", "gpu-a01", "gpu-a02", "login"]
    assert gpu_gres("gpu:a100:8(S:0-1),gpu:t4:2,nic:1") == {"a100": 8, "t4": 2}
    assert gpu_gres("gpu:4") == {"default": 4}
    assert gpu_gres("(null)") == {}
    assert main_gpu_type("gpu:t4:2,gpu:a100:8") == ("a100", 8)
    assert main_gpu_type("gpu:t4:4(IDX:0-3)") == ("t4", 4)


def sinfo_node(name: str, gres: str = "gpu:t4:4", state: str = "idle",
               flags: tuple[str, ...] = (), partitions: tuple[str, ...] = ("p",)
               ) -> dict[str, Any]:
    return {"name": name, "gres": gres, "state": state, "state_flags": list(flags),
            "cpus": 8, "real_memory": 1000, "partitions": list(partitions),
            "address": "10.0.0.1"}


def test_unschedulable_nodes_and_foreign_gpus_are_not_offered() -> None:
    assert is_schedulable(sinfo_node("a", state="mixed"))
    for state, flags in (("down", ()), ("idle", ("DRAIN",)), ("idle", ("NOT_RESPONDING",)),
                         ("allocated", ("DRAIN",)), ("idle", ("MAINTENANCE",)),
                         ("future", ())):
        assert not is_schedulable(sinfo_node("a", state=state, flags=flags)), (state, flags)
    nodes = [sinfo_node("n1"), sinfo_node("n2", gres="gpu:2"), sinfo_node("n3", state="down"),
             sinfo_node("n4", partitions=("other",)), sinfo_node("n5", gres="")]
    jobs = [{"name": "someone", "nodes": "n[1-2]", "gres_detail": ["gpu:t4:3(IDX:0-2)",
                                                                  "gpu:1(IDX:0)"]},
            {"name": "pollux-abc-job-1-g1", "nodes": "n1", "gres_detail": ["gpu:t4:1(IDX:3)"]}]
    assert held_gpus(jobs, lambda name: name.startswith("pollux-abc-")) == {"n1": 3, "n2": 1}
    views = node_views(nodes, jobs, lambda name: name.startswith("pollux-abc-"), partition="p")
    assert [(v.info.name, v.info.gpu_type, v.info.num_gpus) for v in views] == [
        ("n1", "t4", 1), ("n2", "default", 1)]
    assert views[0].address == "10.0.0.1"
    allowed = node_views(nodes, [], lambda name: False, allowed=["n2"])
    assert [v.info.name for v in allowed] == ["n2"]


def make_launch(tmp_path: Path, ranks: int = 2) -> SlurmLaunch:
    replicas = [SlurmReplica(r, "n1", f"step-{r}", tmp_path / f"replica-{r}.exit")
                for r in range(ranks)]
    return SlurmLaunch("job-1", 1, "pollux-x-job-1-g1", CLUSTER, "42", replicas)


def test_replica_states_come_from_evidence_only(tmp_path: Path) -> None:
    launch = make_launch(tmp_path)
    states = [s.state for s in launch.from_job({"job_state": "PENDING", "restart_cnt": 0})]
    assert states == [ReplicaState.STARTING] * 2
    assert [s.state for s in launch.from_job({"job_state": "RUNNING"})] == [
        ReplicaState.RUNNING] * 2
    # Slurm unreachable: UNKNOWN, never EXITED
    assert [s.state for s in launch.unknown()] == [ReplicaState.UNKNOWN] * 2
    # rank 0 recorded its exit; the job still runs: rank 1 runs on
    write_exit_status(tmp_path / "replica-0.exit", 75)
    statuses = launch.from_job({"job_state": "COMPLETING"})
    assert [(s.state, s.exit_code) for s in statuses] == [
        (ReplicaState.EXITED, 75), (ReplicaState.RUNNING, None)]
    # the node failed: rank 1 left no status, it was killed
    statuses = launch.from_job({"job_state": "NODE_FAIL"})
    assert [(s.state, s.exit_code) for s in statuses] == [
        (ReplicaState.EXITED, 75), (ReplicaState.EXITED, KILLED)]
    assert launch.ended


def test_a_requeued_or_vanished_job_has_ended_non_zero(tmp_path: Path) -> None:
    launch = make_launch(tmp_path, 1)
    statuses = launch.from_job({"job_state": "PENDING", "restart_cnt": 1})
    assert launch.last_phase is Phase.REQUEUED
    assert statuses[0].state is ReplicaState.EXITED and statuses[0].exit_code != 0
    gone = make_launch(tmp_path / "x", 1)
    assert gone.from_job(None)[0].exit_code == KILLED
    with pytest.raises(UnknownSlurmState):
        make_launch(tmp_path, 1).from_job({"job_state": "NEW_IN_SLURM_99"})


def fake_command(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bin" / "squeue"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path.parent


def test_commands_retry_while_the_controller_is_unreachable(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    bin_dir = fake_command(tmp_path, f"""echo x >> {counter}
if [ $(wc -l < {counter}) -lt 3 ]; then
  echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1
fi
echo '{{"errors": [], "jobs": [{{"job_id": 7, "job_state": "RUNNING"}}]}}'""")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    commands = SlurmCommands(retries=2, env=env)
    assert commands.jobs() == [{"job_id": 7, "job_state": "RUNNING"}]
    assert counter.read_text().count("x") == 3
    counter.unlink()
    with pytest.raises(SlurmUnavailable, match="unreachable"):
        SlurmCommands(retries=1, env=env).jobs()
    refusing = fake_command(tmp_path, 'echo "squeue: error: Invalid user" >&2; exit 1')
    with pytest.raises(SlurmCommandError, match="Invalid user"):
        SlurmCommands(env={**os.environ, "PATH": f"{refusing}:{os.environ['PATH']}"}).jobs()


def test_jobs_asked_for_by_id_are_those_only(tmp_path: Path) -> None:
    # Slurm 22.05's squeue --json answers with every job whatever --jobs says
    bin_dir = fake_command(tmp_path, """echo '{"errors": [], "jobs": [
        {"job_id": 7, "job_state": "RUNNING"}, {"job_id": 8, "job_state": "PENDING"}]}'""")
    commands = SlurmCommands(env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert [j["job_id"] for j in commands.jobs(["8"])] == [8]
    assert [j["job_id"] for j in commands.jobs()] == [7, 8]


def test_the_slurm_flags_reach_the_backend_and_need_it() -> None:
    import argparse

    from pollux.cli.server import add_server_arguments, config_from_args
    from pollux.errors import ConfigError

    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    args = parser.parse_args(["--backend", "slurm", "--slurm-partition", "gpu",
                              "--slurm-account", "lab", "--slurm-nodes", "g[01-04]",
                              "--slurm-mode", "cluster"])
    assert config_from_args(args).backend.options() == {
        "partition": "gpu", "account": "lab", "nodes": "g[01-04]", "mode": "cluster",
        "log_budget_bytes": 64 << 20}
    with pytest.raises(ConfigError, match="--slurm-partition needs --backend slurm"):
        config_from_args(parser.parse_args(["--slurm-partition", "gpu"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "slurm", "--slurm-mode", "both"])


class StubJobs:
    """SlurmCommands' ``jobs`` answering from a table (or unreachable)."""

    def __init__(self, entries: list[dict[str, Any]] | None) -> None:
        self.entries = entries

    def jobs(self, job_ids: Any = ()) -> list[dict[str, Any]]:
        if self.entries is None:
            raise SlurmUnavailable("squeue: Slurm is unreachable (connection refused)")
        return [e for e in self.entries if not job_ids or str(e["job_id"]) in job_ids]

    def steps(self, job_id: str) -> dict[str, str]:
        if self.entries is None:
            raise SlurmUnavailable("squeue: Slurm is unreachable (connection refused)")
        return {str(e["name"]): f"{job_id}.{i}" for i, e in enumerate(self.entries)}


def live(job: str, rank: int, slurm_id: str, tmp: Path, instance: str = "i1",
         generation: int = 3, mode: str = CLUSTER) -> LiveReplica:
    name = f"pollux-{instance}-{job}-g{generation}"
    return LiveReplica(job, generation, rank, f"n{rank + 1}", {
        "backend": "slurm", "instance": instance, "mode": mode, "slurm_job_id": slurm_id,
        "slurm_job_name": name, "slurm_step": f"{name}-r{rank}",
        "status_file": str(tmp / f"{job}-{rank}.status")})


def test_only_whole_launches_that_slurm_runs_under_their_name_are_adopted(
        tmp_path: Path) -> None:
    entries = [
        {"job_id": 11, "name": "pollux-i1-a-g3", "job_state": "RUNNING"},    # adopted
        {"job_id": 12, "name": "pollux-i1-b-g3", "job_state": "COMPLETED"},  # ended
        {"job_id": 13, "name": "someone-else", "job_state": "RUNNING"},      # id reused
        {"job_id": 14, "name": "pollux-i1-d-g3", "job_state": "PENDING",     # requeued
         "restart_cnt": 1},
        {"job_id": 15, "name": "pollux-i1-e-g3", "job_state": "RUNNING"},    # ranks 0, 2
        {"job_id": 16, "name": "pollux-i1-f-g3", "job_state": "RUNNING"},    # other server
        {"job_id": 17, "name": "pollux-i1-g-g3", "job_state": "MYSTERY"},    # unknown state
    ]
    replicas = [live("a", 0, "11", tmp_path), live("a", 1, "11", tmp_path),
                live("b", 0, "12", tmp_path), live("c", 0, "13", tmp_path),
                live("d", 0, "14", tmp_path), live("e", 0, "15", tmp_path),
                live("e", 2, "15", tmp_path), live("f", 0, "16", tmp_path, instance="i0"),
                live("g", 0, "17", tmp_path)]
    adopted = adoptable(StubJobs(entries), "i1", replicas)  # type: ignore[arg-type]
    assert [launch.job_id for launch in adopted] == ["a"]
    launch = adopted[0]
    assert (launch.slurm_job_id, launch.generation, launch.mode) == ("11", 3, CLUSTER)
    assert [(r.rank, r.node, r.step) for r in launch.replicas] == [
        (0, "n1", "pollux-i1-a-g3-r0"), (1, "n2", "pollux-i1-a-g3-r1")]
    # watched as its own: running now, and the exit its wrapper records ends it
    assert [s.state for s in launch.from_job(entries[0])] == [ReplicaState.RUNNING] * 2
    for rank in (0, 1):
        write_exit_status(launch.replicas[rank].status_path, 0)
    assert [(s.state, s.exit_code) for s in launch.from_job(entries[0])] == [
        (ReplicaState.EXITED, 0)] * 2
    # Slurm unreachable: nothing adopted (stopped and resumed instead)
    assert adoptable(StubJobs(None), "i1", replicas) == []  # type: ignore[arg-type]


def test_allocation_steps_are_adopted_only_when_every_step_runs(tmp_path: Path) -> None:
    def step(job: str, rank: int) -> LiveReplica:
        return live(job, rank, "7", tmp_path, mode=ALLOCATION)

    steps = StubJobs([{"name": "pollux-i1-a-g3-r0"}, {"name": "pollux-i1-a-g3-r1"},
                      {"name": "pollux-i1-b-g3-r0"}])  # b's rank 1 is gone
    replicas = [step("a", 0), step("a", 1), step("b", 0), step("b", 1),
                live("c", 0, "7", tmp_path)]  # a cluster-mode handle: not this mode's
    adopted = adoptable(steps, "i1", replicas, allocation="7")  # type: ignore[arg-type]
    assert [(launch.job_id, launch.mode, launch.adopted) for launch in adopted] == [
        ("a", ALLOCATION, True)]
    assert adoptable(steps, "i1", replicas, allocation="8") == []  # type: ignore[arg-type]
    # watched through the steps: a step gone without a recorded status was killed
    launch = adopted[0]
    write_exit_status(launch.replicas[0].status_path, 75)
    assert [(s.state, s.exit_code) for s in launch.from_steps({})] == [
        (ReplicaState.EXITED, 75), (ReplicaState.EXITED, KILLED)]


def test_the_servers_own_launch_variables_never_reach_a_slurm_replica(tmp_path: Path) -> None:
    """Pollux's and AdaptDL's launch variables in the server's environment stay behind
    (a stale one would disagree with the launch's, which the agent refuses); the job's own
    ``env`` goes through."""
    from pollux.backends.base import LaunchRequest
    from pollux.backends.slurm.script import job_environment
    from pollux.job_spec import JobSpec

    spec = JobSpec.from_dict({"name": "t", "command": ["true"], "working_dir": str(tmp_path),
                              "env": {"ADAPTDL_JOB_ID": "mine"}})
    request = LaunchRequest(job_id="t-1", generation=1, spec=spec, allocation=("n1",),
                            checkpoint_dir=str(tmp_path), log_dir=str(tmp_path),
                            hints_target="http://x/hints", hints_token="secret")
    env = job_environment(request, loopback=False,
                          base={"PATH": "/bin", "ADAPTDL_NUM_REPLICAS": "4", "POLLUX_RANK": "9"})
    assert env["PATH"] == "/bin" and env["ADAPTDL_JOB_ID"] == "mine"
    assert "ADAPTDL_NUM_REPLICAS" not in env and "POLLUX_RANK" not in env
