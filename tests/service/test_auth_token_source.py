"""Issue 23, defect 1: the server token never appears in a process's argv (``ps``), in
an environment another user or a job can read, or in a group/world-readable file."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pollux.cli.main import main
from pollux.cli.server import add_server_arguments, config_from_args
from pollux.client import PolluxClient
from pollux.errors import ConfigError
from tests.service.e2e_helpers import ServerProcess, wait_until

SECRET = "s3cret-token-in-argv-0123456789"


def server_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_server_refuses_a_token_on_its_command_line(tmp_path, capsys):
    with pytest.raises(ConfigError) as info:
        config_from_args(server_args("--data-dir", str(tmp_path), "--token", SECRET))
    message = str(info.value)
    assert "--token-file" in message and "POLLUX_TOKEN" in message
    assert SECRET not in message  # the refusal does not print it again
    assert main(["server", "--data-dir", str(tmp_path), "--token", SECRET]) == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and SECRET not in err
    assert not (tmp_path / "server.json").exists()


def test_the_cli_refuses_a_token_on_its_command_line(tmp_path, capsys):
    assert main(["ls", "--data-dir", str(tmp_path), "--token", SECRET]) == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and "POLLUX_TOKEN" in err and SECRET not in err


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_token_file_others_can_read_is_refused(tmp_path, mode):
    path = tmp_path / "token"
    path.write_text(SECRET + "\n")
    path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        config_from_args(server_args("--data-dir", str(tmp_path / "d"), "--token-file",
                                     str(path)))
    assert f"chmod 600 {path}" in str(info.value)
    path.chmod(0o600)
    config = config_from_args(server_args("--data-dir", str(tmp_path / "d"), "--token-file",
                                          str(path)))
    assert config.http.token == SECRET


def test_the_token_from_the_environment_is_taken_out_of_it(tmp_path, monkeypatch):
    """Whatever the server starts later (replicas, a local Ray) cannot inherit it."""
    monkeypatch.setenv("POLLUX_TOKEN", SECRET)
    config = config_from_args(server_args("--data-dir", str(tmp_path)))
    assert config.http.token == SECRET
    assert "POLLUX_TOKEN" not in os.environ


def test_no_process_shows_the_token_and_no_replica_inherits_it(tmp_path):
    """A live server given its token in $POLLUX_TOKEN: not in its own argv nor in its
    environment, and the job's replica sees only its own hints token."""
    process = ServerProcess(tmp_path / "data", extra_env={"POLLUX_TOKEN": SECRET})
    try:
        started = process.start()
        client = PolluxClient(replace(started.address, token=SECRET))
        process.clients.append(client)
        assert process.process is not None
        proc = Path("/proc") / str(process.process.pid)
        assert SECRET.encode() not in (proc / "cmdline").read_bytes()
        # its initial environment stays in /proc, readable by its owner only
        assert stat.S_IMODE((proc / "environ").stat().st_mode) & 0o077 == 0
        out = tmp_path / "env.txt"
        job = client.submit({"name": "env", "working_dir": str(tmp_path),
                             "command": [sys.executable, "-c",
                                         f"import os; open({str(out)!r}, 'w').write("
                                         "'\\n'.join(f'{k}={v}' for k, v in "
                                         "os.environ.items()))"]})["id"]
        wait_until(lambda: client.job(job)["state"] == "Succeeded", 60, "the job to end")
        env = out.read_text()
        assert SECRET not in env
        assert "POLLUX_HINTS_TOKEN=" in env
    finally:
        process.cleanup()


def test_the_demo_server_does_not_take_the_users_token(monkeypatch):
    """A token exported for a remote server ($POLLUX_TOKEN) is not the demo's: its
    server generates its own, which its client reads from the data directory."""
    from pollux.cli.demo import server_environment

    monkeypatch.setenv("POLLUX_TOKEN", SECRET)
    assert "POLLUX_TOKEN" not in server_environment()
    assert server_environment()["PATH"] == os.environ["PATH"]
