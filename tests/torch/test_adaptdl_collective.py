"""AdaptDL's object collectives and checkpoint states across two replicas (torchrun's
environment, gloo): every replica gets the same reductions, a state's ``sync()`` runs on
both before rank 0's copy is saved, and a restarted pair loads it back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.torch.launcher import REPO, free_port, torchrun_env

WORKER = '''
import json, pickle, sys
from pollux import adaptdl
import pollux.adaptdl.torch

class Seen(adaptdl.checkpoint.State):
    def __init__(self):
        super().__init__("seen")
        self.items = []
    def save(self, f):
        pickle.dump(self.items, f)
    def load(self, f):
        self.items = pickle.load(f)
    def sync(self):  # every replica's items, in rank order (a collective)
        self.items = adaptdl.collective.allreduce([self.items], lambda a, b: a + b)

seen = Seen()  # before init_process_group, as AdaptDL allows
adaptdl.torch.init_process_group("gloo")
rank = adaptdl.env.replica_rank()
restored = adaptdl.checkpoint.load_state(seen)
result = {
    "rank": rank, "replicas": adaptdl.env.num_replicas(), "restored": restored,
    "loaded": seen.items,
    "sum": adaptdl.collective.allreduce(rank + 1),
    "max": adaptdl.collective.allreduce_async(rank * 10, max).result(),
    "dict": adaptdl.collective.allreduce({"r%d" % rank: rank}, lambda a, b: {**a, **b}),
    "broadcast": adaptdl.collective.broadcast("from %d" % rank),
    "gather": adaptdl.collective.allgather(rank),
}
seen.items = ["item of rank %d" % rank]
adaptdl.checkpoint.save_all_states()
print(json.dumps(result), flush=True)
'''


def run_pair(script: Path, checkpoints: Path) -> list[dict[str, object]]:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=torchrun_env(rank, 2, port,
                                               POLLUX_CHECKPOINT_DIR=str(checkpoints),
                                               PYTHONPATH=str(REPO / "src")))
             for rank in range(2)]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    return [json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
            for out in outputs]


def test_collectives_and_states_across_two_replicas_and_a_restart(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    first = run_pair(script, tmp_path / "checkpoints")
    for result in first:
        assert result["replicas"] == 2 and result["restored"] is False
        assert result["sum"] == 3 and result["max"] == 10
        assert result["dict"] == {"r0": 0, "r1": 1}
        assert result["broadcast"] == "from 0" and result["gather"] == [0, 1]
    second = run_pair(script, tmp_path / "checkpoints")  # a restart of the same job
    for result in second:  # both replicas' items, synced before rank 0 saved them
        assert result["restored"] is True
        assert result["loaded"] == [["item of rank 0"], ["item of rank 1"]], result
