"""The typed-cluster vocabulary: the cluster spec and the one-type-per-job rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.cluster_spec import (
    ClusterSpec,
    NodeGroup,
    allocation_gpu_type,
    gpu_types_of,
    parse_cluster_spec,
)
from pollux.errors import ConfigError, MixedGpuTypesError, PolluxError
from pollux.resources import DEFAULT_GPU_TYPE, NodeInfo


def test_the_sia_cluster() -> None:
    spec = parse_cluster_spec("aws:6x4,dgx-ext:2x8,rtx:3x8")
    assert spec.groups == (NodeGroup("aws", 6, 4), NodeGroup("dgx-ext", 2, 8),
                           NodeGroup("rtx", 3, 8))
    assert (spec.num_nodes, spec.num_gpus, spec.is_typed) == (11, 64, True)
    nodes = spec.node_infos()
    assert [n.name for n in nodes][:7] == ["aws-0", "aws-1", "aws-2", "aws-3", "aws-4", "aws-5",
                                           "dgx-ext-0"]
    assert {t: sum(n.num_gpus for n in g) for t, g in gpu_types_of(nodes).items()} == {
        "aws": 24, "dgx-ext": 16, "rtx": 24}


def test_untyped_spec_is_the_homogeneous_cluster_with_the_old_names() -> None:
    spec = parse_cluster_spec("16x4")
    assert not spec.is_typed
    nodes = spec.node_infos()
    assert [n.name for n in nodes][:2] == ["node-00", "node-01"]
    assert {n.gpu_type for n in nodes} == {DEFAULT_GPU_TYPE}
    assert NodeInfo("x", {"gpu": 1}).gpu_type == DEFAULT_GPU_TYPE


@pytest.mark.parametrize("text, fix", [
    ("", "type:NODESxGPUS"),
    ("aws:6", "type:NODESxGPUS"),
    ("aws:6x4,,rtx:1x8", "type:NODESxGPUS"),
    ("aws:0x4", ">= 1"),
    ("aws:2x0", ">= 1"),
    ("aws:-1x4", "type:NODESxGPUS"),
    ("aws:1x4,aws:2x8", "appears twice"),
    ("a w:1x4", "letters, digits"),
    ("a:b:1x4", "type:NODESxGPUS"),
])
def test_bad_specs_name_the_group_and_the_fix(text: str, fix: str) -> None:
    with pytest.raises(ConfigError, match="cluster") as info:
        parse_cluster_spec(text)
    assert fix in str(info.value)


type_names = st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True)


@given(st.lists(st.tuples(type_names, st.integers(1, 20), st.integers(1, 16)),
                min_size=1, max_size=5, unique_by=lambda g: g[0]))
def test_spec_round_trips_and_counts(groups: list[tuple[str, int, int]]) -> None:
    spec = ClusterSpec(tuple(NodeGroup(*g) for g in groups))
    assert parse_cluster_spec(str(spec)) == spec
    nodes = spec.node_infos()
    assert len({n.name for n in nodes}) == len(nodes) == spec.num_nodes
    assert sum(n.num_gpus for n in nodes) == spec.num_gpus


def test_an_allocation_never_spans_types() -> None:
    nodes = {n.name: n for n in parse_cluster_spec("aws:2x4,rtx:1x8").node_infos()}
    assert allocation_gpu_type(("aws-0", "aws-1", "aws-1"), nodes) == "aws"
    assert allocation_gpu_type((), nodes) is None
    with pytest.raises(MixedGpuTypesError, match="'aws' and 'rtx'"):
        allocation_gpu_type(("aws-0", "rtx-0"), nodes)
    with pytest.raises(PolluxError, match="unknown node 'gpu-9'"):
        allocation_gpu_type(("gpu-9",), nodes)


def test_type_speeds_parse_and_bad_entries_name_the_flag() -> None:
    from pollux.cluster_spec import parse_type_speeds

    assert parse_type_speeds("t4=1, a100=6.9,dgx-ext=12") == {"t4": 1.0, "a100": 6.9,
                                                             "dgx-ext": 12.0}
    for bad in ("", "t4", "t4=0", "t4=-1", "t4=inf", "t4=nan", "t4=fast", "=2",
                "t4=1,t4=2", "a b=1"):
        with pytest.raises(ConfigError) as error:
            parse_type_speeds(bad, "--gpu-type-speeds")
        assert error.value.field == "--gpu-type-speeds", bad


def test_a_server_with_bad_type_speeds_does_not_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pollux.service.config import PolicyConfig, ServerConfig

    with pytest.raises(ConfigError, match="type=SPEED"):
        ServerConfig(data_dir=tmp_path, policy=PolicyConfig(gpu_type_speeds="a100:6.9"))
