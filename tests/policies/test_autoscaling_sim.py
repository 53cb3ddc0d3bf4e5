"""Autoscaling in the simulator: the elastic cluster (provisioning delay, releases, billing),
the simulator driving an autoscaler, and ``pollux simulate --autoscaler``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from pollux.cli.main import main
from pollux.policies.autoscaling import (
    Autoscaler,
    AutoscalerConfig,
    NodeTemplate,
    PolluxAutoscaler,
    Proposal,
)
from pollux.policies.base import GPU, JobInfo
from pollux.sim.cluster import ClusterSize, ElasticCluster, node_seconds
from pollux.sim.job import JobSpec
from pollux.sim.metrics import summarize_run
from pollux.sim.simulator import ClusterConfig, Simulator
from pollux.sim.workload import Workload
from tests.sim.fakes import GreedyPolicy, ToyApplication

WORKLOAD_CSV = ("name,time,application,num_replicas,batch_size\n"
                "bert-0,0,bert,4,384\nncf-1,60,ncf,1,32768\nbert-2,120,bert,4,384\n")


class Scripted(Autoscaler):
    """Proposes the sizes it is given, one per round, then the last one forever."""

    name = "scripted"

    def __init__(self, cfg: AutoscalerConfig, sizes: Sequence[int]) -> None:
        super().__init__(cfg)
        self.sizes = list(sizes)

    def propose(self, jobs: Sequence[JobInfo], num_nodes: int) -> Proposal:
        size = self.sizes.pop(0) if len(self.sizes) > 1 else self.sizes[0]
        return Proposal(size, "scripted")


def scaling(min_nodes: int, max_nodes: int) -> AutoscalerConfig:
    return AutoscalerConfig(NodeTemplate({GPU: 4.0}), min_nodes, max_nodes, window_rounds=1)


def toy_workload(*names: str) -> Workload:
    return Workload("toy", tuple(JobSpec(name, 0.0, "toy", 4, 128) for name in names))


def test_elastic_cluster_provisions_after_the_delay_and_releases_the_emptiest() -> None:
    cluster = ElasticCluster({"default": 2}, [("default", 6, 4)], provision_delay_s=120.0)
    assert [n.name for n in cluster.nodes()] == ["node-0", "node-1"]
    assert cluster.resize({"default": 4}, 60.0, {}) == set()
    assert (len(cluster.nodes()), cluster.num_billed_nodes) == (2, 4)
    cluster.refresh(120.0)
    assert len(cluster.nodes()) == 2  # requested at 60 s: usable from 180 s
    cluster.refresh(180.0)
    assert [n.name for n in cluster.nodes()] == ["node-0", "node-1", "node-2", "node-3"]
    cluster.resize({"default": 5}, 200.0, {})
    # shrinking cancels the provisioning node first, then frees the emptiest ready ones
    released = cluster.resize({"default": 2}, 240.0, {"node-0": 3, "node-2": 1})
    assert released == {"node-1", "node-3"}
    assert [n.name for n in cluster.nodes()] == ["node-0", "node-2"]
    assert cluster.num_billed_nodes == 2
    sizes = [ClusterSize(0.0, 1, 1, 1), ClusterSize(100.0, 1, 3, 3), ClusterSize(200.0, 3, 3, 3)]
    assert node_seconds(sizes, 250.0) == pytest.approx(1 * 100 + 3 * 100 + 3 * 50)


def test_new_nodes_are_usable_only_after_the_provision_delay() -> None:
    apps = {"toy": ToyApplication(epochs=30, ratio=1e4)}  # noisy: scales well
    config = ClusterConfig(num_nodes=4, gpus_per_node=4, max_nodes=4, provision_delay_s=300.0)
    result = Simulator(toy_workload("a"), apps, GreedyPolicy(), config,
                       autoscaler=PolluxAutoscaler(scaling(1, 4))).run()
    sizes = result.cluster_sizes
    assert sizes[0] == ClusterSize(0.0, 1, 1, 1) and max(s.num_nodes for s in sizes) > 1
    requested = next(s.time_s for s in sizes if s.num_billed_nodes > 1)
    ready = next(s.time_s for s in sizes if s.num_nodes > 1)
    assert ready - requested >= 300.0
    for rnd in result.rounds:
        usable = max(s.num_nodes for s in sizes if s.time_s <= rnd.time_s)
        assert sum(rnd.gpus.values()) <= 4 * usable
    assert result.jobs[0].completion_time_s is not None


def test_jobs_on_released_nodes_are_placed_again() -> None:
    apps = {"toy": ToyApplication(epochs=20, ratio=1e4)}
    config = ClusterConfig(num_nodes=3, gpus_per_node=4, provision_delay_s=0.0)
    result = Simulator(toy_workload("a", "b"), apps, GreedyPolicy(), config,
                       autoscaler=Scripted(scaling(1, 3), [3, 3, 3, 3, 1])).run()
    assert [s.num_nodes for s in result.cluster_sizes] == [1, 3, 1]
    assert all(job.completion_time_s is not None for job in result.jobs)
    shrunk_at = result.cluster_sizes[-1].time_s
    assert all(sum(r.gpus.values()) <= 4 for r in result.rounds if r.time_s >= shrunk_at)
    record = summarize_run(result, apps)
    assert record.autoscaler == "scripted" and record.nodes_over_time.num_nodes == (1, 3, 1)


def test_a_fixed_cluster_bills_every_node_until_the_last_completion() -> None:
    apps = {"toy": ToyApplication(epochs=3)}
    config = ClusterConfig(num_nodes=3, gpus_per_node=4, node_price_per_hour=2.5)
    result = Simulator(toy_workload("a", "b"), apps, GreedyPolicy(), config).run()
    record = summarize_run(result, apps)
    end = max(job.completion_time_s or 0.0 for job in result.jobs)
    assert record.autoscaler == "none" and record.nodes_over_time.num_nodes == (3,)
    assert record.node_hours == pytest.approx(3 * end / 3600)
    assert record.cost == pytest.approx(2.5 * record.node_hours)


def test_simulate_with_the_pollux_autoscaler_reports_node_hours_and_cost(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "small.csv"
    workload.write_text(WORKLOAD_CSV)
    out = tmp_path / "out.json"
    assert main(["simulate", str(workload), "--policy", "pollux", "--autoscaler", "pollux",
                 "--nodes", "4", "--node-price", "2.0", "--processes", "1",
                 "--json", str(out), "--plot", str(tmp_path / "plots")]) == 0
    printed = capsys.readouterr().out
    assert "node-hours" in printed and "pollux autoscaler" in printed
    (run,) = json.loads(out.read_text())["runs"]
    assert run["autoscaler"] == "pollux" and run["num_completed"] == 3
    assert run["node_hours"] > 0 and run["cost"] == pytest.approx(2.0 * run["node_hours"])
    sizes = run["nodes_over_time"]
    assert set(sizes) == {"times_s", "num_nodes", "num_billed_nodes", "desired_num_nodes"}
    assert sizes["num_nodes"][0] == 1 and max(sizes["num_billed_nodes"]) <= 4
    # at most the whole cluster for the whole run
    assert run["node_hours"] <= 4 * run["makespan_s"] / 3600 + 4 * 60 / 3600
    assert (tmp_path / "plots" / "nodes-small.png").is_file()


def test_simulate_refuses_unknown_autoscalers_and_bounds_without_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--autoscaler", "fast"]) == 2
    assert ("unknown autoscaler 'fast'; choose from: none, pollux, throughput"
            in capsys.readouterr().err)
    assert main(["simulate", "--min-nodes", "2"]) == 2
    assert "--min-nodes needs --autoscaler" in capsys.readouterr().err


def test_simulate_utility_band_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "small.csv"
    workload.write_text(WORKLOAD_CSV)
    assert main(["simulate", str(workload), "--utility-band", "0.5:0.8"]) == 2
    assert "needs --autoscaler pollux" in capsys.readouterr().err
    assert main(["simulate", str(workload), "--autoscaler", "pollux",
                 "--utility-band", "half"]) == 2
    assert "write LOW:HIGH" in capsys.readouterr().err
    out = tmp_path / "out.json"
    # a band no utility can exceed never grows the cluster past its first node
    assert main(["simulate", str(workload), "--policy", "pollux", "--autoscaler", "pollux",
                 "--nodes", "4", "--processes", "1", "--utility-band", "0.99:1",
                 "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["num_completed"] == 3
    assert max(run["nodes_over_time"]["num_billed_nodes"]) == 1
