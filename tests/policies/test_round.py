"""The one scheduling round (:mod:`pollux.policies.round`): both drivers only gather reports
and carry out its reply; the retry without models and the once-per-reason record of
infeasible allocations live in the round, so both drivers have them."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import pollux
from pollux.models.hints import JobHints
from pollux.models.throughput import ThroughputParams
from pollux.policies.base import (
    GPU,
    Allocations,
    JobInfo,
    NodeInfo,
    Policy,
    PolicyDecision,
    facts_by_type,
)
from pollux.policies.round import RoundRequest, SchedulingRound
from pollux.policies.snapshot import JobReport
from pollux.sim import ClusterConfig, JobSpec, Simulator, Workload
from pollux.sim.catalog import load_builtin_applications

PACKAGE = Path(pollux.__file__).parent
DRIVERS = ("service/loop/allocator.py", "sim/simulator.py")
FORBIDDEN = {"optimize", "decide", "decide_by_type", "propose", "growth_rule",
             "check_decision", "job_info", "job_infos", "without_models",
             "learned_type_speeds", "typed_caps", "exploration_bound"}
"""Calls that ask a policy, an autoscaler or the decision check, or build the policy's
records: the round's alone."""


def _calls(path: Path) -> list[str]:
    """``receiver.name`` of every call in ``path`` whose callee is forbidden, except
    calls on the driver's round (``self.round.<name>``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if receiver == "self.round":
            continue
        if name in FORBIDDEN or receiver.endswith(("policy", "autoscaler")):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(func)}")
    return found


def test_no_driver_asks_a_policy_an_autoscaler_or_the_decision_check() -> None:
    for driver in DRIVERS:
        assert (PACKAGE / driver).is_file(), driver
        assert _calls(PACKAGE / driver) == [], driver
    # the check itself finds such calls
    assert _calls(PACKAGE / "policies" / "round.py")


class Overcommit(Policy):
    """Gives job ``a`` more replicas than its node has, with a reason that changes when
    ``replicas`` does."""

    name = "overcommit"

    def __init__(self) -> None:
        self.replicas = 5

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        return PolicyDecision(allocations={"a": (nodes[0].name,) * self.replicas})


def _report(name: str, hints: JobHints | None = None) -> JobReport:
    return JobReport(name=name, resources={GPU: 1.0}, by_type=facts_by_type(8), hints=hints)


def test_an_infeasible_allocation_is_an_event_once_per_reason() -> None:
    policy = Overcommit()
    scheduling = SchedulingRound(policy)
    request = RoundRequest(0.0, (_report("a"),), (NodeInfo("n", {GPU: 4.0}),))
    warnings = []
    for replicas in (5, 5, 6, 6, 1, 6):
        policy.replicas = replicas
        reply = scheduling.schedule(request)
        assert reply.decision.allocations["a"] == (() if replicas > 4 else ("n",))
        warnings.append([e.message for e in reply.events if e.level == "warning"])
    assert [len(w) for w in warnings] == [1, 0, 1, 0, 0, 1]
    assert "5 replicas on 'n' need 5 gpu, 4 left" in warnings[0][0]
    assert warnings[0][0].startswith("policy overcommit: allocation infeasible")


class FailsOnModels(Policy):
    """Raises on a job with a speedup model; gives every job one GPU otherwise."""

    name = "fails-on-models"

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        if any(job.on().speedup_fn is not None for job in jobs):
            raise ValueError("cannot read this model")
        names = [node.name for node in nodes for _ in range(int(node.resources[GPU]))]
        return PolicyDecision(allocations={job.name: (names[i],)
                                           for i, job in enumerate(jobs)})


def test_a_round_whose_policy_fails_on_the_models_is_asked_again_without_them() -> None:
    hints = JobHints(throughput_params=ThroughputParams(0.1, 0.01, 0.1, 0.01, 0.0, 0.0, 1.0),
                     init_batch_size=128, max_batch_size=1024, local_bsz_bounds=(32, 256),
                     max_profiled_replicas=1)
    request = RoundRequest(0.0, (_report("a", hints), _report("b")),
                           (NodeInfo("n", {GPU: 4.0}),))
    reply = SchedulingRound(FailsOnModels()).schedule(request)
    assert reply.decision.allocations == {"a": ("n",), "b": ("n",)}
    assert reply.snapshot is not None
    assert all(job.on().speedup_fn is None for job in reply.snapshot.jobs)
    assert sorted((e.job, e.level) for e in reply.events) == [("a", "info"), ("b", "info")]
    assert all("cannot read this model" in e.message for e in reply.events)


def test_the_simulator_retries_a_failed_round_as_the_service_does() -> None:
    """The simulator once let a policy's failure end the run; through the round its
    adaptive jobs (which have models from their first profile) run as jobs without one."""
    workload = Workload("retry", (JobSpec("cifar-a", 0.0, "cifar10", 1, 128),))
    result = Simulator(workload, load_builtin_applications(), FailsOnModels(),
                       ClusterConfig(num_nodes=1, gpus_per_node=4, max_time_s=600.0),
                       adaptive_jobs=True).run()
    (job,) = result.jobs
    assert any(r.gpus for r in result.rounds)
    assert any("scheduling round failed (ValueError: cannot read this model)" in message
               for _, message in job.events)
