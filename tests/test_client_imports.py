"""The client stands alone: the CLI's job commands load no server, simulator, policy,
numerics or web framework, neither for ``--help`` nor when they run.

Each command runs in a fresh interpreter (``python -c``) against a data directory no
server runs on, so it goes its whole way (parse, build the request, find the server)
and fails with "no server found"; the modules it loaded on the way are then checked.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pollux
from pollux.cli.main import COMMAND_MODULES, COMMANDS, build_parser, command_of

HEAVY = ("numpy", "scipy", "fastapi", "uvicorn", "torch", "starlette", "pydantic",
         "httpx", "httpcore", "anyio", "trio", "pollux.service", "pollux.sim",
         "pollux.policies", "pollux.models", "pollux.backends")
"""What a job command must not load (its client speaks HTTP with the standard library)."""

DIR = "{data_dir}"
JOB_COMMANDS: dict[str, list[str]] = {
    "submit": ["submit", "--data-dir", DIR, "--", "python", "train.py"],
    "ls": ["ls", "--data-dir", DIR],
    "describe": ["describe", "j-1", "--data-dir", DIR],
    "logs": ["logs", "j-1", "--data-dir", DIR],
    "cancel": ["cancel", "j-1", "--data-dir", DIR],
    "top": ["top", "--iterations", "1", "--json", "--data-dir", DIR],
    "dashboard": ["dashboard", "--data-dir", DIR],
    "user ls": ["user", "ls", "--data-dir", DIR],
    "teams": ["teams", "--data-dir", DIR],
}
"""Each job command, as run against ``DIR`` (where no server runs)."""


def loaded_by(argv: list[str], data_dir: Path) -> tuple[int, list[str], str]:
    """Run ``pollux ARGV`` (``DIR`` in it: ``data_dir``) in a fresh interpreter: its exit
    status, the modules of HEAVY it loaded, and its stderr."""
    code = ("import json, sys\nfrom pollux.cli.main import main\n"
            "try:\n    status = main(sys.argv[1:])\n"
            "except SystemExit as exc:\n    status = exc.code\n"
            f"heavy = {HEAVY!r}\n"
            "bad = sorted(m for m in sys.modules "
            "if any(m == h or m.startswith(h + '.') for h in heavy))\n"
            "print(json.dumps([status, bad]))\n")
    argv = [str(data_dir) if word == DIR else word for word in argv]
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin",
                                                     "HOME": str(data_dir),
                                                     "PYTHONPATH": str(Path(
                                                         pollux.__file__).parents[1])})
    status, bad = json.loads(out.stdout.strip().splitlines()[-1])
    return status, bad, out.stderr


@pytest.mark.parametrize("command", sorted(JOB_COMMANDS))
def test_a_job_command_loads_no_server(command: str, tmp_path: Path) -> None:
    status, bad, err = loaded_by(JOB_COMMANDS[command], tmp_path / "no-server")
    assert status == 1 and "no server found" in err, err  # it went all the way
    assert not bad, f"pollux {command} loads {', '.join(bad)}"


def test_job_command_help_loads_neither_client_nor_rich(tmp_path: Path) -> None:
    code = ("import sys\nfrom pollux.cli.main import main\n"
            "try:\n    main(['ls', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('httpx', 'httpcore', 'rich', 'yaml') or m.startswith('pollux.client')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "usage: pollux ls" in out
    assert out.strip().splitlines()[-1] == "[]"


def test_the_check_sees_a_command_that_loads_the_server(tmp_path: Path) -> None:
    status, bad, _ = loaded_by(["server", "--help"], tmp_path)
    assert status == 0 and "pollux.service.server" in bad and "numpy" in bad


def test_the_client_package_imports_only_the_layout_and_the_wire_contracts() -> None:
    allowed = {"pollux.client", "pollux.data_dir", "pollux.errors", "pollux.server_proof",
               "pollux.tokens", "pollux.unix_socket"}
    for path in (Path(pollux.__file__).parent / "client").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith("pollux"):
                    assert any(name == a or name.startswith(a + ".") for a in allowed), (
                        f"{path.name} imports {name}")


def test_every_command_is_listed_with_the_module_that_registers_it() -> None:
    registered: dict[str, str] = {}
    for module in COMMAND_MODULES:
        parser = build_parser(next(c for c, m in COMMANDS.items() if m == module))
        choices = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
        registered.update(dict.fromkeys(choices, module))
    assert registered == dict(COMMANDS)
    full = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(full) == list(COMMANDS)  # `pollux --help` lists them in this order


@pytest.mark.parametrize(("argv", "command"), [
    (["ls", "--json"], "ls"), (["-v", "-v", "top"], "top"), (["--verbose", "logs", "x"], "logs"),
    (["--version"], None), ([], None), (["--", "ls"], None), (["lss"], "lss")])
def test_the_command_word_is_found_past_the_top_level_options(argv: list[str],
                                                               command: str | None) -> None:
    assert command_of(argv) == command


def test_an_unknown_command_still_lists_every_choice(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    from pollux.cli.main import main

    with pytest.raises(SystemExit):
        main(["lss"])
    err = capsys.readouterr().err
    assert "invalid choice: 'lss'" in err and all(name in err for name in COMMANDS)


LAYOUT_NAMES = ("server.json", "server.sock", "server.lock", "pollux.db", ".pollux",
                "POLLUX_DATA_DIR")
REPLICA_LOG = re.compile(r"replica-\{[^}]*\}\.log['\"]")


def _strings(tree: ast.AST) -> list[ast.expr]:
    """String constants and f-strings of ``tree``, documentation (a string standing as
    a statement) left out."""
    nodes = list(ast.walk(tree))
    documentation = {id(node.value) for node in nodes if isinstance(node, ast.Expr)}
    return [node for node in nodes
            if isinstance(node, ast.JoinedStr)
            or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in documentation)]


def test_the_data_directory_layout_has_one_home() -> None:
    package = Path(pollux.__file__).parent
    homes: list[str] = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "data_dir.py":
            continue
        for node in _strings(ast.parse(path.read_text())):
            parts = ([node.value] if isinstance(node, ast.Constant) else
                     [v.value for v in node.values if isinstance(v, ast.Constant)])
            words = {w for part in parts for w in re.split(r"[/\s]+", str(part))}
            text = ast.unparse(node)
            if words & set(LAYOUT_NAMES) or REPLICA_LOG.search(text):
                homes.append(f"{path.relative_to(package)}:{node.lineno}: {text}")
    assert not homes, "data directory names outside pollux.data_dir:\n" + "\n".join(homes)
