"""Folders that hold several runs of a job: the verdict is one run's (the newest, or the one --run names),
the others are named in one note each, and nothing of one run is mixed into another's verdict."""

from __future__ import annotations

import json
import pickle
import re
import shutil
import tarfile
from pathlib import Path

import pytest

import fr2perfetto
from fr2perfetto.read.reader import read_dump
from fr2perfetto.read.runs import RankFile, find_runs

from .conftest import ROOT, run_cli

GLOO = ROOT / "samples" / "gloo"
SKIP = GLOO / "skip"  # rank 2 never issued all_reduce #4; dumped five seconds after HEALTHY's
HEALTHY = GLOO / "healthy"


def _report(*args: str) -> tuple[int, dict]:
    code, stdout, stderr = run_cli("analyze", *args, "--json")
    assert code in (0, 1, 3), stderr
    return code, json.loads(stdout)


def _notes(report: dict, words: str) -> list[dict]:
    return [problem for problem in report.get("input_problems", []) if words in problem["reason"]]


def _copy_renamed(source: Path, folder: Path, prefix: str, rank_shift: int = 0) -> None:
    """Copy a sample's dumps into ``folder`` as ``<prefix><rank>`` (its extension kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    for dump in source.iterdir():
        stem, dot, extension = dump.name.partition(".")
        rank = int(stem.rsplit("_", 1)[1]) + rank_shift
        shutil.copy(dump, folder / f"{prefix}{rank}{dot}{extension}")


def test_two_attempts_in_sibling_folders_give_the_newest_ones_verdict_and_name_the_other(tmp_path: Path):
    shutil.copytree(HEALTHY, tmp_path / "healthy")
    shutil.copytree(SKIP, tmp_path / "skip")
    _, alone = _report(str(SKIP))
    code, report = _report(str(tmp_path))
    assert code == 1 and report["verdict"] == alone["verdict"]
    assert report["job"]["run"] == "skip" and report["job"]["ranks_with_dump"] == [0, 1, 2, 3]
    assert [(run["name"], run.get("analysed", False)) for run in report["runs"]] == [("skip", True), ("healthy", False)]
    (note,) = _notes(report, "another run")
    assert note["path"] == str(tmp_path / "healthy") and not note.get("fatal")
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"
    assert re.match(rf"another run \(4 dumps of ranks 0-3, last {when}\), left out", note["reason"])
    assert note["reason"].endswith("pick it with --run healthy")
    assert not _notes(report, "newer dump")  # no file of one run is taken for a snapshot of the other's

    code, picked = _report(str(tmp_path), "--run", "healthy")
    assert code == 0 and picked["verdict"]["status"] == "healthy" and picked["job"]["run"] == "healthy"
    assert [note["path"] for note in _notes(picked, "another run")] == [str(tmp_path / "skip")]


def test_two_runs_side_by_side_in_one_folder_are_told_apart_by_their_files(tmp_path: Path):
    flat = tmp_path / "dumps"
    shutil.copytree(SKIP, flat)
    _copy_renamed(HEALTHY, flat, "attempt1_rank_")  # the same ranks again, under other names
    code, report = _report(str(flat))
    assert code == 1 and report["verdict"]["culprit_ranks"] == [2] and report["job"]["run"] == "run 1"
    assert [run["name"] for run in report["runs"]] == ["run 1", "run 2"]
    (note,) = _notes(report, "another run")
    # a run that shares its folder is told by its files
    assert note["path"] == str(flat)
    assert "attempt1_rank_0, attempt1_rank_1.json, attempt1_rank_2 and 1 more" in note["reason"]
    assert note["reason"].endswith("--run 2") and not _notes(report, "newer dump")
    code, picked = _report(str(flat), "--run", "2")
    assert code == 0 and picked["verdict"]["status"] == "healthy"
    assert picked["runs"][1]["analysed"] and all("attempt1_rank_" in f for f in picked["runs"][1]["files"])


def test_a_stale_attempt_with_other_ranks_is_left_out_by_its_time(tmp_path: Path):
    # an earlier attempt had ranks 4-7 too: their files stay, the later attempt's ranks 0-3 never wrote them
    flat = tmp_path / "dumps"
    shutil.copytree(SKIP, flat)
    _copy_renamed(HEALTHY, flat, "gloo_trace_rank_", rank_shift=4)
    _, report = _report(str(flat))
    assert report["job"]["ranks_with_dump"] == [0, 1, 2, 3] and report["verdict"]["culprit_ranks"] == [2]
    assert [run["ranks"] for run in report["runs"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    _, picked = _report(str(flat), "--run", "2")
    assert picked["job"]["ranks_with_dump"] == [4, 5, 6, 7]


def test_periodic_snapshots_of_one_process_stay_one_run(tmp_path: Path):
    dumps = tmp_path / "dumps"
    shutil.copytree(SKIP, dumps)
    older = pickle.loads((SKIP / "gloo_trace_rank_1").read_bytes())
    older["entries"] = older["entries"][:3]  # what a snapshot taken earlier held
    (dumps / "snapshot_0900_rank_1").write_bytes(pickle.dumps(older))
    _, report = _report(str(dumps))
    assert report["verdict"]["culprit_ranks"] == [2] and "runs" not in report and not report["job"].get("run")
    (note,) = _notes(report, "newer dump")
    assert note["path"].endswith("snapshot_0900_rank_1") and not _notes(report, "another run")


def test_analyze_and_info_of_the_samples_folder_read_one_run_and_list_the_others():
    folders = sorted(p for p in GLOO.iterdir() if p.is_dir())
    _, report = _report(str(GLOO))
    names = [run["name"] for run in report["runs"]]
    assert sorted(names) == [p.name for p in folders] and report["job"]["run"] == names[0]
    _, alone = _report(str(GLOO / names[0]))
    assert report["verdict"] == alone["verdict"]
    notes = _notes(report, "another run")
    assert sorted(note["path"] for note in notes) == sorted(str(GLOO / name) for name in names[1:])
    assert not _notes(report, "newer dump")
    code, stdout, _ = run_cli("info", str(GLOO))
    assert code == 0 and f"{len(folders)} runs in these dumps (newest first); below, run {names[0]}" in stdout
    assert all(name in stdout for name in names)


def test_stack_snapshots_beside_another_run_are_left_out(tmp_path: Path):
    shutil.copytree(GLOO / "pipeline_stopped", tmp_path / "stopped")
    shutil.copytree(GLOO / "pipeline_healthy", tmp_path / "later")
    _, report = _report(str(tmp_path))
    assert report["job"]["run"] == "later" and report["stacks"]
    assert all("/later/" in stack["source"] for stack in report["stacks"])
    _, picked = _report(str(tmp_path), "--run", "stopped")
    assert picked["verdict"]["culprit_ranks"] == _report(str(GLOO / "pipeline_stopped"))[1]["verdict"]["culprit_ranks"]
    assert picked["stacks"] and all("/stopped/" in stack["source"] for stack in picked["stacks"])


def test_a_run_that_is_not_there_is_refused_in_one_line(tmp_path: Path):
    shutil.copytree(HEALTHY, tmp_path / "monday")
    shutil.copytree(SKIP, tmp_path / "tuesday")
    code, _, stderr = run_cli("analyze", str(tmp_path), "--run", "friday")
    (line,) = stderr.strip().splitlines()
    assert code == 2 and "--run friday: no such run" in line and "tuesday, monday (newest first)" in line


def test_redacted_runs_are_numbered_not_named_after_their_folders(tmp_path: Path):
    shutil.copytree(HEALTHY, tmp_path / "monday")
    shutil.copytree(SKIP, tmp_path / "tuesday")
    code, stdout, _ = run_cli("analyze", str(tmp_path), "--redact", "--json")
    report = json.loads(stdout)
    assert code == 1 and [run["name"] for run in report["runs"]] == ["run 1", "run 2"]
    assert "monday" not in stdout and "tuesday" not in stdout and str(tmp_path) not in stdout


def test_the_terminal_report_says_which_run_it_is_of(tmp_path: Path):
    shutil.copytree(HEALTHY, tmp_path / "monday")
    shutil.copytree(SKIP, tmp_path / "tuesday")
    _, stdout, stderr = run_cli("analyze", str(tmp_path), "--run", "monday")
    assert "Run monday, the 2nd newest of the 2 runs in these dumps; the others are left out" in stdout
    assert "another run (4 dumps of ranks 0-3" in stderr and "--run tuesday" in stderr
    _, single, _ = run_cli("analyze", str(SKIP))
    assert "Run " not in single and "runs in these dumps" not in single


def _dumps(folder: Path) -> list:
    return [read_dump(str(path)) for path in sorted(folder.iterdir())]


def test_the_capture_helpers_rank_files_tell_runs_and_processes_apart():
    dumps = _dumps(SKIP)
    files = [RankFile(str(SKIP / f"fr_pid_rank_{d.rank}"), d.rank, "node1", 100 + d.rank, 7,
                      "ab" if d.rank < 2 else "cd") for d in dumps]  # fmt: skip
    assert sorted(run.ranks for run in find_runs(dumps, files)) == [[0, 1], [2, 3]]
    # one rank's dumps in two folders, of one process (the same host, pid and start): snapshots of one run
    copy = [read_dump(str(SKIP / "gloo_trace_rank_0"))]
    copy[0].path = "elsewhere/gloo_trace_rank_0"
    same = [RankFile("elsewhere/fr_pid_rank_0", 0, "node1", 100, 7),
            RankFile(str(SKIP / "fr_pid_rank_0"), 0, "node1", 100, 7)]  # fmt: skip
    (run,) = find_runs(dumps + copy, same)
    assert run.ranks == [0, 1, 2, 3] and len(run.older) == 1
    other = [RankFile("elsewhere/fr_pid_rank_0", 0, "node1", 555, 7), same[1]]
    assert len(find_runs(dumps + copy, other)) == 2


def test_runs_in_an_archive_are_told_apart_by_their_folders_in_it(tmp_path: Path):
    with tarfile.open(tmp_path / "attempts.tar.gz", "w:gz") as archive:
        archive.add(HEALTHY, arcname="job/healthy")
        archive.add(SKIP, arcname="job/skip")
    _, report = _report(str(tmp_path / "attempts.tar.gz"))
    assert report["job"]["run"] == "skip" and report["verdict"]["culprit_ranks"] == [2]
    (note,) = _notes(report, "another run")
    assert note["path"] == f"{tmp_path / 'attempts.tar.gz'}!job/healthy" and note["reason"].endswith("--run healthy")


def test_a_program_picks_a_run_by_name_and_learns_which_it_got(tmp_path: Path):
    shutil.copytree(HEALTHY, tmp_path / "monday")
    shutil.copytree(SKIP, tmp_path / "tuesday")
    newest = fr2perfetto.analyze(fr2perfetto.load([str(tmp_path)], jobs=1))
    assert (newest.run, newest.status, newest.culprit_hosts) == ("tuesday", "hang", [])
    job = fr2perfetto.load([str(tmp_path)], jobs=1, run="monday")
    assert [info.name for info in job.runs] == ["tuesday", "monday"] and sorted(job.dumps) == [0, 1, 2, 3]
    assert fr2perfetto.analyze(job).healthy
    with pytest.raises(fr2perfetto.NoDumps, match="no such run"):
        fr2perfetto.load([str(tmp_path)], jobs=1, run="friday")
