from __future__ import annotations

import pytest

from pollux import __version__
from pollux.cli.main import main


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


def test_server_flags_cover_server_config_with_its_defaults(tmp_path) -> None:
    import argparse
    from dataclasses import MISSING, fields

    from pollux.cli.server import CONFIG_FLAGS, NOT_FLAGS, add_server_arguments
    from pollux.service.server import ServerConfig

    names = {f.name for f in fields(ServerConfig)}
    assert set(CONFIG_FLAGS) | set(NOT_FLAGS) == names
    assert not set(CONFIG_FLAGS) & set(NOT_FLAGS)
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    by_flag = {option: action for action in parser._actions
               for option in action.option_strings}
    for name, flag in CONFIG_FLAGS.items():
        assert flag in by_flag, flag
        default = {f.name: f.default for f in fields(ServerConfig)}[name]
        if default is not MISSING:
            assert by_flag[flag].default == default, (flag, by_flag[flag].default, default)


def test_policies_are_listed_and_specs_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies", "sia"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sia: ") and "lambda_n = 1.1" in out and "fifo" not in out
    assert main(["simulate", "--list-policies"]) == 0
    assert "pollux-ga: " in capsys.readouterr().out
    assert main(["policies", "siaa"]) == 2
    assert main(["simulate", "--policy", "sia,pollux(nope=1)"]) == 2
    assert "pollux takes: " in capsys.readouterr().err
