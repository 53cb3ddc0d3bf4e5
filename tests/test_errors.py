"""One exception hierarchy: every error Pollux raises on purpose is defined in
pollux.errors, under PolluxError, and the module's docstring tree names them all."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pollux.errors as errors

PACKAGE = Path(errors.__file__).parent
INTERNAL = {"ApiError", "ServerShutdown", "CorruptCheckpointsError", "TransportError"}
"""Not errors of the hierarchy: the API turns ApiError into a response; ServerShutdown
unwinds the server's main loop on a signal; CorruptCheckpointsError is a SystemExit that
ends a training process with its exit code; TransportError (and its ConnectFailed) never
leaves the client package, which turns it into ServerUnreachableError or ServiceError."""


def test_errors_are_defined_in_errors_py_only() -> None:
    elsewhere = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception")) \
                    and node.name not in INTERNAL:
                elsewhere.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    assert not elsewhere


def test_the_docstring_tree_matches_the_classes() -> None:
    classes = {name: cls for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, (Exception, Warning))
               and cls.__module__ == errors.__name__}
    doc = errors.__doc__ or ""
    for name, cls in classes.items():
        assert name in doc, name
        if not issubclass(cls, Warning):
            assert issubclass(cls, errors.PolluxError), name
