from __future__ import annotations

from pathlib import Path

import pytest

from pollux.errors import WorkloadError
from pollux.sim.job import JobSpec
from pollux.sim.workload import Workload, read_workload, workload_files, write_workload

APPS = ("cifar10", "ncf")
HEADER = "name,time,application,num_replicas,batch_size\n"


def write(tmp_path: Path, text: str, name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reads_a_valid_file(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "a,0,cifar10,4,512\nb,12.5,ncf,1,32768\n")
    workload = read_workload(path, APPS)
    assert workload.name == "w"
    assert workload.jobs == (JobSpec("a", 0.0, "cifar10", 4, 512),
                             JobSpec("b", 12.5, "ncf", 1, 32768))


@pytest.mark.parametrize(("text", "line", "field", "hint"), [
    ("name,time,application,num_replicas\na,0,ncf,1\n", 1, "batch_size", "missing column"),
    (HEADER + "a,0,ncf,1,32768\nb,-5,ncf,1,32768\n", 3, "time", ">= 0"),
    (HEADER + "a,soon,ncf,1,32768\n", 2, "time", "'soon'"),
    (HEADER + "a,0,resnet,1,32768\n", 2, "application", "choose from: cifar10, ncf"),
    (HEADER + "a,0,ncf,1.5,32768\n", 2, "num_replicas", "whole number"),
    (HEADER + "a,0,ncf,0,32768\n", 2, "num_replicas", ">= 1"),
    (HEADER + "a,0,ncf,1,\n", 2, "batch_size", "whole number"),
    (HEADER + "a,0,ncf,1,32768\na,5,ncf,1,32768\n", 3, "name", "repeats line 2"),
    (HEADER + ",0,ncf,1,32768\n", 2, "name", "unique name"),
    (HEADER + "a,0,ncf,1,32768,extra\n", 2, "row", "more values"),
])
def test_errors_name_file_line_and_field(tmp_path: Path, text: str, line: int, field: str,
                                         hint: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(WorkloadError) as exc:
        read_workload(path, APPS)
    assert (exc.value.path, exc.value.line, exc.value.field) == (str(path), line, field)
    message = str(exc.value)
    assert f"{path}:{line}" in message and f"'{field}'" in message and hint in message


def test_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no jobs"):
        read_workload(write(tmp_path, HEADER), APPS)
    with pytest.raises(WorkloadError, match="cannot read"):
        read_workload(tmp_path / "absent.csv", APPS)
    with pytest.raises(WorkloadError, match="no such file"):
        workload_files([tmp_path / "absent"])


def test_round_trip_and_folders(tmp_path: Path) -> None:
    workload = Workload("x", (JobSpec("a", 0.0, "ncf", 1, 32768),
                              JobSpec("b", 7.25, "cifar10", 8, 2048)))
    (tmp_path / "dir").mkdir()
    write_workload(workload, tmp_path / "dir" / "x.csv")
    write_workload(workload, tmp_path / "dir" / "y.csv")
    files = workload_files([tmp_path / "dir"])
    assert [f.name for f in files] == ["x.csv", "y.csv"]
    assert read_workload(files[0], APPS).jobs == workload.jobs
