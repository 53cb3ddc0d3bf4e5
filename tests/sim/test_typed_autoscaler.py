"""The autoscaler on a typed cluster: nodes of each GPU type chosen by goodput per dollar,
and their cost at each type's price."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pollux.cluster_spec import parse_cluster_spec
from pollux.errors import ConfigError
from pollux.policies.registry import make_policy
from pollux.sim.applications import TypedApplication, load_typed_applications
from pollux.sim.cluster import node_seconds
from pollux.sim.config import ClusterConfig
from pollux.sim.job import JobSpec
from pollux.sim.metrics import summarize_run
from pollux.sim.runner import RunTask, build_autoscaler
from pollux.sim.semantics import SIA_ARTIFACT
from pollux.sim.simulator import SimulationResult, Simulator
from pollux.sim.workload import Workload, write_workload
from tests.sim.test_hetero import SIA, needs_sia

SPEC = parse_cluster_spec("aws:4x4,dgx-ext:2x8")
BERT = Workload("bert", (JobSpec("bert-0", 0.0, "bert", 1, 12),
                         JobSpec("bert-1", 0.0, "bert", 1, 12)))


@pytest.fixture(scope="module")
def apps() -> dict[str, TypedApplication]:
    return load_typed_applications(SIA / "traces", SPEC.gpu_types)


def run(apps: dict[str, TypedApplication], prices: dict[str, float],
        max_nodes: int | None = None) -> tuple[Simulator, SimulationResult]:
    config = ClusterConfig(cluster=SPEC, semantics=SIA_ARTIFACT, node_price_per_hour=prices,
                           provision_delay_s=0.0, max_time_s=4 * 3600.0, max_nodes=max_nodes)
    task = RunTask("pollux", BERT, config, autoscaler="pollux",
                   autoscaler_options={"window_rounds": 1})
    sim = Simulator(BERT, apps, make_policy("pollux", seed=0), config,
                    autoscaler=build_autoscaler(task))
    return sim, sim.run()


@needs_sia
def test_the_type_with_more_goodput_per_dollar_gets_the_nodes(
        apps: dict[str, TypedApplication]) -> None:
    # bert trains ~10.8x faster per GPU on an A100 than on a T4: at AWS prices (4.1 against
    # 0.98 per GPU-hour) the A100s are worth it; at 100x that price they are not
    for dgx_price, wanted in ((32.77, "dgx-ext"), (3277.0, "aws")):
        sim, result = run(apps, {"aws": 3.912, "dgx-ext": dgx_price})
        assert sim.cluster is not None
        grown = [dict(size.billed_by_type) for size in sim.cluster.history[1:]]
        assert grown and any(size[wanted] > 0 for size in grown), (dgx_price, grown)
        other = "aws" if wanted == "dgx-ext" else "dgx-ext"
        record = summarize_run(result, apps)
        assert record.num_completed == 2
        hours = {t: node_seconds(result.cluster_sizes, max(
            j.completion_s or 0.0 for j in record.jobs), t) / 3600 for t in SPEC.gpu_types}
        assert record.cost == pytest.approx(hours["aws"] * 3.912 + hours["dgx-ext"] * dgx_price)
        # the other type only while the wanted one is full (its group's 4 or 2 nodes)
        assert hours[wanted] > 3 * hours[other], (dgx_price, hours)


@needs_sia
def test_max_nodes_bounds_the_typed_cluster_in_all(apps: dict[str, TypedApplication]) -> None:
    sim, result = run(apps, {"aws": 3.912, "dgx-ext": 32.77}, max_nodes=2)
    assert max(size.num_billed_nodes for size in result.cluster_sizes) == 2
    assert summarize_run(result, apps).num_completed == 2


def test_node_prices_name_every_type() -> None:
    spec = parse_cluster_spec("t4:2x4,a100:1x8")
    assert ClusterConfig(cluster=spec, node_price_per_hour=2.0).node_prices() == {
        "t4": 2.0, "a100": 2.0}
    with pytest.raises(ConfigError, match="one per GPU type: t4, a100"):
        ClusterConfig(cluster=spec, node_price_per_hour={"t4": 3.91})
    with pytest.raises(ConfigError, match="node_price_per_hour"):
        ClusterConfig(cluster=spec, node_price_per_hour={"t4": 3.91, "a100": -1.0})


@needs_sia
def test_cli_autoscales_a_typed_cluster_with_per_type_prices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pollux.cli.main import main

    path = tmp_path / "bert.csv"
    write_workload(BERT, path)
    args = ["simulate", str(path), "--cluster", str(SPEC), "--traces", str(SIA / "traces"),
            "--policy", "pollux", "--processes", "1", "--autoscaler", "pollux",
            "--provision-delay-s", "0", "--json", "-"]
    assert main([*args, "--node-price", "aws=3.912,dgx-ext=32.77"]) == 0
    run_ = json.loads(capsys.readouterr().out)["runs"][0]
    assert run_["num_completed"] == 2 and run_["autoscaler"] == "pollux"
    assert run_["cost"] > run_["node_hours"] * 3.912  # some A100 node-hours at 32.77
    baseline = [a if a != "pollux" or i != args.index("--autoscaler") + 1 else "throughput"
                for i, a in enumerate(args)]
    assert main([*baseline, "--node-price", "3.912"]) == 0  # the throughput baseline too
    run_ = json.loads(capsys.readouterr().out)["runs"][0]
    assert run_["num_completed"] == 2 and run_["autoscaler"] == "throughput"
    assert main([*args, "--node-price", "aws=3.912"]) != 0
    assert "one per GPU type" in capsys.readouterr().err


@needs_sia
def test_cli_max_price_per_hour_bounds_what_the_typed_autoscaler_buys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pollux.cli.main import main

    path = tmp_path / "bert.csv"
    write_workload(BERT, path)
    args = ["simulate", str(path), "--traces", str(SIA / "traces"), "--policy", "pollux",
            "--processes", "1", "--autoscaler", "pollux", "--provision-delay-s", "0",
            "--json", "-"]
    typed = ["--cluster", str(SPEC), "--node-price", "aws=3.912,dgx-ext=32.77"]
    # 8 per hour buys two aws nodes at most, never the dgx-ext node the jobs would rather have
    assert main([*args, *typed, "--max-price-per-hour", "8"]) == 0
    run_ = json.loads(capsys.readouterr().out)["runs"][0]
    assert run_["num_completed"] == 2
    assert run_["cost"] == pytest.approx(run_["node_hours"] * 3.912)
    assert run_["node_hours"] > 0
    for bad in ([*typed, "--max-price-per-hour", "0"],  # refused before any run starts
                [*typed, "--max-price-per-hour", "nan"],
                ["--nodes", "2", "--max-price-per-hour", "8"]):  # untyped: refused
        assert main([*args, *bad]) == 2
        assert "max_price_per_hour" in capsys.readouterr().err


def test_a_typed_run_task_goes_to_worker_processes() -> None:
    """Runs go to worker processes pickled: the typed semantics and per-type prices too."""
    import pickle

    config = ClusterConfig(cluster=SPEC, semantics=SIA_ARTIFACT,
                           node_price_per_hour={"aws": 3.912, "dgx-ext": 32.77})
    task = RunTask("sia", BERT, config, "traces", autoscaler="pollux")
    assert pickle.loads(pickle.dumps(task)) == task
