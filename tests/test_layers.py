"""The layers stay apart (README's picture): each package imports only the layers below.

``models``, ``policies`` and the contract modules (``jobenv``, ``job_spec``,
``resources``, ``teams``) import neither torch nor the runtime; backends import neither the service
nor the policies; the in-job agent (``pollux.torch``, and AdaptDL's API over it in
``pollux.adaptdl``) imports none of policies, service and backends.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

RUNTIME = ("torch", "pollux.service", "pollux.backends", "pollux.sim", "pollux.torch",
           "fastapi", "ray")
LAYERS: dict[str, tuple[str, ...]] = {
    "pollux.models": RUNTIME,
    "pollux.policies": RUNTIME,
    "pollux.jobenv": RUNTIME + ("pollux.policies", "pollux.models"),
    "pollux.job_spec": RUNTIME + ("pollux.policies", "pollux.models"),
    "pollux.resources": RUNTIME + ("pollux.policies", "pollux.models"),
    "pollux.cluster_spec": RUNTIME + ("pollux.policies", "pollux.models"),
    "pollux.options": RUNTIME + ("pollux.policies", "pollux.models"),
    "pollux.capacity": RUNTIME + ("pollux.policies", "pollux.models", "numpy"),
    "pollux.backends.local_options": ("pollux.service", "pollux.policies", "pollux.sim",
                                      "pollux.torch", "torch"),
    "pollux.backends.ray.options": ("pollux.service", "pollux.policies", "pollux.sim",
                                    "pollux.torch", "torch", "ray"),
    "pollux.teams": RUNTIME + ("pollux.policies", "pollux.models", "numpy", "scipy"),
    "pollux.backends": ("pollux.service", "pollux.policies", "pollux.sim", "pollux.torch",
                        "torch"),
    "pollux.backends.fake": ("pollux.service", "pollux.policies", "pollux.sim",
                             "pollux.torch", "torch"),
    "pollux.backends.local": ("pollux.service", "pollux.policies", "pollux.sim",
                              "pollux.torch", "torch"),
    "pollux.backends.ray.nodes": ("pollux.service", "pollux.policies", "pollux.sim",
                                  "pollux.torch", "torch"),
    "pollux.backends.slurm": ("pollux.service", "pollux.policies", "pollux.sim",
                              "pollux.torch", "torch"),
    "pollux.torch": ("pollux.policies", "pollux.service", "pollux.backends", "pollux.sim"),
    "pollux.adaptdl.torch": ("pollux.policies", "pollux.service", "pollux.backends",
                             "pollux.sim"),
}


def imported(module: str, forbidden: tuple[str, ...]) -> list[str]:
    """The modules of ``forbidden`` (packages included) that importing ``module`` loads."""
    code = (
        f"import sys, importlib\nimportlib.import_module({module!r})\n"
        f"bad = [m for m in sys.modules "
        f"if any(m == f or m.startswith(f + '.') for f in {forbidden!r})]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return [name for name in out.stdout.strip().split(",") if name]


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_layer_imports_nothing_above_it(module: str) -> None:
    if module in ("pollux.torch", "pollux.adaptdl.torch"):
        pytest.importorskip("torch")
    bad = imported(module, LAYERS[module])
    assert not bad, f"{module} imports {', '.join(bad)}"


def test_the_check_can_fail() -> None:
    assert imported("pollux.service.loop.allocator", ("pollux.policies",))


def test_public_all_is_importable() -> None:
    import pollux.models as models

    for name in models.__all__:
        assert hasattr(models, name), name
