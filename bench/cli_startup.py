"""How long the job commands take to start: ``pollux ls --help``, and ``pollux ls``
against a running server holding 100 jobs, for this code and for the code before.

Starts a real ``pollux server`` (this code; local backend, 1 node x 1 CPU slot, FIFO,
rounds every 60 s, so that it sits still while measured) in a scratch data directory,
submits 100 jobs that sleep (1 runs, 99 wait), then runs each command ``--repeat`` times
(default 5) in a fresh interpreter, as the ``pollux`` script does, with ``PYTHONPATH``
on this code's ``src`` and on the ``src`` of ``--before`` (a checkout of the code
before, e.g. ``git worktree add /tmp/cli-before 9befc8b``). Both talk to the same
server. Prints the median (and min..max) wall time of each and their ratio, the median
CPU time (user + system) of the command's process, which a busy machine inflates less,
and the machine's load (``os.getloadavg``) before and after: the wall figures are only
as quiet as the machine.

    python bench/cli_startup.py --before /tmp/cli-before
    python bench/cli_startup.py --before /tmp/cli-before --repeat 9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
POLLUX = "import sys; from pollux.cli.main import main; sys.exit(main())"
"""What the ``pollux`` console script runs."""
TARGETS_S = {"ls --help": 0.3, "ls": 0.4}


def pollux(src: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    env.pop("POLLUX_SERVER", None)
    env.pop("POLLUX_TOKEN", None)
    return subprocess.run([sys.executable, "-c", POLLUX, *argv], env=env,
                          capture_output=True, text=True, check=False)


def start_server(data_dir: Path) -> subprocess.Popen[bytes]:
    log = open(data_dir.parent / "server.log", "wb")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        [sys.executable, "-c", POLLUX, "server", "--data-dir", str(data_dir), "--port", "0",
         "--nodes", "1", "--slots-per-node", "1", "--device", "cpu", "--policy", "fifo",
         "--interval", "60", "--stop-grace", "2"],
        env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit((data_dir.parent / "server.log").read_text()[-2000:])
        try:
            if json.loads((data_dir / "server.json").read_text()).get("pid") == process.pid:
                return process
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    process.kill()
    sys.exit("the server did not start within 120 s")


def submit_jobs(data_dir: Path, num_jobs: int, workdir: Path) -> None:
    sys.path.insert(0, str(SRC))
    from pollux.client import PolluxClient, locate_server

    spec = {"command": ["sleep", "3600"], "working_dir": str(workdir), "max_replicas": 1}
    with PolluxClient(locate_server(data_dir=data_dir)) as client:
        for i in range(num_jobs):
            client.submit({**spec, "name": f"sleeper{i}"})
        assert len(client.jobs()) == num_jobs


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timings(src: Path, argv: list[str], repeat: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system, of the command's process) of each
    run."""
    pollux(src, *argv)  # warm the file cache: every run then reads the same
    wall, cpu = [], []
    for _ in range(repeat):
        cpu_before, start = _children_cpu_s(), time.perf_counter()
        done = pollux(src, *argv)
        wall.append(time.perf_counter() - start)
        cpu.append(_children_cpu_s() - cpu_before)
        if done.returncode != 0:
            sys.exit(f"pollux {' '.join(argv)} ({src}) failed: {done.stderr[-2000:]}")
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True,
                        help="checkout of the code before (its src/ is used)")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    before_src = args.before / "src"
    if not (before_src / "pollux").is_dir():
        sys.exit(f"{before_src} holds no pollux package")

    scratch = Path(tempfile.mkdtemp(prefix="pollux-cli-startup-"))
    data_dir = scratch / "data"
    server = start_server(data_dir)
    results: dict[str, Any] = {"load_before": os.getloadavg(), "repeat": args.repeat,
                               "jobs": args.jobs, "cpus": os.cpu_count()}
    try:
        submit_jobs(data_dir, args.jobs, scratch)
        rows = json.loads(pollux(SRC, "ls", "--json", "--data-dir", str(data_dir)).stdout)
        assert len(rows) == args.jobs, len(rows)
        print(f"server with {len(rows)} jobs; load {results['load_before']}; "
              f"{args.repeat} runs each (median, min..max)")
        for name, argv in (("ls --help", ["ls", "--help"]),
                           ("ls", ["ls", "--data-dir", str(data_dir)])):
            before, before_cpu = timings(before_src, argv, args.repeat)
            after, after_cpu = timings(SRC, argv, args.repeat)
            results[name] = {"before_s": before, "after_s": after,
                             "before_cpu_s": before_cpu, "after_cpu_s": after_cpu}
            b, a = statistics.median(before), statistics.median(after)
            verdict = "meets" if a <= TARGETS_S[name] else "misses"
            print(f"pollux {name:10s} before {b:6.3f} s ({min(before):.3f}..{max(before):.3f})"
                  f"   after {a:6.3f} s ({min(after):.3f}..{max(after):.3f})"
                  f"   {b / a:5.1f}x faster; {verdict} the {TARGETS_S[name]} s target",
                  flush=True)
            bc, ac = statistics.median(before_cpu), statistics.median(after_cpu)
            print(f"{'':17s} CPU    {bc:6.3f} s{'':17s}CPU   {ac:6.3f} s{'':17s}"
                  f"{bc / ac:5.1f}x less", flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    print(f"load after: {results['load_after']}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
