"""Reading and writing over several processes gives exactly what one process gives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nccl_layout
import pytest

from fr2perfetto import convert as convert_module
from fr2perfetto.read import job as job_module

from .conftest import run_cli
from .tracecheck import read_trace


def _big_job(folder: Path) -> None:
    """32 ranks (tp 8 x dp 4): enough processes for the trace to be written in parts."""
    job = nccl_layout.Job(32, nccl_layout.tp_dp_groups(32, 8))
    tp = [str(n) for n in range(1, 5)]
    dp = [str(n) for n in range(5, 13)]
    nccl_layout._train_steps(job, 3, tp=tp, dp=dp)
    job.send_recv(0, 8)
    job.batch_send_recv([(1, 9), (9, 1)])
    job.coalesced("1")
    job.collective("all_reduce", "0", skip=(13,))
    job.dump(str(folder), json_ranks=(3,))


def _content(path: Path):
    trace = read_trace(str(path))
    slices = sorted(
        (trace.process_of(s[0]), trace.tracks[s[0]][0], *s[1:4], json.dumps(s[4])) for s in trace.all_slices()
    )
    instants = sorted((trace.process_of(u), t, n) for u, items in trace.markers().items() for t, n in items)
    return trace, slices, instants


@pytest.mark.parametrize("kept", [convert_module.KEPT_ITEMS, 40])
def test_parallel_conversion_matches_a_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: int):
    """Whether a writing process keeps what it made until it ends (as much as fits ``KEPT_ITEMS``) or frees
    it rank by rank beyond that, it writes what one process writes."""
    monkeypatch.setattr(convert_module, "KEPT_ITEMS", kept)
    folder = tmp_path / "dumps"
    _big_job(folder)
    code, _, stderr = run_cli("convert", str(folder), "-o", str(tmp_path / "one.pftrace"), "-j", "1", "-q")
    assert code == 0, stderr
    code, _, stderr = run_cli("convert", str(folder), "-o", str(tmp_path / "two.pftrace"), "-j", "2", "-q")
    assert code == 0, stderr
    one, one_slices, one_instants = _content(tmp_path / "one.pftrace")
    two, two_slices, two_instants = _content(tmp_path / "two.pftrace")
    # the parallel trace really was written in parts, each on its own packet sequence
    assert len(one.sequences) == 1 and len(two.sequences) > 2
    assert sorted(two.processes.values()) == sorted(one.processes.values()) and len(one.processes) == 32
    assert two_slices == one_slices and len(one_slices) > 300
    assert two_instants == one_instants and [p for p, _, _ in one_instants] == ["rank 13"]
    assert one_instants[0][2].startswith("✗ NEVER ISSUED all_reduce #")
    assert two.flows == one.flows


def test_parallel_reading_gives_the_same_report(tmp_path: Path):
    folder = tmp_path / "dumps"
    _big_job(folder)
    one = run_cli("analyze", str(folder), "--json", "-j", "1")
    two = run_cli("analyze", str(folder), "--json", "-j", "2")
    assert one == two and one[0] == 1
    report = json.loads(one[1])
    assert report["verdict"]["culprit_ranks"] == [13]


_real_read, _real_write = job_module._read_packed, convert_module._write_part


# Module-level stand-ins for the workers' functions (tasks reach a worker pickled, by name), each
# killing its process on one task, as the kernel's out-of-memory killer would.
def _read_or_die(path: str, **options: int):
    if path.endswith("nccl_trace_rank_20"):
        os._exit(9)
    return _real_read(path, **options)


def _write_or_die(task):
    part = "direct" if task[2] is None else os.path.basename(task[2])  # the first part goes to the output
    if part == os.environ.get("FR2PERFETTO_TEST_DIES"):
        os._exit(9)
    return _real_write(task)


def test_a_reading_process_that_dies_costs_no_dump(tmp_path: Path, monkeypatch):
    folder = tmp_path / "dumps"
    _big_job(folder)
    monkeypatch.setattr(job_module, "_read_packed", _read_or_die)
    job = job_module.load_job([str(folder)], jobs=2)
    assert sorted(job.dumps) == list(range(32)) and not job.problems


@pytest.mark.parametrize("dies", ["direct", "part1"])
def test_a_writing_process_that_dies_is_one_line_and_no_trace(tmp_path: Path, monkeypatch, dies: str):
    folder = tmp_path / "dumps"
    _big_job(folder)
    monkeypatch.setenv("FR2PERFETTO_TEST_DIES", dies)  # the forked workers see it
    monkeypatch.setattr(convert_module, "_write_part", _write_or_die)
    out = tmp_path / "t.pftrace"
    code, _, stderr = run_cli("convert", str(folder), "-o", str(out), "-j", "2", "-q")
    assert code == 2 and not out.exists()
    assert stderr.strip().count("\n") == 0 and "a writing process died" in stderr and "Traceback" not in stderr


def test_the_parts_written_in_parallel_are_of_about_equal_work():
    cut = convert_module.even_bounds
    assert cut([1] * 8, 2) == [0, 4, 8]
    assert cut([10] + [1] * 10, 2) == [0, 1, 11]  # one heavy rank is a part of its own
    assert cut([0, 0, 0, 100], 3) == [0, 2, 3, 4]  # never an empty part
    assert cut([5, 5], 1) == [0, 2]
