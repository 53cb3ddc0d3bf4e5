"""The JSON schema of a job spec, generated from the JobSpec definition, accepts what
:meth:`JobSpec.from_dict` accepts and refuses what it refuses: on hostile specs, on
generated ones, and the cases only JobSpec can refuse (a schema cannot say them) named."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pollux.errors import JobSpecError
from pollux.job_spec import JobSpec
from pollux.service.http.openapi import JOB_SPEC_SCHEMA

jsonschema = pytest.importorskip("jsonschema")
VALIDATOR = jsonschema.Draft202012Validator(JOB_SPEC_SCHEMA)

BASE = {"name": "digits", "command": ["python", "train.py"], "working_dir": "/tmp"}
HOSTILE_SPECS = [  # each: fields over BASE (None: remove the field)
    {}, {"name": "a" * 63}, {"name": "a" * 64}, {"name": "a\n"}, {"name": "-a"},
    {"name": ""}, {"name": None}, {"name": 7}, {"name": "ok.name_1-2"},
    {"command": "python train.py"}, {"command": ""}, {"command": " \t\n"}, {"command": []},
    {"command": ["", "x"]}, {"command": ["a\x00"]}, {"command": ["python", 3]},
    {"command": [["python"]]}, {"command": {"argv": "x"}}, {"command": None},
    {"working_dir": "relative/dir"}, {"working_dir": "/a\nb"}, {"working_dir": "/tab\there"},
    {"working_dir": "/a\x7f"}, {"working_dir": ""}, {"working_dir": "/"}, {"working_dir": 3},
    {"working_dir": "/a\x00"},
    {"env": None}, {"env": {}}, {"env": {"A": "1", "B_2": 3, "C": 1.5}},
    {"env": {"POLLUX_X": "1"}}, {"env": {"1A": "x"}}, {"env": {"A-B": "x"}}, {"env": {"": "x"}},
    {"env": {"A": True}}, {"env": {"A": None}}, {"env": {"A": ["x"]}}, {"env": {"A": "a\x00"}},
    {"env": ["A=1"]}, {"env": "A=1"},
    {"resources": None}, {"resources": {}}, {"resources": {"gpu": 0, "cpu": 2}},
    {"resources": {"gpu": -1}}, {"resources": {"gpu": 1e10}}, {"resources": {"gpu": "1"}},
    {"resources": {"gpu": True}}, {"resources": {"gpu": None}}, {"resources": {"disk": 1}},
    {"resources": {"cpu": 1e9}}, {"resources": {"cpu": math.inf}},
    {"resources": {"memory": "2GiB"}}, {"resources": {"memory": " 512 mib "}},
    {"resources": {"memory": "2 parsecs"}}, {"resources": {"memory": "-2G"}},
    {"resources": {"memory": "G"}}, {"resources": {"memory": 2**60}},
    {"resources": {"memory": 2**61}}, {"resources": {"memory": -1}},
    {"resources": {"memory": False}}, {"resources": {"memory": [1]}}, {"resources": [1]},
    {"min_replicas": 0}, {"min_replicas": -1}, {"min_replicas": 10**6, "max_replicas": 10**6},
    {"max_replicas": 10**6 + 1}, {"max_replicas": 0}, {"max_replicas": 2.0},
    {"max_replicas": 2.5}, {"max_replicas": "2"}, {"max_replicas": True},
    {"max_replicas": None}, {"max_replicas": 10**400}, {"max_replicas": math.inf},
    {"preemptible": False}, {"preemptible": "yes"}, {"preemptible": 0}, {"preemptible": None},
    {"restart_delay_s": 0}, {"restart_delay_s": 1e9}, {"restart_delay_s": 1e9 + 1},
    {"restart_delay_s": -0.5}, {"restart_delay_s": "30"}, {"restart_delay_s": -math.inf},
    {"max_failures": 0}, {"max_failures": 3.5}, {"max_failures": -1},
    {"on_corrupt_checkpoint": "fresh"}, {"on_corrupt_checkpoint": "FAIL"},
    {"on_corrupt_checkpoint": 1}, {"on_corrupt_checkpoint": None},
    {"surprise": 1}, {"Name": "x"},
]
SCHEMA_IS_LOOSER = [  # JobSpec refuses what JSON Schema cannot say; each says why
    ({"command": "'unbalanced"}, "the string does not split like a shell's"),
    ({"command": '""'}, "it splits into an empty program name"),
    ({"command": "x" * (130 << 10)}, "the command line is over 128 KiB (exec's limit)"),
    ({"env": {f"V{i}": "x" * 1000 for i in range(140)}}, "the environment is over 128 KiB"),
    ({"env": {"A": 10**4000}}, "a number of 4,000+ digits (the API refuses 4,300+)"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas below min_replicas"),
    ({"resources": {"gpu": 0, "cpu": 0}}, "a replica asking for nothing"),
    ({"resources": {"memory": "2000000TiB"}}, "a size with a unit over 1 EiB"),
    ({"restart_delay_s": math.nan}, "NaN is not JSON (RFC 8259)"),
]


def spec_of(changes: dict) -> dict:
    spec = dict(BASE)
    for key, value in changes.items():
        if value is None and key in BASE:
            del spec[key]
        else:
            spec[key] = value
    return spec


def accepted_by_jobspec(spec: dict) -> bool:
    try:
        JobSpec.from_dict(spec)
    except JobSpecError:
        return False
    return True


def accepted_by_schema(spec: dict) -> bool:
    return VALIDATOR.is_valid(spec)


@pytest.mark.parametrize("changes", HOSTILE_SPECS, ids=lambda c: repr(c)[:40])
def test_the_schema_accepts_exactly_what_jobspec_accepts(changes):
    spec = spec_of(changes)
    assert accepted_by_schema(spec) == accepted_by_jobspec(spec)


@pytest.mark.parametrize(("changes", "why"), SCHEMA_IS_LOOSER, ids=lambda c: repr(c)[:40])
def test_what_only_jobspec_refuses(changes, why):
    spec = spec_of(changes)
    assert accepted_by_schema(spec) and not accepted_by_jobspec(spec), why


numbers = st.one_of(st.integers(-3, 3), st.integers(10**6 - 1, 10**6 + 1),
                    st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                    st.sampled_from([0.0, 1.0, 2.0, 0.5, 1e9, 1e9 + 1, 2.0**60, 2.0**60 * 2]))
values = st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=6),
                   st.lists(st.text(max_size=3), max_size=2))
texts = st.text(st.characters(codec="utf-8"), max_size=8)
field_values = {
    "name": st.one_of(st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z"), texts, values),
    "command": st.one_of(st.lists(texts.filter(bool), min_size=1, max_size=3),
                         st.lists(texts, max_size=2), values),
    "working_dir": st.one_of(texts.map(lambda t: "/" + t), texts, values),
    "env": st.one_of(st.dictionaries(st.one_of(st.from_regex(r"\A[A-Za-z_]\w{0,4}\Z",
                                                             fullmatch=True), texts),
                                     st.one_of(texts, st.integers(-9, 9), st.floats(),
                                               st.booleans(), st.none()), max_size=3),
                     values),
    "resources": st.one_of(st.fixed_dictionaries({}, optional={
        "gpu": numbers, "cpu": numbers, "memory": st.one_of(
            numbers, st.from_regex(r"\A ?[0-9]{1,4}(\.[0-9]?)? ?(k|Mi|gib|TB|x|)\Z"), values)}),
        values),
    "min_replicas": values, "max_replicas": values, "preemptible": values,
    "restart_delay_s": values, "max_failures": values,
    "on_corrupt_checkpoint": st.one_of(st.sampled_from(["fail", "fresh", "Fresh"]), values),
    "priority": st.one_of(st.integers(-101, 101), values),
}
no_nul = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
plain = st.text(st.characters(codec="utf-8", exclude_categories=["Cc"]), max_size=8)
counts = st.one_of(st.integers(1, 10**6), st.integers(1, 10**6).map(float))
amounts = st.one_of(st.floats(0.0, 1e9), st.integers(0, 10**9))
valid_values = {
    "name": st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z"),
    "command": st.lists(no_nul, min_size=1, max_size=3).filter(lambda argv: argv[0] != ""),
    "working_dir": plain.map(lambda text: "/" + text),
    "env": st.dictionaries(st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,6}\Z").filter(
        lambda name: not name.startswith("POLLUX_")),
        st.one_of(no_nul, st.integers(-10**6, 10**6), st.floats(allow_nan=False)), max_size=3),
    "resources": st.fixed_dictionaries({}, optional={
        "gpu": amounts, "cpu": amounts, "memory": st.one_of(
            st.integers(0, 2**60), st.from_regex(r"\A ?[0-9]{1,4}(\.[0-9]?)? ?(k|Mi|gib|TB|)\Z"),
            st.none())}),
    "min_replicas": st.just(0) | counts, "max_replicas": counts,
    "preemptible": st.booleans(), "restart_delay_s": amounts,
    "max_failures": st.just(0) | counts,
    "on_corrupt_checkpoint": st.sampled_from(["fail", "fresh"]),
    "priority": st.integers(-100, 100) | st.integers(-100, 100).map(float),
}
specs = st.tuples(
    st.fixed_dictionaries({}, optional={key: value | st.none() if key not in BASE else value
                                        for key, value in valid_values.items()}),
    st.one_of(st.just({}), st.sampled_from(sorted(field_values)).flatmap(
        lambda key: field_values[key].map(lambda value: {key: value})))
).map(lambda parts: {**parts[0], **parts[1]})


@settings(max_examples=150, deadline=None)
@given(changes=specs)
def test_schema_and_jobspec_agree_on_generated_specs(changes):
    """Specs of valid fields (null where optional) and at most one hostile one (near its
    bounds, of another type, null); the cases the schema cannot express
    (SCHEMA_IS_LOOSER) left out."""
    spec = {**BASE, **changes}
    resources = spec.get("resources")
    lo, hi = spec.get("min_replicas"), spec.get("max_replicas")
    assume(not (isinstance(lo, (int, float)) and isinstance(hi, (int, float))
                and not isinstance(lo, bool) and not isinstance(hi, bool) and hi < lo))
    assume(not (isinstance(resources, dict) and resources.get("gpu") == 0
                and resources.get("cpu") == 0))
    assume(not isinstance(spec.get("command"), str))
    assert accepted_by_schema(spec) == accepted_by_jobspec(spec), spec


@pytest.mark.parametrize("changes", [
    {"command": "a" * 200_000 + "\x00"}, {"command": ["a" * 200_000 + "\x00"]},
    {"resources": {"memory": "1" + " " * 200_000 + "x"}},
    {"working_dir": "/" + "a" * 200_000 + "\n"}, {"env": {"A" * 200_000 + "-": "x"}},
    {"env": {"A": "a" * 200_000 + "\x00"}},
], ids=lambda c: repr(c)[:30])
def test_no_pattern_of_the_schema_backtracks_for_long(changes):
    """A client validating a hostile 200 kB field must not take quadratic time (the
    command's pattern once did: minutes); linear is milliseconds, the bound generous."""
    import time

    start = time.perf_counter()
    assert not accepted_by_schema(spec_of(changes))
    assert time.perf_counter() - start < 2.0
