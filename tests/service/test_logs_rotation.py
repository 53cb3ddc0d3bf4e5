"""``pollux logs -f`` across a log's rotation: the service's ``read_log`` on a real
:class:`~pollux.backends.replica_log.BoundedLog`, written between the follower's reads.

Before, a follower whose log rotated away read on from its old offset in the new part
(clamped to its end), so it lost the end of the old part and the start of the new one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest

from pollux.backends.replica_log import BoundedLog
from pollux.cli import jobs as cli_jobs
from pollux.data_dir import ROTATED_LOG_SUFFIX, log_dir, replica_log
from pollux.errors import ServiceError, UnknownJobError

SPEC = {"name": "flood", "command": ["python", "train.py"], "working_dir": "/tmp"}
BUDGET = 64 << 10  # the smallest: each part holds 32 KiB


class FollowedLog:
    """A client whose every read first lets the job write its next burst of lines."""

    def __init__(self, service: Any, job_id: str, bursts: list[int]) -> None:
        self.service, self.job_id, self.bursts = service, job_id, list(bursts)
        path = replica_log(log_dir(service.data_dir, job_id), 0)
        path.parent.mkdir(parents=True)
        self.log = BoundedLog(str(path), BUDGET)
        self.written: list[str] = []

    def __enter__(self) -> FollowedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.log.close()

    def _burst(self) -> None:
        if self.bursts:
            for _ in range(self.bursts.pop(0)):
                line = f"line {len(self.written):06d}\n"
                self.written.append(line)
                self.log.write(line.encode())
            if not self.bursts:
                self.service.cancel(self.job_id)  # the job ends: the follower stops
                self.service.allocator.tick()

    def logs(self, job: str, replica: int = 0, offset: int = 0, limit: int = 65536,
             rotated: bool = False) -> dict[str, Any]:
        if not rotated:
            self._burst()
        try:
            return dict(self.service.read_log(job, replica, offset, limit, rotated))
        except UnknownJobError as exc:
            raise ServiceError(404, str(exc)) from None

    def job(self, job: str) -> dict[str, Any]:
        return {"state": self.service.store.find_job(job).state.value}


@pytest.fixture
def follow(service: Any, monkeypatch: pytest.MonkeyPatch
           ) -> Callable[[list[int]], FollowedLog]:
    def run(bursts: list[int]) -> FollowedLog:
        job_id = service.submit(SPEC)["id"]
        followed = FollowedLog(service, job_id, bursts)
        monkeypatch.setattr(cli_jobs, "connect", lambda args: followed)
        args = argparse.Namespace(job=job_id, replica=0, follow=True, tail=None,
                                  poll_interval=0.0)
        assert cli_jobs.logs(args) == 0
        return followed

    return run


def test_a_follower_sees_every_line_in_order_across_rotations(follow, capsys):
    # 2,730 lines of 12 bytes fill a part: each burst is shorter, so the log rotates at
    # most once between two reads, with the follower up to 2,700 lines behind
    followed = follow([10, 2000, 1500, 2500, 100, 2600, 2000, 2700, 20])
    out = capsys.readouterr()
    assert followed.log.num_rotations == 4
    shown = [line for line in out.out.splitlines(keepends=True) if line.startswith("line ")]
    assert shown == followed.written  # every line once, in order
    assert out.err == ""


def test_a_follower_says_so_when_it_fell_two_rotations_behind(follow, capsys):
    followed = follow([10, 6000, 10])  # 72 kB in one burst: the part it read is gone
    out = capsys.readouterr()
    assert followed.log.num_rotations >= 2
    assert "rotated twice between two reads" in out.err
    shown = [line for line in out.out.splitlines(keepends=True) if line.startswith("line ")]
    assert shown[:10] == followed.written[:10] and shown[-10:] == followed.written[-10:]
    assert shown == sorted(set(shown))  # nothing twice, nothing out of order


def test_the_older_part_is_read_by_name(service):
    job_id = service.submit(SPEC)["id"]
    path = replica_log(log_dir(service.data_dir, job_id), 0)
    path.parent.mkdir(parents=True)
    path.write_text("new\n")
    with pytest.raises(UnknownJobError, match="no rotated log"):
        service.read_log(job_id, 0, 0, 100, rotated=True)
    path.with_name(path.name + ROTATED_LOG_SUFFIX).write_text("old\n")
    older = service.read_log(job_id, 0, 0, 100, rotated=True)
    current = service.read_log(job_id, 0, 0, 100)
    assert (older["text"], current["text"]) == ("old\n", "new\n")
    assert older["part"] != current["part"]


def test_the_rotated_suffix_is_the_logs_own():
    from pollux.backends import replica_log as bounded

    assert bounded.ROTATED_SUFFIX == ROTATED_LOG_SUFFIX
