"""The layers stay apart: models and policies import neither torch nor the runtime."""

from __future__ import annotations

import subprocess
import sys

import pytest

FORBIDDEN = ("torch", "pollux.service", "pollux.backends", "pollux.sim", "pollux.torch",
             "fastapi", "ray")


@pytest.mark.parametrize("module", ["pollux.models", "pollux.policies", "pollux.jobenv"])
def test_pure_layers_do_not_import_runtime(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} "
        f"or any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r})]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


def test_public_all_is_importable() -> None:
    import pollux.models as models

    for name in models.__all__:
        assert hasattr(models, name), name
