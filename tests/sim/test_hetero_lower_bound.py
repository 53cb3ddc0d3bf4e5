"""The lower bound on a typed cluster: below every policy's result, per job and on average."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.cluster_spec import parse_cluster_spec
from pollux.policies.registry import make_policy
from pollux.sim.applications import TypedApplication, load_typed_applications
from pollux.sim.config import ClusterConfig
from pollux.sim.job import JobSpec
from pollux.sim.lower_bound import best_rates, cluster_lower_bound, typed_best_rates
from pollux.sim.metrics import summarize_run
from pollux.sim.semantics import SIA_ARTIFACT
from pollux.sim.simulator import Simulator
from pollux.sim.workload import Workload, read_workload, write_workload
from tests.sim.test_hetero import SIA, needs_sia

SPEC = parse_cluster_spec("aws:2x4,dgx-ext:1x8,rtx:1x8")
"""Small enough for jobs to queue and share: the bound must hold there too."""
CONFIG = ClusterConfig(cluster=SPEC, semantics=SIA_ARTIFACT)
PHILLY_W1 = SIA / "workloads" / "philly" / "workload-1.csv"


@pytest.fixture(scope="module")
def apps() -> dict[str, TypedApplication]:
    return load_typed_applications(SIA / "traces", SPEC.gpu_types)


@needs_sia
def test_each_epoch_takes_the_fastest_type_calibrated(apps: dict[str, TypedApplication]
                                                      ) -> None:
    cifar = apps["cifar10"]
    typed = typed_best_rates(cifar, SPEC, SIA_ARTIFACT.calibration("cifar10"))
    per_type = {g.gpu_type: best_rates(cifar.by_type[g.gpu_type], g.num_nodes, g.gpus_per_node)
                for g in SPEC.groups}
    for epoch, rate in enumerate(typed.rate_per_s):
        best = max(r.rate_per_s[epoch] for r in per_type.values())
        assert rate == pytest.approx(best * SIA_ARTIFACT.calibration("cifar10"))
    # cifar10 trains 6.9x faster per GPU on an A100 than on a T4: the A100s set the bound
    assert typed.rate_per_s[0] == pytest.approx(per_type["dgx-ext"].rate_per_s[0]
                                                * SIA_ARTIFACT.calibration("cifar10"))
    one_type = parse_cluster_spec("aws:2x4")
    assert typed_best_rates(cifar, one_type, SIA_ARTIFACT.calibration("cifar10")).alone_s() > typed.alone_s() * 3


def _slice(seed: int, num_jobs: int, spread_s: float) -> Workload:
    """``num_jobs`` jobs of Philly workload-1 (a seeded pick), arriving within spread_s."""
    jobs = read_workload(PHILLY_W1, None).jobs
    rng = __import__("random").Random(seed)
    picked = sorted(rng.sample(range(len(jobs)), num_jobs))
    return Workload(f"slice-{seed}", tuple(
        JobSpec(jobs[i].name, round(rng.uniform(0, spread_s)), jobs[i].application,
                jobs[i].num_replicas, jobs[i].batch_size) for i in picked))


@needs_sia
@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), num_jobs=st.integers(1, 5),
       spread_s=st.sampled_from([0.0, 600.0]))
def test_bound_is_below_every_typed_policy(apps: dict[str, TypedApplication], seed: int,
                                           num_jobs: int, spread_s: float) -> None:
    workload = _slice(seed, num_jobs, spread_s)
    bound = cluster_lower_bound(workload, apps, CONFIG)
    assert bound.alone_avg_jct_s <= bound.avg_jct_s and bound.capacity_avg_jct_s > 0
    for name in ("sia", "pollux", "tiresias"):
        result = Simulator(workload, apps, make_policy(name, seed=0), CONFIG).run()
        record = summarize_run(result, apps)
        if name == "tiresias" and record.num_completed < num_jobs:
            continue  # a tuned GPU count above every type's size never runs
        assert record.num_completed == num_jobs, name
        assert bound.avg_jct_s <= record.avg_jct_s, name
        for job in record.jobs:
            assert job.jct_s is not None and bound.job_alone_s[job.name] <= job.jct_s, (
                name, job.name)


@needs_sia
def test_typed_cli_reports_the_bound_in_every_run_record(tmp_path: Path) -> None:
    from pollux.cli.main import main

    path = tmp_path / "few.csv"
    write_workload(_slice(1, 3, 300.0), path)
    out = tmp_path / "out.json"
    assert main(["simulate", str(path), "--cluster", str(SPEC), "--traces",
                 str(SIA / "traces"), "--policy", "sia,pollux", "--processes", "1",
                 "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert {r["policy"] for r in runs} == {"sia", "pollux"}
    bounds = {r["lower_bound_avg_jct_s"] for r in runs}
    assert len(bounds) == 1 and 0 < bounds.pop() <= min(r["avg_jct_s"] for r in runs)
