"""Real ``torchrun`` launches, with the flags every multi-node command names (issue #25
item 1): an explicit ``--master-addr/--master-port`` on one node, and two "nodes" on this
machine (two torchrun processes, ``--nnodes 2 --node-rank 0/1``). torchrun's agent hosts
the rendezvous store on that port; the replicas must join it, not bind it again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from pollux.torch.launch import read_launch_environment
from tests.torch.launcher import REPO, WORKERS, free_port

SCRIPT = WORKERS / "torchrun_job.py"


def torchrun_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("POLLUX_", "TORCHELASTIC_")) and key not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "MASTER_ADDR", "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
    return env


def torchrun(*flags: str, checkpoint_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *flags, str(SCRIPT),
         "--checkpoint-dir", str(checkpoint_dir)],
        env=torchrun_env(), cwd=checkpoint_dir, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


RESULT = re.compile(r'\{[^{}]*"world"[^{}]*\}')
"""A rank's result object. The ranks share one pipe and ``print`` writes the text and
its newline separately, so two results can land on one line: found by pattern, not by
line (a CI run saw ``{...rank 0...}{...rank 1...}``)."""


def results(output: str) -> list[dict[str, object]]:
    return [json.loads(match) for match in RESULT.findall(output)]


def test_torchruns_store_is_joined_not_served_again() -> None:
    launch = read_launch_environment({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500",
                                      "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert launch.launcher_store
    assert not read_launch_environment({"RANK": "0", "WORLD_SIZE": "2",
                                        "MASTER_PORT": "29500"}).launcher_store


def test_one_node_with_an_explicit_master_addr_and_port(tmp_path: Path) -> None:
    port = str(free_port())
    proc = torchrun("--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                    port, checkpoint_dir=tmp_path)
    output = proc.communicate(timeout=90)[0]
    assert proc.returncode == 0, output
    found = results(output)
    assert sorted(int(r["rank"]) for r in found) == [0, 1], output  # type: ignore[call-overload]
    assert {r["world"] for r in found} == {2}
    assert len({r["weights"] for r in found}) == 1  # the replicas trained in step


def test_two_nodes_on_this_machine(tmp_path: Path) -> None:
    port = str(free_port())
    common = ("--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", port)
    nodes = [torchrun(*common, "--node-rank", str(rank), checkpoint_dir=tmp_path)
             for rank in (0, 1)]
    outputs = [node.communicate(timeout=90)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)
    found = [r for output in outputs for r in results(output)]
    assert sorted(int(r["rank"]) for r in found) == [0, 1]  # type: ignore[call-overload]
    assert {(r["world"], r["nodes"]) for r in found} == {(2, 2)}
    assert len({r["weights"] for r in found}) == 1
