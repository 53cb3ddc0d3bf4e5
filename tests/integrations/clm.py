"""The data and model of examples/transformers_clm.py, for the Hugging Face tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "transformers_clm.py"


def _load_example():  # type: ignore[no-untyped-def]
    name = "transformers_clm_example"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_example = _load_example()
MarkovCorpus = _example.MarkovCorpus
build_model = _example.build_model
