"""Job commands: ``pollux submit``, ``ls``, ``describe``, ``logs``, ``cancel``, ``top``.

They talk to a running ``pollux server`` (found with ``--server URL``, ``$POLLUX_SERVER``
or the server file in ``--data-dir``) through :mod:`pollux.client`. Their flags are in
:mod:`pollux.cli.job_parsers`, which imports this module only when a command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table

from pollux.cli.job_tables import (
    FINAL_STATES,
    cluster_line,
    failures_text,
    jobs_table,
    nodes_table,
)
from pollux.cli.output import EventFeed, is_terminal, make_console
from pollux.client import PolluxClient, locate_server
from pollux.errors import ConfigError, JobSpecError, ServiceError
from pollux.tokens import argv_token_refused


def connect(args: argparse.Namespace) -> PolluxClient:
    if args.token is not None:
        raise argv_token_refused()
    return PolluxClient(locate_server(args.server, args.data_dir, args.token, args.token_file))


# --- submit ---------------------------------------------------------------------------

def spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The job spec from a YAML file and/or flags (flags win), checked locally."""
    from pollux.job_spec import JobSpec  # with yaml: only submit pays for it

    words = list(args.spec_or_command)
    data: dict[str, Any] = {}
    if len(words) == 1 and words[0].endswith((".yaml", ".yml")) and Path(words[0]).is_file():
        path = Path(words[0]).resolve()
        data = _yaml_mapping(path)
        if "working_dir" in data and isinstance(data["working_dir"], str):
            data["working_dir"] = str((path.parent / data["working_dir"]).resolve())
    elif words:
        data["command"] = words
    overrides = {"name": args.name, "min_replicas": args.min_replicas,
                 "max_replicas": args.max_replicas, "restart_delay_s": args.restart_delay,
                 "max_failures": args.max_failures, "preemptible": args.preemptible,
                 "priority": args.priority}
    data.update({k: v for k, v in overrides.items() if v is not None})
    if args.workdir is not None:
        data["working_dir"] = str(Path(args.workdir).resolve())
    data.setdefault("working_dir", os.getcwd())
    if args.name is None and "name" not in data and isinstance(data.get("command"), list):
        data["name"] = default_name(data["command"])
    resources = dict(data.get("resources") or {})
    for key, value in (("gpu", args.gpu), ("cpu", args.cpu), ("memory", args.memory)):
        if value is not None:
            resources[key] = value
    if resources:
        data["resources"] = resources
    env = dict(data.get("env") or {})
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise JobSpecError("env", item, "write --env NAME=VALUE")
        env[key] = value
    if env:
        data["env"] = env
    return JobSpec.from_dict(data).to_dict()


def default_name(command: list[str]) -> str:
    """A job name from its command: the first ``*.py`` script, else the program."""
    scripts = [word for word in command[1:] if word.endswith(".py")]
    stem = Path(scripts[0] if scripts else command[0]).stem
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in stem).lstrip("-_.")
    return name[:63] or "job"


def _yaml_mapping(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise JobSpecError(str(path), None, f"not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise JobSpecError("spec", type(data).__name__, f"{path} must hold a mapping")
    return data


def submit(args: argparse.Namespace) -> int:
    if not args.spec_or_command:
        args.print_usage(sys.stderr)
        raise ConfigError("submit", None, "give a job YAML file, or a command after --, "
                                          "e.g. pollux submit --max-replicas 4 -- python "
                                          "train.py")
    spec = spec_from_args(args)
    with connect(args) as client:
        job = client.submit(spec, args.team)
    if args.json:
        print(json.dumps(job))
    else:
        print(f"submitted {job['id']}")
    return 0


# --- ls, describe, cancel ---------------------------------------------------------------

def list_jobs(args: argparse.Namespace) -> int:
    finished = 0 if args.active else args.finished
    with connect(args) as client:
        rows = client.jobs(finished)
        line = None if args.json else cluster_line(client.cluster())
        me = client.whoami()["name"] if args.mine else None
    if args.active:
        rows = [r for r in rows if r["state"] not in FINAL_STATES]
    if args.mine:  # the server's own account owns the jobs of no user
        rows = [r for r in rows if r.get("owner") == me]
    if args.team is not None:
        rows = [r for r in rows if r.get("team") == args.team]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        console = make_console()
        console.print(jobs_table(rows))
        if line is not None:
            console.print(line, highlight=False)
    return 0


def describe(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.job(args.job)
    if args.json:
        print(json.dumps(job, indent=2))
        return 0
    console = make_console()
    console.print(jobs_table([job], title=f"job {job['id']}"))
    spec = job["spec"]
    console.print(f"command:     {' '.join(spec['command'])}\nworking dir: "
                  f"{spec['working_dir']}\nreplicas:    {spec['min_replicas']}.."
                  f"{spec['max_replicas']} (preemptible: {spec['preemptible']}"
                  + (f", priority {spec['priority']}" if spec.get("priority") else "") + ")\n"
                  f"allocation:  {', '.join(job['allocation']) or '-'}"
                  + (f" (GPU type {job['gpu_type']})" if job.get("gpu_type") else "") + "\n"
                  f"failures:    {failures_text(job['failures'], spec['max_failures'])}; "
                  f"rescales: {job['rescales']}; launches: {job['launches']}",
                  highlight=False)
    if job.get("reason"):
        console.print(f"reason:      {job['reason']}")
    if job.get("slurm_launches"):
        console.print("slurm jobs:  " + ", ".join(
            f"launch {launch['generation']}: {launch['slurm_job_id']}"
            for launch in job["slurm_launches"]), highlight=False)
    events = Table(title="events")
    events.add_column("time")
    events.add_column("event")
    events.add_column("message")
    for event in job["events"]:
        events.add_row(time.strftime("%H:%M:%S", time.localtime(event["time"])),
                       event["kind"], event["message"])
    console.print(events)
    return 0


def cancel(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.cancel(args.job)
    state = job["state"]
    if job["cancel_requested"] and state not in FINAL_STATES + ("Cancelling",):
        state = "Cancelling (asked the replicas to checkpoint and stop)"
    print(f"{job['id']}: {state}")
    return 0


# --- logs, top ----------------------------------------------------------------------------

def tail_offset(client: PolluxClient, job: str, replica: int, num_lines: int
                ) -> tuple[int, str | None, str]:
    """Where the last ``num_lines`` lines of a log end, the part they are in, and
    those lines: reads backwards in growing chunks until enough line ends are seen (or
    the start)."""
    window = 4096
    while True:
        chunk = client.logs(job, replica, -window, limit=window)
        text, start = chunk["text"], chunk["offset"]
        body = text[:-1] if text.endswith("\n") else text
        if body.count("\n") >= num_lines or start == 0:
            lines = text.splitlines(keepends=True)[-num_lines:] if num_lines else []
            tail = "".join(lines)
            return chunk["next_offset"], chunk.get("part"), tail
        window *= 4


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _finish_rotated(client: PolluxClient, args: argparse.Namespace, part: str,
                    offset: int) -> None:
    """The rest of the part that was followed, from ``offset``, now the log's older part
    (it rotated away between two reads)."""
    while True:
        try:
            chunk = client.logs(args.job, args.replica, offset, rotated=True)
        except ServiceError as exc:
            if exc.status != 404:
                raise
            chunk = None
        if chunk is None or chunk.get("part") != part:
            sys.stderr.write("pollux: the log rotated twice between two reads; some of its "
                             "output is not shown (a shorter --poll-interval follows closer)\n")
            return
        _write(chunk["text"])
        offset = chunk["next_offset"]
        if offset >= chunk["size"]:
            return


def logs(args: argparse.Namespace) -> int:
    if args.tail is not None and args.tail < 0:
        raise ConfigError("--tail", args.tail, "give a number of lines >= 0")
    offset, part = 0, None
    with connect(args) as client:
        first = True
        while True:
            try:
                if first and args.tail is not None:
                    offset, part, text = tail_offset(client, args.job, args.replica, args.tail)
                    _write(text)
                    first = False
                    chunk = None
                else:
                    chunk = client.logs(args.job, args.replica, offset)
            except ServiceError as exc:  # no log yet: the replica has not started
                if not (args.follow and exc.status == 404 and "no log" in str(exc)
                        and client.job(args.job)["state"] not in FINAL_STATES):
                    raise
                time.sleep(args.poll_interval)
                continue
            if chunk is None:
                if not args.follow:
                    return 0
                continue
            first = False
            if part is not None and (chunk.get("part") != part or chunk["offset"] < offset):
                _finish_rotated(client, args, part, offset)  # it rotated since the last read
                offset, part = 0, chunk.get("part")
                continue
            part = chunk.get("part")
            _write(chunk["text"])
            offset = chunk["next_offset"]
            if chunk["next_offset"] < chunk["size"]:
                continue
            if not args.follow or chunk["final"]:
                return 0
            time.sleep(args.poll_interval)


def top(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if args.json:
            return _top_json(client, args)
        if not is_terminal():
            return _top_lines(client, args)
        console = make_console()
        with Live(console=console, auto_refresh=False) as live:
            count = 0
            try:
                while args.iterations is None or count < args.iterations:
                    rows, nodes, health = client.jobs(), client.nodes(), client.health()
                    title = (f"pollux top - {client.address.url} - policy "
                             f"{health['policy']} - {health['rounds']} rounds - "
                             f"{time.strftime('%H:%M:%S')}")
                    line = cluster_line(client.cluster())
                    live.update(Group(jobs_table(rows, title), nodes_table(nodes),
                                      *([] if line is None else [line])), refresh=True)
                    count += 1
                    if args.iterations is None or count < args.iterations:
                        time.sleep(args.refresh)
            except KeyboardInterrupt:
                pass
    return 0


def _top_lines(client: PolluxClient, args: argparse.Namespace) -> int:
    """Not a terminal: the tables once, then every new job event as one line."""
    console = make_console()
    feed = EventFeed()
    rows = client.jobs()
    console.print(jobs_table(rows, f"pollux top - {client.address.url} - "
                                   f"{time.strftime('%H:%M:%S')}"))
    console.print(nodes_table(client.nodes()))
    feed.new_events(client, rows)  # the past is in `pollux describe`
    count = 1
    try:
        while args.iterations is None or count < args.iterations:
            time.sleep(args.refresh)
            for line in feed.new_events(client):
                print(line, flush=True)
            count += 1
    except KeyboardInterrupt:
        pass
    return 0


def _top_json(client: PolluxClient, args: argparse.Namespace) -> int:
    """One JSON object per refresh: {"time", "jobs", "nodes", "cluster"}."""
    count = 0
    try:
        while args.iterations is None or count < args.iterations:
            print(json.dumps({"time": time.time(), "jobs": client.jobs(),
                              "nodes": client.nodes(), "cluster": client.cluster()}),
                  flush=True)
            count += 1
            if args.iterations is None or count < args.iterations:
                time.sleep(args.refresh)
    except KeyboardInterrupt:
        pass
    return 0
