"""The agent's documentation: every public name shows an example, and the runnable ones
run (the tutorial's script runs in tests/docs/test_tutorial.py)."""

from __future__ import annotations

import doctest
import importlib

import pytest

import pollux.torch as pt

MODULES = ("accumulator", "batch_decider", "batch_size", "data_loader", "data_parallel",
           "distributed", "launch", "elastic_sampler", "epochs", "gradient_noise", "job",
           "scaling_rules", "checkpoint", "memory_bound")


@pytest.mark.parametrize("name", pt.__all__)
def test_every_public_name_has_an_example(name: str) -> None:
    doc = getattr(pt, name).__doc__ or ""
    assert ">>>" in doc or "::" in doc, f"pollux.torch.{name} has no example in its docstring"


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(f"pollux.torch.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
