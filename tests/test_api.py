"""The Python API, used as a job manager would: load a folder, read the verdict, decide, keep the trace."""

from __future__ import annotations

import json
import pydoc
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fr2perfetto
from fr2perfetto.api import Report
from fr2perfetto.render.report import parse_report_json, report_json

from .tracecheck import read_trace

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
API = ("Culprit", "Job", "NoDumps", "Report", "ReportFinding", "TraceStats", "analyze", "load", "watch", "write_trace")


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


# The report is the command line's: ``to_dict()`` is what ``analyze --json`` prints, as JSON reads it.


def _analyze_json(*args: str) -> tuple[int, str]:
    """Exit code and standard output of ``fr2perfetto analyze ARGS --json``, run as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "fr2perfetto", "analyze", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode in (0, 1, 3), done.stderr  # 2: nothing usable was read
    return done.returncode, done.stdout


@pytest.mark.parametrize(
    ("sample", "exit_code", "status"),
    [("nccl/demo", 1, "hang"), ("gloo/healthy", 0, "healthy")],  # the CLI exits 1 for a hang
)
def test_the_report_is_what_analyze_json_prints(sample: str, exit_code: int, status: str):
    folder = str(SAMPLES / sample)
    code, printed = _analyze_json(folder)
    report = fr2perfetto.analyze(fr2perfetto.load(folder), inputs=folder)
    assert code == exit_code and report.status == status
    assert report.to_dict() == json.loads(printed)
    assert report.to_json() + "\n" == printed  # the very text, less the newline print adds

    # Where each attribute is in it, as Report's docstring says.
    whole = report.to_dict()
    verdict = whole["verdict"]
    assert (verdict["status"], verdict["summary"], verdict["category"]) == (status, report.summary, report.root_cause)
    assert verdict.get("culprit_ranks", []) == [culprit.rank for culprit in report.culprits]
    assert whole["next_steps"] == list(report.next_steps) and whole["next_steps"][-1]
    assert len(whole.get("findings", [])) == len(report.findings)
    for found, finding in zip(whole.get("findings", []), report.findings, strict=True):
        assert (found["kind"], found["summary"], found["op"], found["seq"]) == (
            finding.kind, finding.summary, finding.op, finding.seq)  # fmt: skip
        assert tuple(found["evidence"]) == finding.evidence
        assert tuple(found.get("culprit_ranks", [])) == finding.culprit_ranks
        assert finding.group == (found["group"].get("desc") or found["group"]["name"])
    for culprit in report.culprits:
        assert culprit.why == next(f["summary"] for f in whole["findings"] if culprit.rank in f["culprit_ranks"])


def test_the_report_of_one_run_of_several_is_the_clis_with_its_run_and_problems(tmp_path: Path):
    shutil.copytree(SAMPLES / "gloo" / "healthy", tmp_path / "healthy")
    shutil.copytree(SAMPLES / "gloo" / "skip", tmp_path / "skip")
    for run, exit_code in ((None, 1), ("healthy", 0)):  # the newest run (skip), then the one asked for
        _, printed = _analyze_json(str(tmp_path), *(["--run", run] if run else []))
        # a Path, not a str, and as one path rather than a list: both are what the CLI was given
        report = fr2perfetto.analyze(fr2perfetto.load(tmp_path, run=run), inputs=tmp_path)
        assert report.to_json() + "\n" == printed and report.to_dict() == json.loads(printed)
        whole = report.to_dict()
        assert whole["job"]["run"] == report.run == (run or "skip")
        assert report.problems and [f"{p['path']}: {p['reason']}" for p in whole["input_problems"]] == list(
            report.problems
        )
        # the next steps' commands read the run analysed, as the command line's do
        assert exit_code == 0 or f"--run {report.run}" in report.next_steps[-1]


def test_to_json_round_trips_through_the_schema_and_to_dict_is_a_new_object_each_time():
    report = fr2perfetto.analyze(fr2perfetto.load(SAMPLES / "nccl" / "demo"))
    text = report.to_json()
    assert report_json(parse_report_json(text)) == text  # it parses against the schema, and back the same
    assert json.loads(text) == report.to_dict()
    report.to_dict()["verdict"]["status"] = "changed"
    assert report.to_dict()["verdict"]["status"] == "hang"
    by_hand = Report("hang", "", "", (), (), (), ())
    with pytest.raises(ValueError, match=r"only a Report made by fr2perfetto\.analyze\(\)"):
        by_hand.to_dict()


def test_write_trace_takes_a_path_and_a_group_name_and_refuses_another_jobs_report(tmp_path: Path):
    job = fr2perfetto.load(SAMPLES / "nccl" / "demo")
    report = fr2perfetto.analyze(job)
    before = report.to_dict()
    stats, view = fr2perfetto.write_trace(job, tmp_path / "tp.pftrace", report=report, groups="tp", ranks=range(4, 8))
    assert stats.processes == 4 and (tmp_path / "tp.pftrace").stat().st_size > 0
    assert "only groups tp (--groups)" in view.notes and "only ranks 4-7 (--ranks)" in view.notes
    assert report.to_dict() == before  # the report is of the job as analysed, whatever is done after
    other = fr2perfetto.analyze(fr2perfetto.load(SAMPLES / "gloo" / "healthy"))
    with pytest.raises(ValueError, match="the report is of another job"):
        fr2perfetto.write_trace(job, tmp_path / "x.pftrace", report=other)
    with pytest.raises(TypeError, match=r"analyze\(inputs=\.\.\.\) takes a path or a list of paths, not int"):
        fr2perfetto.analyze(job, inputs=3)  # type: ignore[arg-type]


# What the package shows: dir() and help() name the API before it is imported, and importing it stays light.


def test_dir_names_the_api_without_importing_it():
    program = (
        "import json, sys, fr2perfetto; names = dir(fr2perfetto); "
        "print(json.dumps([names, sorted(m for m in sys.modules if m.startswith(('fr2perfetto.', 'google', "
        "'perfetto')))]))"
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True)
    names, imported = json.loads(done.stdout)
    assert set(API) <= set(names) and "__version__" in names
    assert imported == []  # neither the API, nor protobuf, nor perfetto: only when first asked for
    assert set(API) <= set(dir(fr2perfetto)) and set(fr2perfetto.__all__) == {*API, "__version__"}


def test_help_names_the_api_and_the_docstring_gives_each_a_line():
    shown = pydoc.render_doc(fr2perfetto, renderer=pydoc.plaintext)
    classes, functions = shown.index("\nCLASSES\n"), shown.index("\nFUNCTIONS\n")
    for name in ("Culprit", "Job", "NoDumps", "Report", "ReportFinding", "TraceStats"):
        assert f"class {name}(" in shown[classes:functions]
    for name in ("analyze", "load", "watch", "write_trace"):
        assert f"\n    {name}(" in shown[functions:]
    doc = fr2perfetto.__doc__ or ""
    for name in API:
        assert len(re.findall(rf"^- ``{name}[(`]", doc, re.M)) == 1, name
    # the mapping from the attributes to the JSON report is in Report's help
    assert 'root_cause         d["verdict"]["category"]' in pydoc.render_doc(fr2perfetto.Report)


# The README's example runs: a job manager's script, against the demo's dumps.


def test_the_readmes_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Use it from Python\n") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    assert 10 <= len(code.splitlines()) <= 20
    folder = tmp_path / "fr_dumps"
    shutil.copytree(SAMPLES / "nccl" / "demo", folder)
    # the capture helper's rank file says where rank 5, the culprit, runs
    (folder / "fr_pid_rank_5").write_text(json.dumps({"rank": 5, "host": "node-5", "pid": 99, "start": 1,
                                                      "run": "r", "signal": 10}))  # fmt: skip
    assert code.count('Path("/shared/fr_dumps")') == 1
    code = code.replace('Path("/shared/fr_dumps")', f"Path({str(folder)!r})")
    commands: list[list[str]] = []
    with monkeypatch.context() as patch:
        patch.chdir(tmp_path)
        patch.setattr(subprocess, "run", lambda command, **_: commands.append(command))
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert commands == [["scontrol", "update", "nodename=node-5", "state=drain",
                         "reason=fr2perfetto: rank 5 hung the job"]]  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.startswith("hang: rank 5 never issued all_reduce #4 of tp")
    assert "next: See where rank 5 is now, on node-5" in printed
    assert read_trace(str(tmp_path / "hang.pftrace")).processes
    _, cli = _analyze_json(str(folder))
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads(cli)
