"""Autoscaling in the service: the desired cluster size is computed every round (idle
rounds too), handed to the backend's ``request_cluster_size``, and shown by the API and
``pollux ls``."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pytest

from pollux.backends.fake import FakeBackend
from pollux.cli.job_tables import cluster_line
from pollux.cli.server import add_server_arguments, config_from_args
from pollux.errors import ConfigError, UnknownPluginError
from pollux.policies.autoscaling import (
    AutoscalerConfig,
    NodeTemplate,
    PolluxAutoscaler,
    template_from_nodes,
)
from pollux.policies.base import NodeInfo
from pollux.service.config import AutoscalingConfig, LoopConfig, PolicyConfig, ServerConfig
from pollux.service.http.api import create_app
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.server import build_service
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from tests.service.e2e_helpers import EQUAL_SHARE
from tests.service.service_builders import AUTH_HEADERS, make_auth, make_nodes, make_spec
from tests.service.service_test_policies import EqualSharePolicy

with warnings.catch_warnings():  # starlette 1.0 asks for the httpx2 fork; httpx works
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient


class SizedBackend(FakeBackend):
    """The fake backend, recording every cluster size it is asked for."""

    def __init__(self) -> None:
        super().__init__(make_nodes(2, 2))
        self.requested: list[int | None] = []

    def request_cluster_size(self, num_nodes: int | None) -> None:
        self.requested.append(num_nodes)


def test_the_allocator_asks_the_autoscaler_before_the_policy(tmp_path: Path) -> None:
    nodes = make_nodes(2, 2)
    scaler = PolluxAutoscaler(AutoscalerConfig(template_from_nodes(nodes, 1.5), 1, 6, 1))
    grown = make_nodes(4, 2)
    backend = FakeBackend(nodes, provider=lambda n: grown[:n])
    seen: list[int] = []

    class CountingNodes(EqualSharePolicy):
        def optimize(self, jobs, nodes, previous_allocations):
            seen.append(len(nodes))
            return super().optimize(jobs, nodes, previous_allocations)

    store = JobStore(tmp_path / "db", synchronous="OFF")
    try:
        allocator = Allocator(store, backend, CountingNodes(), AllocatorConfig(tmp_path),
                              autoscaler=scaler)
        allocator.schedule_round(0.0)  # no jobs: only the autoscaler is asked
        assert backend.requested_sizes == [1] and seen == []
        assert allocator.last_scaling is not None
        assert allocator.last_scaling.reason == "no active jobs"
        store.add_job(make_spec("a", max_replicas=8), 1.0)  # perfect scaling: grows
        allocator.schedule_round(2.0)
        assert backend.requested_sizes == [1, 4] and seen == [4]
        assert allocator.last_scaling.utility == 1.0
    finally:
        store.close()


def test_the_template_is_the_most_common_node() -> None:
    nodes = [NodeInfo("head", {"cpu": 8.0}), *make_nodes(3, 4)]
    assert dict(template_from_nodes(nodes, 2.0).resources) == dict(make_nodes(1, 4)[0].resources)
    with pytest.raises(ConfigError, match="at least one node"):
        template_from_nodes([NodeInfo("empty", {})], 2.0)


def test_the_service_hands_the_desired_size_to_the_backend_every_round(tmp_path: Path) -> None:
    backend = SizedBackend()
    config = ServerConfig(data_dir=tmp_path, policy=PolicyConfig(EQUAL_SHARE),
                          loop=LoopConfig(interval_s=10.0),
                          autoscaling=AutoscalingConfig("pollux", max_nodes=4,
                                                        node_price_per_hour=3.0))
    service = build_service(config, None, backend)
    try:
        assert service.cluster() == {"autoscaler": "pollux", "num_nodes": 2,
                                     "desired_num_nodes": None, "gpu_type_speeds": {}}
        job = service.submit(make_spec("a", working_dir=str(tmp_path), max_replicas=8).to_dict())
        for second in range(0, 50, 10):  # a window of 5 rounds before the size changes
            service.allocator.tick(float(second))
        # no hints yet: perfect scaling assumed, 8 replicas of 1 slot fill 4 nodes of 2
        assert backend.requested == [2, 2, 2, 2, 4]
        with TestClient(create_app(service, make_auth()), headers=AUTH_HEADERS) as client:
            view = client.get("/api/cluster").json()
        assert view["desired_num_nodes"] == 4 and view["num_nodes"] == 2
        assert view["autoscaler"] == "pollux" and view["utility"] == pytest.approx(1.0)
        assert view["price_per_hour"] == pytest.approx(12.0)
        line = cluster_line(view)
        assert line is not None and line.startswith("cluster: 2 nodes; pollux autoscaler "
                                                    "wants 4")
        backend.finish(job["id"])
        for second in range(50, 120, 10):  # idle rounds still ask: the cluster shrinks
            service.allocator.tick(float(second))
        assert service.store.get_job(job["id"]).state is JobState.SUCCEEDED
        assert backend.requested[-1] == 1 and service.cluster()["desired_num_nodes"] == 1
    finally:
        service.store.close()


def test_without_an_autoscaler_nothing_changes(tmp_path: Path) -> None:
    service = build_service(ServerConfig(data_dir=tmp_path, policy=PolicyConfig("fifo")), None,
                            FakeBackend(make_nodes()))
    try:
        assert service.allocator.policy.name == "fifo"
        assert service.allocator.autoscaler is None
        assert cluster_line(service.cluster()) is None
    finally:
        service.store.close()


def test_server_flags_and_unknown_autoscalers(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    args = parser.parse_args(["--data-dir", str(tmp_path), "--autoscaler", "throughput",
                              "--min-nodes", "2", "--max-nodes", "9", "--node-price", "1.25"])
    config = config_from_args(args)
    assert config.autoscaling == AutoscalingConfig("throughput", 2, 9, 1.25)
    with pytest.raises(UnknownPluginError, match="choose from: none, pollux, throughput"):
        AutoscalingConfig(name="cheap")
    template = NodeTemplate({"gpu": 2.0})
    assert AutoscalerConfig(template, 0, 3).min_nodes == 0  # scale to zero is allowed


def test_the_service_autoscales_by_gpu_type_with_the_simulators_numbers(tmp_path: Path
                                                                      ) -> None:
    """``pollux server --autoscaler pollux --node-price a=4,b=16`` on nodes of two types:
    each round the service decides the nodes of each type, the simulator's typed
    autoscaler (built from the same cluster, prices and bounds) decides the same on the
    same jobs and sizes, and the backend is asked for the nodes of each type."""
    from pollux.cluster_spec import parse_cluster_spec
    from pollux.models.hints import JobHints, TypeProfile
    from pollux.models.throughput import ThroughputParams
    from pollux.sim import ClusterConfig, JobSpec, Workload
    from pollux.sim.runner import RunTask, build_autoscaler

    fast = ThroughputParams(0.01, 0.001, 0.1, 0.01, 0.05, 0.005, 1.5)
    slow = ThroughputParams(0.03, 0.003, 0.1, 0.01, 0.05, 0.005, 1.5)
    nodes = [NodeInfo(f"{t}-0", {"gpu": 4.0, "cpu": 8.0, "memory": 64e9}, gpu_type=t)
             for t in ("a", "b")]
    backend = FakeBackend(nodes)
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    args = parser.parse_args(["--data-dir", str(tmp_path / "data"), "--policy", "pollux",
                              "--autoscaler", "pollux", "--node-price", "a=4,b=16",
                              "--max-nodes", "4", "--interval", "10"])
    service = build_service(config_from_args(args), None, backend)
    try:
        for name, profiles in (("both", {"a": TypeProfile(fast, 2), "b": TypeProfile(slow, 1)}),
                               ("only-a", {"a": TypeProfile(slow, 2)})):
            job = service.submit(make_spec(name, max_replicas=16).to_dict())["id"]
            service.post_hints(job, JobHints(
                init_batch_size=32, max_batch_size=2048, local_bsz_bounds=(16, 128),
                throughput_params=profiles["a"].throughput_params, max_profiled_replicas=2,
                gpu_type="a", type_profiles=profiles).to_dict())
        simulated = build_autoscaler(RunTask(
            "pollux", Workload("w", (JobSpec("j", 0.0, "cifar10", 1, 128),)),
            ClusterConfig(cluster=parse_cluster_spec("a:4x4,b:4x4"), min_nodes=1, max_nodes=4,
                          node_price_per_hour={"a": 4.0, "b": 16.0}), autoscaler="pollux"))
        assert simulated is not None
        decided = []
        for second in range(1, 8):
            service.allocator.request_round()
            service.allocator.tick(1000.0 + 60.0 * second)
            scaling, snapshot = service.allocator.last_scaling, service.allocator.last_snapshot
            assert scaling is not None and snapshot is not None
            assert scaling == simulated.decide_by_type(snapshot.jobs, {"a": 1, "b": 1})
            assert backend.requested_by_type[-1] == dict(scaling.num_nodes_by_type)
            decided.append(dict(scaling.num_nodes_by_type))
        assert decided[0] == {"a": 1, "b": 1} and decided[-1] != decided[0], decided
        assert service.cluster()["desired_num_nodes_by_type"] == decided[-1]
    finally:
        service.store.close()
