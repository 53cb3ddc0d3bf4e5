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
