"""Never call a hung job healthy: where the dumps cannot tell (gloo records no send or recv), the stack
snapshots and the logs beside them decide; a job they say failed or stopped is never healthy."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, run_cli, run_once
from .tracecheck import read_trace

sys.path.insert(0, str(ROOT / "samples"))
import gloo_pipeline

STOP_LINE = (
    gloo_pipeline.JOB.splitlines().index(
        "            time.sleep(3600)  # STOPPED HERE: on the CPU, in its own code, before its next send"
    )
    + 2
)  # the job's script starts with one line of settings before JOB


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory):
    """A real 4-stage Schedule1F1B job on gloo under PyTorch's debug server, run once per session."""

    def every_rank_dumped(scenario: str, files: list[str]) -> None:
        assert sum("gloo_trace_rank_" in f for f in files) == 4, files

    return run_once(tmp_path_factory, gloo_pipeline.run_scenario, every_rank_dumped)


def _analyze(*args: str) -> tuple[int, dict]:
    code, stdout, stderr = run_cli("analyze", *args, "--json")
    assert code in (0, 1, 3), stderr
    return code, json.loads(stdout)


@pytest.mark.torch_job
def test_a_stopped_pipeline_stage_is_named_from_its_stack_snapshots(pipeline, tmp_path: Path):
    folder = pipeline("pipeline_stopped")
    code, report = _analyze(str(folder))
    verdict = report["verdict"]
    assert code == 1 and verdict["status"] == "hang" and verdict["culprit_ranks"] == [2]
    assert verdict["summary"].startswith(f"hang: rank 2 stays in forward at train.py:{STOP_LINE}, not in communication")
    (finding,) = report["findings"]
    assert finding["kind"] == "stuck_cpu" and finding["culprit_ranks"] == [2]
    assert any("ranks 0-1,3 wait in communication all along, in _wait_batch_p2p" in e for e in finding["evidence"])
    assert finding["culprit_frames"][0] == {"name": "forward", "filename": "/job/train.py", "line": STOP_LINE}
    # the terminal and the Markdown report say the same, first
    code, text, _ = run_cli("analyze", str(folder))
    assert code == 1 and "HANG   culprit rank 2" in text and f"forward at train.py:{STOP_LINE}" in text
    _, markdown, _ = run_cli("analyze", str(folder), "--format", "markdown")
    assert "## fr2perfetto verdict: HANG" in markdown and "| 2 |" in markdown and "stuck\\_cpu" in markdown
    # and the trace shows it: where each rank is at each snapshot, the finding pointing at the culprit
    out = tmp_path / "t.pftrace"
    assert run_cli("convert", str(folder), "-o", str(out), "-q")[0] == 0
    trace = read_trace(str(out))
    notes = {(trace.process_of(u), n) for u, items in trace.instants.items() for _, n in items if n.startswith("⌖")}
    assert ("rank 2", f"⌖ stuck in forward (train.py:{STOP_LINE})") in notes
    assert {("rank 0", "⌖ waiting in _wait_batch_p2p (schedules.py:683)")} <= notes
    assert "rank 2 · CULPRIT" in trace.titles.values()
    finding_flow = [f for f in trace.flows if f >= 1 << 48]
    assert finding_flow and trace.flows[finding_flow[0]] == 2  # from the finding to the culprit's snapshot


@pytest.mark.torch_job
def test_the_same_pipeline_healthy_is_healthy(pipeline):
    code, report = _analyze(str(pipeline("pipeline_healthy")))
    assert code == 0 and report["verdict"]["status"] == "healthy" and not report.get("findings")
    # what its dumps cannot show is said, with what shows it
    assert any("gloo's Flight Recorder records collectives only" in e for e in report["verdict"]["evidence"])


@pytest.mark.torch_job
def test_the_stopped_pipeline_without_snapshots_says_what_the_dumps_cannot_show(pipeline, tmp_path: Path):
    for dump in pipeline("pipeline_stopped").glob("gloo_trace_rank_?"):
        shutil.copy(dump, tmp_path / dump.name)
    _, text, _ = run_cli("analyze", str(tmp_path))
    said = " ".join(text.split())
    assert "records collectives only, never send or recv" in said and "py-spy dump --pid" in said
    assert "start_debug_server(dump_dir=" in said
    # and the next step is the snapshots that would show it, not "nothing is wrong"
    assert "Nothing in these dumps is wrong" not in said and "take stack snapshots while it hangs" in said


WATCHDOG = (
    "[rank1]:[E1204 10:00:05.000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=40, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600021 milliseconds "
    "before timing out.\n"
)
GLOO_TIMEOUT = (
    "[rank3]: Traceback (most recent call last):\n"
    '[rank3]:   File "/job/train.py", line 44, in <module>\n'
    "[rank3]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
    "600000ms for recv operation to complete\n"
)


@pytest.mark.parametrize(
    "log, said",
    [(WATCHDOG, "rank 1's watchdog timed out in ALLREDUCE SeqNum=40"),
     (GLOO_TIMEOUT, "rank 3's log says a collective or transfer failed")],
)  # fmt: skip
def test_matched_dumps_with_a_timeout_in_the_logs_are_never_healthy(tmp_path: Path, log: str, said: str):
    shutil.copytree(ROOT / "samples" / "gloo" / "healthy", tmp_path / "dumps")
    (tmp_path / "dumps" / "train.log").write_text(log)
    code, report = _analyze(str(tmp_path / "dumps"))
    verdict = report["verdict"]
    assert code == 3 and verdict["status"] == "undecided" and not verdict.get("culprit_ranks")
    assert verdict["summary"].startswith("undecided: every op matched on every rank, but " + said)


def test_an_error_of_its_own_in_a_ranks_log_names_it(tmp_path: Path):
    shutil.copytree(ROOT / "samples" / "gloo" / "healthy", tmp_path / "dumps")
    (tmp_path / "dumps" / "train.log").write_text(
        "[rank2]: Traceback (most recent call last):\n"
        '[rank2]:   File "/job/train.py", line 80, in <module>\n'
        "[rank2]: ValueError: loss is NaN\n" + GLOO_TIMEOUT
    )
    code, report = _analyze(str(tmp_path / "dumps"))
    verdict = report["verdict"]
    assert code == 1 and verdict["status"] == "crash" and verdict["culprit_ranks"] == [2]
    assert verdict["summary"] == "crash: rank 2 failed of an error of its own: ValueError: loss is NaN (in <module> " \
        "(/job/train.py:80))"  # fmt: skip


def test_the_samples_of_a_real_pipeline_keep_their_verdicts():
    code, report = _analyze(str(ROOT / "samples" / "gloo" / "pipeline_stopped"))
    assert code == 1 and report["verdict"]["culprit_ranks"] == [2]
    code, report = _analyze(str(ROOT / "samples" / "gloo" / "pipeline_healthy"))
    assert code == 0 and report["verdict"]["status"] == "healthy"
