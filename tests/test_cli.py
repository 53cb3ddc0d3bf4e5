from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pollux import __version__
from pollux.cli.main import main
from pollux.errors import ConfigError


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "goodput" in capsys.readouterr().out


def test_goodput_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["goodput", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "converged=True" in out and "speedup" in out


def test_goodput_validates_before_fitting(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import pollux.cli.goodput as goodput_cli

    def no_fit(*args: object) -> None:
        raise AssertionError("fitted before validating")

    monkeypatch.setattr(goodput_cli, "fit_throughput", no_fit)
    assert main(["goodput", "--init-batch-size", "128", "--max-batch-size", "10"]) == 2
    assert "--max-batch-size" in capsys.readouterr().err


def test_goodput_prints_parameters_with_sensible_digits(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["goodput", "--seed", "1"]) == 0
    fitted = next(line for line in capsys.readouterr().out.splitlines() if "fitted:" in line)
    values = [item.split("=")[1] for item in fitted.split("fitted:")[1].split(", ")]
    assert len(values) == 7 and all(len(v.replace(".", "").lstrip("0")) <= 5 for v in values)


def test_workload_generate_to_stdout(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["workload", "generate", "--jobs", "3", "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("name,") and len(
        captured.out.splitlines()) == 4
    assert "to stdout" in captured.err and not (tmp_path / "-").exists()


def test_usage_errors_exit_2_and_runtime_failures_exit_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["ls", "--no-such-flag"])
    assert exc.value.code == 2
    assert main(["simulate", "--policy", "tiresas"]) == 2  # bad input
    assert main(["ls", "--server", "http://127.0.0.1:9"]) == 1  # nothing listens there
    assert "pollux: error:" in capsys.readouterr().err


def test_a_reader_that_stops_early_is_not_an_error(tmp_path) -> None:
    """`pollux workload generate -o - | head -1`: no BrokenPipeError traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src)
    proc = subprocess.Popen([sys.executable, "-m", "pollux.cli.main", "workload", "generate",
                             "--jobs", "20000", "-o", "-"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"name,")
    proc.stdout.close()  # like `head -1`
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 0 and "Traceback" not in err, err


def _server_parser() -> argparse.ArgumentParser:
    from pollux.cli.main import build_parser

    (commands,) = [action for action in build_parser()._actions
                   if isinstance(action, argparse._SubParsersAction)]
    parser: argparse.ArgumentParser = commands.choices["server"]
    return parser


def test_every_server_flag_is_written_once_at_its_config_field() -> None:
    """No flag of ``pollux server`` has a help text (or default) written outside its
    configuration field: every action of the parser is the flag a field declares, with
    that field's exact help and default; every declared flag is in the parser; every
    field of the tree is declared (a section, or an option with its help)."""
    from dataclasses import MISSING, fields

    from pollux.options import default_of, flagged_fields, option_of, section_of
    from pollux.service.config import ServerConfig

    def undeclared(cls: type, path: str = "") -> list[str]:
        found = []
        for item in fields(cls):
            nested = section_of(item)
            if nested is not None:
                found += undeclared(nested[1], f"{path}{item.name}.")
            elif option_of(item) is None or not option_of(item).help:  # type: ignore[union-attr]
                found.append(path + item.name)
        return found

    assert undeclared(ServerConfig) == []
    declared = {option.flag: (item, option) for _, item, option in flagged_fields(ServerConfig)
                if option.flag is not None}
    assert len(declared) == 33
    shown = set()
    for action in _server_parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        (flag,) = action.option_strings
        if action.help == argparse.SUPPRESS:
            assert flag == "--token"  # only there to be refused
            continue
        assert flag in declared, f"{flag} is not declared by a config field"
        item, option = declared[flag]
        assert action.help == option.help, flag
        if default_of(item) is not MISSING:
            assert action.default == default_of(item), (flag, action.default)
        shown.add(flag)
    assert shown == set(declared)
    unflagged = [path for path, _, option in flagged_fields(ServerConfig) if option.flag is None]
    assert unflagged == ["http.token", "loop.poll_interval_s"]


def test_the_server_flags_build_the_config_tree(tmp_path: Path, monkeypatch) -> None:
    """No flag given: the defaults of every section; flags land in their fields."""
    from pollux.backends.ray.options import RayOptions
    from pollux.cli.server import config_from_args
    from pollux.service.config import BackendConfig, ServerConfig, StoreConfig

    monkeypatch.delenv("POLLUX_TOKEN", raising=False)
    parser = _server_parser()
    plain = config_from_args(parser.parse_args(["--data-dir", str(tmp_path / "d")]))
    assert plain == ServerConfig(data_dir=(tmp_path / "d").resolve())
    given = config_from_args(parser.parse_args([
        "--data-dir", str(tmp_path), "--backend", "slurm", "--slurm-nodes", "g[1-2]",
        "--log-budget", "1MiB", "--keep-finished", "5", "--recover", "--port", "0"]))
    assert given.backend.name == "slurm" and given.backend.slurm.nodes == "g[1-2]"
    assert given.backend.log_budget_bytes == 1 << 20 and given.http.port == 0
    assert given.store == StoreConfig(keep_finished=5, recover=True)
    with pytest.raises(ConfigError, match="--ray-autoscale needs --backend ray"):
        BackendConfig(ray=RayOptions(autoscale=True))


def test_policies_are_listed_and_specs_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies", "sia"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sia: ") and "lambda_n = 1.1" in out and "fifo" not in out
    assert main(["simulate", "--list-policies"]) == 0
    assert "pollux-ga: " in capsys.readouterr().out
    assert main(["policies", "siaa"]) == 2
    assert main(["simulate", "--policy", "sia,pollux(nope=1)"]) == 2
    assert "pollux takes: " in capsys.readouterr().err
