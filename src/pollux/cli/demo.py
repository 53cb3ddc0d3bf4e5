"""``pollux demo``: a throw-away local Pollux server running real elastic jobs.

It starts ``pollux server`` on a temporary data directory (2 virtual nodes x 2 slots by
default), submits the digits example (examples/train_digits.py, which uses the agent)
three times at staggered moments, shows the jobs being scheduled and resized live, and
ends with a summary: launches, rescales and replica counts of each job, its duration and
final accuracy. About 1-2 minutes on a CPU. On a terminal the view is live; piped, it
prints one line per job event (``--json``: the summary as JSON on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table

import pollux
from pollux.cli.job_tables import FINAL_STATES, jobs_table, nodes_table
from pollux.cli.output import EventFeed, is_terminal, make_console
from pollux.client import PolluxClient, server_address
from pollux.data_dir import SERVER_FILE, log_dir, replica_log
from pollux.errors import ConfigError
from pollux.tokens import TOKEN_ENV

LAUNCH_PATTERN = re.compile(r"launch \d+: (\d+) replicas?")


@dataclass(frozen=True)
class DemoJob:
    name: str
    submit_after_s: float
    max_replicas: int
    epochs: int


DEMO_JOBS = (DemoJob("digits-a", 0.0, 4, 24), DemoJob("digits-b", 20.0, 3, 14),
             DemoJob("digits-c", 40.0, 2, 8))


def example_script() -> Path:
    return Path(pollux.__file__).resolve().parents[2] / "examples" / "train_digits.py"


def job_spec(job: DemoJob, script: Path) -> dict[str, Any]:
    return {"name": job.name, "working_dir": str(script.parent), "max_replicas":
            job.max_replicas, "restart_delay_s": 10.0,
            "command": [sys.executable, str(script), "--epochs", str(job.epochs),
                        "--max-batch-size", "128", "--step-delay-s", "0.04",
                        "--checkpoint-interval-s", "5", "--quiet"]}


def server_command(args: argparse.Namespace, data_dir: Path) -> list[str]:
    """The demo server's command line: ``--nodes x --slots-per-node`` virtual nodes, or
    the typed ones of ``--virtual-nodes``."""
    nodes = (["--virtual-nodes", args.virtual_nodes] if args.virtual_nodes else
             ["--nodes", str(args.nodes), "--slots-per-node", str(args.slots_per_node)])
    return [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir", str(data_dir),
            "--port", "0", *nodes, "--device", args.device, "--policy", args.policy,
            "--interval", str(args.interval), "--stop-grace", "30"]


def server_environment() -> dict[str, str]:
    """The demo server's environment: this one without ``$POLLUX_TOKEN`` (a token the
    user exported for another server; the demo's server generates its own)."""
    return {name: value for name, value in os.environ.items() if name != TOKEN_ENV}


def start_server(args: argparse.Namespace, data_dir: Path) -> tuple[subprocess.Popen[bytes],
                                                                    PolluxClient]:
    command = server_command(args, data_dir)
    log = open(data_dir.parent / "server.log", "wb")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True,
                               env=server_environment())
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError("server", (data_dir.parent / "server.log").read_text()[-500:],
                              "the demo server did not start")
        try:
            record = json.loads((data_dir / SERVER_FILE).read_text())
            if record.get("pid") == process.pid:
                return process, PolluxClient(server_address(record))
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    process.kill()
    raise ConfigError("server", None, "the demo server did not start within 60 s")


def replica_history(job: dict[str, Any]) -> str:
    counts = [m.group(1) for e in job["events"] if (m := LAUNCH_PATTERN.search(e["message"]))]
    return " -> ".join(counts) or "-"


def final_accuracy(data_dir: Path, job_id: str) -> str:
    log = replica_log(log_dir(data_dir, job_id), 0)
    if not log.exists():
        return "-"
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{") and "accuracy" in line:
            try:
                return f"{json.loads(line)['accuracy']:.3f}"
            except (ValueError, KeyError):
                return "-"
    return "-"


def summary_rows(client: PolluxClient, data_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for row in client.jobs():
        job = client.job(row["id"])
        end = job["finished_at"] or time.time()
        rows.append({"job": job["id"], "state": job["state"],
                     "replicas_per_launch": replica_history(job),
                     "rescales": job["rescales"], "failures": job["failures"],
                     "duration_s": round(end - job["submitted_at"], 1),
                     "accuracy": final_accuracy(data_dir, job["id"])})
    return rows


def summary_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="pollux demo: summary")
    for column in ("job", "state", "replicas per launch", "rescales", "failures",
                   "duration", "accuracy"):
        table.add_column(column, justify="left" if column in ("job", "state") else "right")
    for row in rows:
        table.add_row(row["job"], row["state"], row["replicas_per_launch"],
                      str(row["rescales"]), str(row["failures"]), f"{row['duration_s']:.0f}s",
                      row["accuracy"])
    return table


def recent_events(client: PolluxClient, limit: int = 8) -> Table:
    events = []
    for row in client.jobs():
        for event in client.job(row["id"])["events"]:
            events.append((event["time"], row["id"], event["message"]))
    table = Table(title="recent events", show_header=False, box=None)
    for when, job_id, message in sorted(events)[-limit:]:
        table.add_row(time.strftime("%H:%M:%S", time.localtime(when)), job_id, message)
    return table


def run(args: argparse.Namespace) -> int:
    console = make_console()

    def say(line: str) -> None:  # progress: stderr with --json, so stdout stays JSON
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    script = Path(args.script) if args.script else example_script()
    if not script.is_file():
        raise ConfigError("script", str(script), "the demo runs examples/train_digits.py "
                                                 "from a source checkout; pass --script PATH")
    if importlib.util.find_spec("torch") is None:
        raise ConfigError("torch", None, "the demo jobs need PyTorch: "
                                         "pip install -e '.[torch]'")
    workdir = Path(tempfile.mkdtemp(prefix="pollux-demo-"))
    data_dir = workdir / "data"
    where = (f"typed virtual nodes {args.virtual_nodes}" if args.virtual_nodes else
             f"{args.nodes} virtual nodes x {args.slots_per_node} slots")
    say(f"pollux demo: server on {where}, policy {args.policy}, data in {workdir}")
    process, client = start_server(args, data_dir)
    start = time.monotonic()
    jobs = DEMO_JOBS[: args.jobs]
    pending = list(jobs)
    live_view = is_terminal() and not args.json
    feed = EventFeed()
    try:
        with (Live(console=console, auto_refresh=False) if live_view
              else contextlib.nullcontext()) as live:
            while True:
                elapsed = time.monotonic() - start
                while pending and elapsed >= pending[0].submit_after_s * args.stagger:
                    client.submit(job_spec(pending.pop(0), script))
                rows = client.jobs()
                if live is not None:
                    title = f"pollux demo - {elapsed:.0f}s - policy {args.policy}"
                    live.update(Group(jobs_table(rows, title), nodes_table(client.nodes()),
                                      recent_events(client)), refresh=True)
                else:
                    for line in feed.new_events(client, rows):
                        say(line)
                if not pending and rows and all(r["state"] in FINAL_STATES for r in rows):
                    break
                if elapsed > args.timeout:
                    say(f"demo timeout ({args.timeout:.0f} s): cancelling the rest")
                    for row in rows:
                        if row["state"] not in FINAL_STATES:
                            client.cancel(row["id"])
                    args.timeout = float("inf")
                time.sleep(1.0)
        summary = summary_rows(client, data_dir)
        if args.json:
            print(json.dumps({"summary": summary}), flush=True)
        else:
            console.print(summary_table(summary))
        states = {row["state"] for row in summary}
    except KeyboardInterrupt:
        say("interrupted")
        states = {"Cancelled"}
    finally:
        client.close()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        if args.keep:
            say(f"kept {workdir} (server log, job store, checkpoints, logs)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    say(f"done in {time.monotonic() - start:.0f}s")
    return 0 if states == {"Succeeded"} else 1


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="run real elastic jobs on a throw-away "
                                                "local server", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="pollux", help="policy (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=2, help="virtual nodes (default: 2)")
    parser.add_argument("--slots-per-node", type=int, default=2,
                        help="slots per virtual node (default: 2)")
    parser.add_argument("--virtual-nodes", default=None, metavar="SPEC",
                        help="typed virtual nodes instead, e.g. a:2x1,b:1x2 (GPU types; "
                             "each job then runs within one type)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu", "auto"),
                        help="slots are CPU slots (default) or GPUs (nodes x slots GPUs)")
    parser.add_argument("--interval", type=float, default=3.0,
                        help="seconds between scheduling rounds (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=len(DEMO_JOBS), choices=range(1, 4),
                        help="how many example jobs to submit (default: 3)")
    parser.add_argument("--stagger", type=float, default=1.0,
                        help="scale of the delays between submissions (default: 1)")
    parser.add_argument("--timeout", type=float, default=420.0,
                        help="cancel what still runs after this many seconds "
                             "(default: %(default)s)")
    parser.add_argument("--script", default=None, help="training script (default: "
                                                       "examples/train_digits.py)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON on stdout (progress on stderr)")
    parser.set_defaults(func=run)
