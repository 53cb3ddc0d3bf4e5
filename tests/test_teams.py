"""The teams file: read, checked against the cluster, refused naming the field."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.cluster_spec import parse_cluster_spec
from pollux.errors import ConfigError
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.teams import DEFAULT_TEAM, Team, Teams, load_teams, parse_teams

UNTYPED = parse_cluster_spec("16x4")
TYPED = parse_cluster_spec("a100:2x4,t4:4x4")


def _refused(data: object, cluster: object = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_teams(data, cluster=cluster)  # type: ignore[arg-type]
    return caught.value


def test_the_issues_file_reads_on_an_untyped_cluster(tmp_path: Path) -> None:
    path = tmp_path / "teams.yaml"
    path.write_text("teams:\n  vision: {quota_gpus: 24, weight: 1}\n"
                    "  nlp:    {quota_gpus: 32, weight: 2, slurm_account: nlp-lab}\n")
    teams = load_teams(path, cluster=UNTYPED)
    assert teams.names == ("vision", "nlp")
    assert teams["nlp"] == Team("nlp", {DEFAULT_GPU_TYPE: 32}, 2.0, "nlp-lab")
    assert teams["vision"].quota() == 24 and teams["vision"].slurm_account is None
    assert teams.total_quota() == 56 and teams["nlp"].total_quota_gpus == 32


def test_per_type_quotas_on_a_typed_cluster() -> None:
    teams = parse_teams({"teams": {"a": {"quota_gpus": {"a100": 8, "t4": 6}},
                                   "b": {"quota_gpus": {"t4": 10}, "weight": 0.5}}},
                        cluster=TYPED)
    assert teams["a"].quota("a100") == 8 and teams["b"].quota("a100") == 0
    assert teams.total_quota("t4") == 16 and teams["b"].weight == 0.5
    assert teams.gpu_types == ("a100", "t4")


def test_quotas_above_the_cluster_are_refused_with_the_sum() -> None:
    error = _refused({"teams": {"a": {"quota_gpus": 40}, "b": {"quota_gpus": 30}}}, UNTYPED)
    assert error.field == "teams.*.quota_gpus" and error.value == 70
    assert "a 40, b 30" in str(error) and "cluster has 64" in str(error)
    error = _refused({"teams": {"a": {"quota_gpus": {"a100": 9}}}}, TYPED)
    assert "of type 'a100'" in str(error) and "cluster has 8" in str(error)


def test_the_quota_form_must_match_the_cluster() -> None:
    error = _refused({"teams": {"a": {"quota_gpus": 24}}}, TYPED)
    assert error.field == "teams.a.quota_gpus" and "{a100: 0, t4: 0}" in error.fix
    error = _refused({"teams": {"a": {"quota_gpus": {"a100": 8}}}}, UNTYPED)
    assert error.field == "teams.a.quota_gpus" and "no GPU types" in error.fix
    error = _refused({"teams": {"a": {"quota_gpus": {"v100": 2}}}}, TYPED)
    assert error.field == "teams.a.quota_gpus.v100" and "a100, t4" in error.fix


@pytest.mark.parametrize(("team", "field"), [
    ({"weight": 0}, "teams.x.weight"),
    ({"weight": -1}, "teams.x.weight"),
    ({"weight": float("inf")}, "teams.x.weight"),
    ({"weight": True}, "teams.x.weight"),
    ({"weight": "2"}, "teams.x.weight"),
    ({"quota_gpus": -1}, "teams.x.quota_gpus"),
    ({"quota_gpus": 2.5}, "teams.x.quota_gpus"),
    ({"quota_gpus": {"t4": -3}}, "teams.x.quota_gpus.t4"),
    ({"quota": 8}, "teams.x.quota"),
    ({"slurm_account": "a b"}, "teams.x.slurm_account"),
    ("eight", "teams.x"),
])
def test_bad_fields_are_refused_naming_the_field(team: object, field: str) -> None:
    error = _refused({"teams": {"x": team}})
    assert error.field == field, error


def test_bad_shapes_and_names_are_refused() -> None:
    assert _refused({"team": {"x": {}}}).field == "teams"
    assert _refused({"teams": {"x": {}}, "extra": 1}).field == "teams"
    assert _refused({"teams": {}}).field == "teams"
    assert _refused(["x"]).field == "teams"
    assert _refused({"teams": {"bad name": {}}}).field == "teams.bad name"


def test_bad_yaml_and_missing_files_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "teams.yaml"
    path.write_text("teams: {vision: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as caught:
        load_teams(path)
    assert caught.value.field == "teams_file" and caught.value.value == str(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_teams(tmp_path / "absent.yaml")


def test_team_of_resolves_the_default_and_refuses_unknown_teams() -> None:
    teams = parse_teams({"teams": {"default": {}, "nlp": {"quota_gpus": 4}}})
    assert teams.team_of(None).name == DEFAULT_TEAM and teams.team_of("nlp").quota() == 4
    with pytest.raises(ConfigError, match="choose from: default, nlp"):
        teams.team_of("vision")
    without_default = parse_teams({"teams": {"nlp": {}}})
    with pytest.raises(ConfigError, match="add it to the file"):
        without_default.team_of("")


def test_teams_are_frozen_unique_and_picklable() -> None:
    teams = parse_teams({"teams": {"a": {"quota_gpus": 2}}})
    with pytest.raises(TypeError):
        teams["a"].quota_gpus["default"] = 5  # type: ignore[index]
    quota = {"t4": 2}
    team = Team("b", quota)
    quota["t4"] = 9
    assert team.quota("t4") == 2  # a copy, not a view of the caller's dict
    assert pickle.loads(pickle.dumps(teams)) == teams
    with pytest.raises(ConfigError, match="once"):
        Teams((Team("a", {}), Team("a", {})))


@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True),
                       st.fixed_dictionaries({"quota_gpus": st.integers(0, 16),
                                              "weight": st.floats(0.01, 100)}),
                       min_size=1, max_size=6))
@settings(max_examples=30, deadline=None)
def test_a_file_round_trips_through_yaml(body: dict[str, dict[str, float]]) -> None:
    teams = parse_teams({"teams": body})
    assert parse_teams(yaml.safe_load(yaml.safe_dump(teams.to_dict(), sort_keys=False))) == teams
