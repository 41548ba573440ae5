"""Folding: a huge job's trace still opens, and never hides what the findings name."""

from __future__ import annotations

from pathlib import Path

from .conftest import run_cli
from .tracecheck import read_trace


def convert(folder: Path, out: Path, *options: str):
    code, stdout, stderr = run_cli("convert", str(folder), "-o", str(out), *options)
    assert code == 0, stderr
    return read_trace(str(out)), stdout


def findings_of(trace) -> list[tuple[str, dict]]:
    return sorted((s[3], s[4]) for s in trace.all_slices() if trace.process_of(s[0]) == "Findings")


def test_identical_ranks_fold_and_the_culprit_never_does(nccl_job, tmp_path: Path):
    folder = nccl_job("demo")
    full, full_out = convert(folder, tmp_path / "full.pftrace", "--full")
    folded, out = convert(folder, tmp_path / "folded.pftrace", "--max-size", "0.001")
    assert len(full.processes) == 8 and "Folded" not in full_out
    assert "Folded to stay under 0.001 MB" in out and "--full" in out
    names = sorted(folded.processes.values())
    # the culprit keeps its own process; ranks 6 and 7 did the very same ops and share one
    assert "rank 5" in names
    assert "ranks 6-7 (2)" in names
    assert folded.process_labels["ranks 6-7 (2)"][0] == "stands for 2 ranks: 6-7"
    # every rank is accounted for exactly once by the labels
    counted = []
    for labels in folded.process_labels.values():
        stands = [label for label in labels if label.startswith("stands for ")]
        counted.append(int(stands[0].split()[2]) if stands else 1)
    assert sum(counted) == 8 and len(folded.processes) < 8
    # the findings are the same with and without folding, and so is the marker on the culprit
    assert findings_of(folded) == findings_of(full)
    markers = [(folded.process_of(u), n) for u, items in folded.markers().items() for _, n in items]
    assert markers == [("rank 5", "✗ NEVER ISSUED all_reduce #4")]


def test_window_summarises_old_history_but_keeps_the_findings_groups(nccl_job, tmp_path: Path):
    folder = nccl_job("straggler")  # 30 all_reduces of the default group, nothing else
    trace, out = convert(folder, tmp_path / "w.pftrace", "--window", "5")
    summaries = [s for s in trace.all_slices() if s[3].endswith("earlier ops (folded)")]
    assert len(summaries) == 8 and all(s[4]["folded_ops"] == 25 for s in summaries)
    kept = [s for s in trace.all_slices() if s[3].startswith("all_reduce #")]
    assert len(kept) == 8 * 5 and "25 older ops summarised" in out
    # a group a finding names keeps its whole history
    trace, _ = convert(nccl_job("demo"), tmp_path / "d.pftrace", "--window", "1")
    tp2 = [s for s in trace.all_slices() if "tp · pg 2" in trace.tracks[s[0]][0] and s[3].startswith("all_reduce")]
    assert len(tp2) == 3 * 3 + 3  # 3 steps on 4 ranks, then #4 on the three that issued it


def test_ranks_and_groups_choose_by_hand(nccl_job, tmp_path: Path):
    trace, _ = convert(nccl_job("demo"), tmp_path / "r.pftrace", "--ranks", "4-5", "--groups", "tp")
    assert sorted(trace.processes.values()) == ["rank 4", "rank 5"]
    groups = {name for uuid, (name, parent) in trace.tracks.items() if parent is not None and " · pg " in name}
    assert groups == {"tp · pg 2 · 4 ranks"}
    code, _, stderr = run_cli("convert", str(nccl_job("demo")), "-o", str(tmp_path / "x"), "--ranks", "7-3")
    assert code == 2 and "--ranks" in stderr
