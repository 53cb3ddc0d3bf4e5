"""AdaptDL's launch variables beside Pollux's and torchrun's: one order of precedence
(Pollux, torchrun, AdaptDL, a single process), a field taken from the first source that
sets it, and an error naming both variables when two sources disagree; two real
replicas launched with AdaptDL's standalone variables join one job through
``adaptdl.collective.initialize``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pollux.errors import ConfigError
from pollux.jobenv import JobEnvironment
from pollux.torch.launch import LaunchSource, effective_checkpoint_dir, read_launch_environment
from tests.torch.launcher import REPO, free_port
from tests.torch.test_adaptdl_tutorial import clean_env

STANDALONE = {"ADAPTDL_REPLICA_RANK": "1", "ADAPTDL_NUM_REPLICAS": "2",
              "ADAPTDL_NUM_RESTARTS": "3", "ADAPTDL_MASTER_ADDR": "10.0.0.5",
              "ADAPTDL_MASTER_PORT": "47000"}


def test_adaptdls_standalone_launch_is_read() -> None:
    launch = read_launch_environment(STANDALONE)
    assert launch.source is LaunchSource.ADAPTDL
    assert (launch.rank, launch.num_replicas, launch.num_restarts) == (1, 2, 3)
    assert (launch.master_addr, launch.master_port) == ("10.0.0.5", 47000)
    # AdaptDL: one replica per node unless ADAPTDL_NUM_NODES says otherwise
    assert (launch.num_nodes, launch.node_rank, launch.local_rank) == (2, 1, 0)
    packed = read_launch_environment({**STANDALONE, "ADAPTDL_REPLICA_RANK": "3",
                                      "ADAPTDL_NUM_REPLICAS": "4", "ADAPTDL_NUM_NODES": "2"})
    assert (packed.num_nodes, packed.node_rank, packed.local_rank) == (2, 1, 1)


def test_adaptdls_job_id_and_checkpoint_path_fill_what_the_launcher_leaves() -> None:
    alone = read_launch_environment({"ADAPTDL_CHECKPOINT_PATH": "/ck", "ADAPTDL_JOB_ID": "j"})
    assert (alone.source, alone.checkpoint_dir, alone.job_id) == (LaunchSource.SINGLE,
                                                                  "/ck", "j")
    assert effective_checkpoint_dir({"ADAPTDL_CHECKPOINT_PATH": "/ck"}) == "/ck"
    torchrun = read_launch_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "9",
                                        "ADAPTDL_CHECKPOINT_PATH": "/ck"})
    assert (torchrun.source, torchrun.rank, torchrun.checkpoint_dir) == (
        LaunchSource.TORCHRUN, 1, "/ck")
    # a label is the first source's, unchecked
    pollux = JobEnvironment(job_id="p", rank=1, num_replicas=2, master_port=47000).to_env()
    assert read_launch_environment({**pollux, "ADAPTDL_JOB_ID": "j"}).job_id == "p"


def test_agreeing_sources_take_the_first_as_the_launcher() -> None:
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5",
                "MASTER_PORT": "47000"}
    assert read_launch_environment({**torchrun, **STANDALONE, "ADAPTDL_NUM_RESTARTS": "0"}
                                   ).source is LaunchSource.TORCHRUN
    pollux = JobEnvironment(job_id="p", rank=1, num_replicas=2, num_nodes=2,
                            master_addr="10.0.0.5", master_port=47000, num_restarts=3,
                            checkpoint_dir="/ck").to_env()
    launch = read_launch_environment({**pollux, **STANDALONE,
                                      "ADAPTDL_CHECKPOINT_PATH": "/ck"})
    assert (launch.source, launch.rank, launch.num_restarts) == (LaunchSource.POLLUX, 1, 3)


@pytest.mark.parametrize("env, said", [
    ({**STANDALONE, "RANK": "0", "WORLD_SIZE": "4", "MASTER_PORT": "47000",
      "MASTER_ADDR": "10.0.0.5"}, r"RANK=0, ADAPTDL_REPLICA_RANK=1"),
    ({**JobEnvironment(job_id="p", rank=2, num_replicas=4, master_port=1).to_env(),
      "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1"}, r"POLLUX_RANK=2, RANK=0"),
    ({"POLLUX_CHECKPOINT_DIR": "/a", "ADAPTDL_CHECKPOINT_PATH": "/b"},
     r"POLLUX_CHECKPOINT_DIR='/a', ADAPTDL_CHECKPOINT_PATH='/b'"),
])
def test_sources_that_disagree_are_refused_naming_both(env: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigError, match=said + r".*unset the ones"):
        read_launch_environment(env)


def test_bad_adaptdl_variables_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="ADAPTDL_REPLICA_RANK='x'"):
        read_launch_environment({"ADAPTDL_REPLICA_RANK": "x"})
    two = {"ADAPTDL_REPLICA_RANK": "0", "ADAPTDL_NUM_REPLICAS": "2"}
    with pytest.raises(ConfigError, match="ADAPTDL_MASTER_PORT"):
        read_launch_environment(two)
    with pytest.raises(ConfigError, match="pollux submit"):
        read_launch_environment({**two, "ADAPTDL_SUPERVISOR_URL": "http://sup"})
    with pytest.raises(ConfigError, match="rank"):
        read_launch_environment({**STANDALONE, "ADAPTDL_REPLICA_RANK": "2"})


WORKER = '''
import json
from pollux import adaptdl
import pollux.adaptdl.collective
from pollux.adaptdl.default_job import DEFAULT_JOB

adaptdl.collective.initialize()  # arguments from AdaptDL's variables
print(json.dumps({
    "rank": adaptdl.env.replica_rank(), "replicas": adaptdl.env.num_replicas(),
    "restarts": adaptdl.env.num_restarts(), "job": adaptdl.env.get_job_name(),
    "sum": adaptdl.collective.allreduce(adaptdl.env.replica_rank() + 1),
    "source": DEFAULT_JOB.job.launch.source.value,
}), flush=True)
'''


def test_two_replicas_launched_with_adaptdls_variables_form_one_job(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = clean_env()
        env.update(ADAPTDL_MASTER_ADDR="127.0.0.1", ADAPTDL_MASTER_PORT=port,
                   ADAPTDL_NUM_REPLICAS="2", ADAPTDL_REPLICA_RANK=str(rank),
                   ADAPTDL_NUM_RESTARTS="3", ADAPTDL_JOB_ID="mnist",
                   ADAPTDL_CHECKPOINT_PATH=str(tmp_path / "ck"))
        procs.append(subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env,
                                      text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    results = [json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
               for out in outputs]
    for rank, result in enumerate(results):
        assert result == {"rank": rank, "replicas": 2, "restarts": 3, "job": "mnist",
                          "sum": 3, "source": "adaptdl"}, outputs
    assert os.path.isdir(tmp_path / "ck")
