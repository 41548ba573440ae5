"""The Python API, used as a job manager would: load a folder, read the verdict, decide, keep the trace."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fr2perfetto

from .tracecheck import read_trace

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def test_a_job_manager_drains_the_culprits_host(tmp_path: Path):
    folder = tmp_path / "fr_dumps"
    shutil.copytree(SAMPLES / "gloo" / "skip", folder)
    # the capture helper's rank file says where rank 2 runs
    (folder / "fr_pid_rank_2").write_text(json.dumps({"rank": 2, "host": "node-7", "pid": 99, "start": 1,
                                                      "run": "r", "signal": 10}))  # fmt: skip
    job = fr2perfetto.load([str(folder)])
    report = fr2perfetto.analyze(job)
    assert report.status == "hang" and not report.healthy
    assert [c.rank for c in report.culprits] == [2] and report.culprit_hosts == ["node-7"]
    assert report.culprits[0].why == report.findings[0].summary
    assert report.findings[0].kind == "missing" and report.findings[0].group == "default_pg"
    assert report.next_steps[0].startswith("See where rank 2 is now, on node-7: py-spy dump --pid 99")
    stats, view = fr2perfetto.write_trace(job, str(tmp_path / "hang.pftrace"), report=report)
    trace = read_trace(str(tmp_path / "hang.pftrace"))
    assert stats.processes == 4 and sorted(trace.processes.values()) == [f"rank {r}" for r in range(4)]
    assert any(name.startswith("missing: rank 2 never issued") for _, _, _, name, _ in trace.all_slices())
    assert not view.folded


def test_a_healthy_job_is_healthy_and_a_folder_without_dumps_raises(tmp_path: Path):
    report = fr2perfetto.analyze(fr2perfetto.load([str(SAMPLES / "gloo" / "healthy")]))
    assert report.healthy and report.culprits == () and report.culprit_hosts == []
    (tmp_path / "notes.txt").write_text("nothing")
    with pytest.raises(fr2perfetto.NoDumps) as raised:
        fr2perfetto.load([str(tmp_path)])
    assert raised.value.problems and "no Flight Recorder dump" in str(raised.value)


def test_a_single_path_is_a_path_and_wrong_types_say_what_is_wanted():
    folder = SAMPLES / "gloo" / "skip"
    for given in (str(folder), folder):  # a string or a Path, not a list of one-letter paths
        job = fr2perfetto.load(given)
        assert sorted(job.dumps) == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="load\\(\\) takes a path or a list of paths, not int"):
        fr2perfetto.load(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="analyze\\(\\) takes the Job that load\\(\\) returns, not NoneType"):
        fr2perfetto.analyze(None)  # type: ignore[arg-type]
