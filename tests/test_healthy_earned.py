"""A verdict of healthy has to be earned: three real gloo jobs that failed, whose dumps alone look close to
matched, must never be called healthy, and must be blamed on the rank that caused them.

- ``torchrun_abort``: torchrun, 4 ranks; gloo aborts rank 2 (SIGABRT: it skipped a collective, and its next
  one received its peers' data), torchrun stops the others (SIGTERM). Rank 2 left no dump, only its rank
  file and torchrun's lines about it.
- ``checkpoint_hang``: a DCP save whose storage write hangs on rank 1 past the timeout; every rank records
  the same collectives, rank 1 entered the last one long after its peers had timed out in it.
- ``pair_skip``: 8 ranks in pairs; rank 5 skips its pair's all_reduce; rank 4 waits in the pair's op,
  everyone else (rank 5 included) in the next world op.

Made by ``samples/gloo_failures.py`` (``samples/gloo/<scenario>`` holds a copy of each).
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, run_cli, run_once

sys.path.insert(0, str(ROOT / "samples"))
import gloo_failures

CULPRIT = {"torchrun_abort": 2, "checkpoint_hang": 1, "pair_skip": 5}


@pytest.fixture(scope="session")
def failed_job(tmp_path_factory: pytest.TempPathFactory):
    """Run a scenario of ``gloo_failures`` once per session; return the folder it left."""
    return run_once(tmp_path_factory, gloo_failures.run_scenario)


def _analyze(folder: Path, *options: str) -> tuple[int, dict]:
    code, stdout, stderr = run_cli("analyze", str(folder), "--json", *options)
    assert code in (0, 1, 3), stderr
    return code, json.loads(stdout)


def _entries(folder: Path, rank: int) -> list[dict]:
    """A rank's entries, read as plain data (the job's own pickle dump), oldest first."""
    return pickle.loads((folder / f"gloo_trace_rank_{rank}").read_bytes()).get("entries", [])


def _said(report: dict) -> str:
    """Everything the verdict and the findings say, whitespace made single."""
    verdict = report["verdict"]
    texts = [verdict.get("summary", ""), *verdict.get("evidence", [])]
    for finding in report.get("findings", []):
        texts += [finding.get("summary", ""), *finding.get("evidence", [])]
    return " ".join(" ".join(texts).split())


@pytest.mark.torch_job
def test_each_job_left_the_evidence_of_its_failure(failed_job):
    """The jobs fail as intended (else the tests below would blame the analysis for a job that did not)."""
    folder = failed_job("torchrun_abort")
    assert not (folder / "gloo_trace_rank_2").exists() and (folder / "fr_pid_rank_2").exists()
    for rank in (0, 1, 3):
        assert (folder / f"gloo_trace_rank_{rank}.ended").read_text().strip() == "signal SIGTERM"
    log = (folder / "torchrun.log").read_text()
    assert "Signal 6 (SIGABRT)" in log and "Is there a distributed collective mismatch in your code?" in log

    folder = failed_job("checkpoint_hang")
    last = {rank: _entries(folder, rank)[-1] for rank in range(4)}
    assert len({(e["process_group"][0], e["collective_seq_id"], e["profiling_name"]) for e in last.values()}) == 1
    late = last[1]["time_created_ns"] - max(e["time_created_ns"] for r, e in last.items() if r != 1)
    assert late > last[1]["timeout_ms"] * 1_000_000

    folder = failed_job("pair_skip")
    last = {rank: _entries(folder, rank)[-1] for rank in range(8)}
    assert last[4]["process_group"][1] != "default_pg"  # rank 4 waits in its pair's op
    assert all(last[r]["process_group"][1] == "default_pg" for r in range(8) if r != 4)


@pytest.mark.torch_job
@pytest.mark.parametrize("scenario", sorted(CULPRIT))
def test_a_real_failure_is_never_healthy_and_names_its_culprit_first(failed_job, scenario: str):
    code, report = _analyze(failed_job(scenario))
    verdict = report["verdict"]
    assert verdict["status"] != "healthy" and code == 1, verdict
    assert verdict.get("culprit_ranks", [None])[0] == CULPRIT[scenario], verdict


@pytest.mark.torch_job
@pytest.mark.parametrize("scenario", sorted(CULPRIT))
def test_redacted_the_verdict_is_the_same(failed_job, scenario: str):
    folder = failed_job(scenario)
    code, report = _analyze(folder)
    redacted_code, redacted = _analyze(folder, "--redact")
    verdict, hidden = report["verdict"], redacted["verdict"]
    assert (redacted_code, hidden["status"], hidden.get("culprit_ranks")) == (
        code, verdict["status"], verdict.get("culprit_ranks"))  # fmt: skip
    assert hidden["status"] != "healthy" and redacted_code == 1, hidden
    assert hidden.get("culprit_ranks", [None])[0] == CULPRIT[scenario], hidden


@pytest.mark.torch_job
def test_the_aborted_ranks_launcher_line_is_quoted(failed_job):
    """What torchrun said of rank 2 (its exit by SIGABRT) or what gloo said before aborting it is quoted as
    written, not only paraphrased."""
    folder = failed_job("torchrun_abort")
    log = (folder / "torchrun.log").read_text()
    pid = json.loads((folder / "fr_pid_rank_2").read_text())["pid"]
    quotes = [
        rf"failed \(exitcode: -6\) local_rank: 2 \(pid: {pid}\)",
        rf"exitcode\s*: -6 \(pid: {pid}\)\s*\(SIGABRT\)",
        rf"Signal 6 \(SIGABRT\) received by PID {pid}",
        r"Received data size doesn't match expected size\. Is there a distributed collective mismatch in your code\?",
    ]
    lines = [" ".join(m.group(0).split()) for q in quotes for m in [re.search(q, log)] if m]
    assert len(lines) == len(quotes), lines  # the log says each of them
    said = _said(_analyze(folder)[1])
    assert any(line in said for line in lines), said
