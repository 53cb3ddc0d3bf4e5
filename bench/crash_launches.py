"""SIGKILLs of a real ``pollux server`` at random instants during two-replica launches
(issue 30, item 1): does any job that exited 0 run again?

For each source tree given (``--src NAME=PATH``: e.g. the code before the change from a
``git worktree``, and this checkout's ``src``), runs ``--jobs`` two-replica jobs on the
local backend (2 virtual nodes x 2 CPU slots: two jobs at a time) and SIGKILLs the server
``--kills`` times at random instants (seeded pauses in [0, ``--max-pause-s``) from each
start), restarting it on the same data directory each time. Each job counts its own runs
(:mod:`tests.service.crash_harness`): a job ran in a launch when both replicas ran to
their end. Prints, per tree, jobs Succeeded, jobs that ran once and twice, jobs
relaunched after a partial start (legitimate: a launch interrupted before both replicas
started), and replicas left running. Run from the repository root:

    git worktree add /tmp/old <base commit>
    nice -n 10 python bench/crash_launches.py --src old=/tmp/old/src --src new=src

``--backend slurm`` runs the same on a real Slurm started for the run (slurmctld and two
slurmd of tests/backends/slurm/cluster.py; needs slurm-wlm and munge).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.service.crash_harness import run_crashes  # noqa: E402
from tests.service.e2e_helpers import ServerProcess, instance_id  # noqa: E402

from pollux.backends.local import MARKER_ENV  # noqa: E402
from pollux.backends.processes import marked_processes  # noqa: E402


def local_server(data_dir: Path, src: Path) -> ServerProcess:
    return ServerProcess(data_dir, interval_s=0.5,
                         extra_env={"PYTHONPATH": str(src.resolve())})


def slurm_server(data_dir: Path, src: Path, conf: Path) -> ServerProcess:
    server = ServerProcess(data_dir, extra_env={"PYTHONPATH": str(src.resolve()),
                                                "SLURM_CONF": str(conf)})
    server.args = [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir",
                   str(data_dir), "--port", "0", "--backend", "slurm", "--interval", "0.5",
                   "--policy", "tests.service.service_test_policies:EqualSharePolicy",
                   "--stop-grace", "30"]
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--max-pause-s", type=float, default=2.0)
    parser.add_argument("--work-s", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("local", "slurm"), default="local")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    cluster = None
    if args.backend == "slurm":
        from tests.backends.slurm.cluster import SlurmCluster, why_unavailable
        reason = why_unavailable()
        if reason is not None:
            sys.exit(f"no Slurm here: {reason}")
        slurm_root = Path(tempfile.mkdtemp(prefix="pollux-slurm-bench-"))
        slurm_root.chmod(0o755)
        cluster = SlurmCluster(slurm_root).start()
    results = {}
    try:
        for item in args.src:
            name, _, path = item.partition("=")
            workdir = Path(tempfile.mkdtemp(prefix=f"pollux-crash-{name}-"))
            data_dir = workdir / "data"
            server = (local_server(data_dir, Path(path)) if cluster is None
                      else slurm_server(data_dir, Path(path), cluster.conf))
            try:
                report = run_crashes(
                    server, workdir, args.jobs, args.kills, args.seed, args.max_pause_s,
                    work_s=args.work_s, timeout_s=3600.0,
                    resources=None if cluster is None else {"gpu": 1},
                    left_running=(lambda d=data_dir: marked_processes(
                        MARKER_ENV, str(instance_id(d)))) if cluster is None
                    else cluster.live_jobs)
                results[name] = report.summary()
            except AssertionError as exc:  # e.g. a job never ended
                results[name] = {"error": str(exc)[:500]}
            finally:
                server.cleanup()
                if cluster is not None:
                    cluster.reset()
            print(name, json.dumps(results[name]), flush=True)
            shutil.rmtree(workdir, ignore_errors=True)
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
