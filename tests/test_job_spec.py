"""Job specs: YAML/flags parse, round-trip, and every bad field is named."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import JobSpecError
from pollux.job_spec import JobSpec, parse_memory

GOOD: dict[str, Any] = {"name": "digits", "command": "python train.py --epochs 3",
                        "working_dir": "/tmp"}

YAML = """
name: digits
command: [python, train.py, --epochs, "3"]
working_dir: /work
env: {SEED: 3, MODE: fast}
resources: {gpu: 1, cpu: 2, memory: 2GiB}
min_replicas: 1
max_replicas: 4
preemptible: false
restart_delay_s: 20
max_failures: 5
"""


def test_yaml_spec_parses_every_field():
    spec = JobSpec.from_yaml(YAML)
    assert spec.command == ("python", "train.py", "--epochs", "3")
    assert spec.env == {"SEED": "3", "MODE": "fast"}
    assert spec.resources.memory_bytes == 2 * 2**30 and spec.resources.cpu == 2
    assert (spec.min_replicas, spec.max_replicas, spec.preemptible) == (1, 4, False)
    assert (spec.restart_delay_s, spec.max_failures) == (20.0, 5)
    assert JobSpec.from_dict(spec.to_dict()) == spec


def test_defaults():
    spec = JobSpec.from_dict(GOOD)
    assert spec.command == ("python", "train.py", "--epochs", "3")
    assert (spec.min_replicas, spec.max_replicas, spec.max_failures) == (1, 1, 3)
    assert spec.preemptible and spec.resources.gpu == 1


@pytest.mark.parametrize(("change", "field"), [
    ({"name": "bad name!"}, "name"),
    ({"name": None}, "name"),
    ({"command": ""}, "command"),
    ({"command": ["python", 3]}, "command"),
    ({"command": "python 'unclosed"}, "command"),
    ({"working_dir": "relative/dir"}, "working_dir"),
    ({"env": {"POLLUX_RANK": "1"}}, "env.POLLUX_RANK"),
    ({"env": {"1BAD": "x"}}, "env.1BAD"),
    ({"env": ["A=1"]}, "env"),
    ({"resources": {"gpu": -1}}, "resources.gpu"),
    ({"resources": {"tpu": 1}}, "resources.tpu"),
    ({"resources": {"memory": "2 parsecs"}}, "resources.memory"),
    ({"resources": {"gpu": 0, "cpu": 0}}, "resources"),
    ({"min_replicas": -1}, "min_replicas"),
    ({"max_replicas": 0}, "max_replicas"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
    ({"max_replicas": 2.5}, "max_replicas"),
    ({"preemptible": "yes"}, "preemptible"),
    ({"restart_delay_s": float("nan")}, "restart_delay_s"),
    ({"max_failures": True}, "max_failures"),
    ({"max_falures": 3}, "max_falures"),
    # issue #13 item 10: '$' let a trailing newline through; exec fails past 128 KiB
    ({"name": "digits\n"}, "name"),
    ({"env": {"KEY\n": "x"}}, "env.'KEY\\n'"),
    ({"env": {"BIG": "x" * (128 << 10)}}, "env"),
    ({"env": {f"V{i}": "x" * 1024 for i in range(200)}}, "env"),
    ({"command": ["python", "x" * (200 << 10)]}, "command"),
    ({"on_corrupt_checkpoint": "ignore"}, "on_corrupt_checkpoint"),
])
def test_invalid_fields_are_named(change, field):
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict({**GOOD, **change})
    assert info.value.field == field
    assert field in str(info.value)


def test_bad_yaml_and_non_mappings():
    with pytest.raises(JobSpecError, match="YAML"):
        JobSpec.from_yaml("name: [unclosed")
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_yaml("- a list")
    assert info.value.field == "spec"


@pytest.mark.parametrize(("text", "expected"), [
    ("512MiB", 512 * 2**20), ("2G", 2e9), ("1.5 GiB", 1.5 * 2**30), (1024, 1024.0)])
def test_memory_units(text, expected):
    assert parse_memory(text) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.text(max_size=8), children, max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(
    ["name", "command", "working_dir", "env", "resources", "min_replicas", "max_replicas",
     "preemptible", "restart_delay_s", "max_failures", "other"]), json_values))
def test_arbitrary_input_is_accepted_or_rejected_with_a_field(data):
    try:
        spec = JobSpec.from_dict({**GOOD, **data})
    except JobSpecError as exc:
        assert exc.field and exc.field.split(".")[0] in set(data) | {"spec", "resources"}
    else:
        assert JobSpec.from_dict(spec.to_dict()) == spec
        assert 0 <= spec.min_replicas <= spec.max_replicas


HUGE_INTEGERS = [10**308, -(10**308), 10**400, 10**5000]
"""309 digits and more: too large for a float (and, the last, for ``str``)."""


@pytest.mark.parametrize("huge", HUGE_INTEGERS, ids=["308", "-308", "400", "5000"])
@pytest.mark.parametrize(("field", "change"), [
    ("min_replicas", lambda n: {"min_replicas": n}),
    ("max_replicas", lambda n: {"max_replicas": n}),
    ("max_failures", lambda n: {"max_failures": n}),
    ("restart_delay_s", lambda n: {"restart_delay_s": n}),
    ("resources.gpu", lambda n: {"resources": {"gpu": n}}),
    ("resources.cpu", lambda n: {"resources": {"cpu": n}}),
    ("resources.memory", lambda n: {"resources": {"memory": n}}),
    ("env.SEED", lambda n: {"env": {"SEED": n}}),
])
def test_integers_too_large_for_a_float_are_refused_naming_the_field(field, change, huge):
    if field == "env.SEED" and huge < 10**4000:
        assert JobSpec.from_dict({**GOOD, **change(huge)}).env["SEED"] == str(huge)
        return
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict({**GOOD, **change(huge)})
    assert caught.value.field == field
    assert "digits" in str(caught.value)  # the value is named by its size, not printed


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=10**300, max_value=10**2000) | st.integers(
    min_value=-(10**2000), max_value=-(10**300)), st.sampled_from(
    ["min_replicas", "max_replicas", "max_failures", "restart_delay_s"]))
def test_any_long_integer_gets_a_spec_error(number, key):
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict({**GOOD, key: number})
    assert caught.value.field == key
