"""Said plainly: the words around a verdict, the next step, the edges of the command line, the README."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, run_cli

SAMPLES = ROOT / "samples"
SKIP = SAMPLES / "gloo" / "skip"


def _report(*args: str) -> dict:
    code, stdout, stderr = run_cli("analyze", *args, "--json")
    assert code in (0, 1), stderr
    return json.loads(stdout)


def test_the_stack_shown_is_where_the_culprit_issued_the_op_the_finding_is_about():
    # rank 3 issued a broadcast where the others issued all_reduce #2; its last op is an all_reduce
    finding = _report(str(SAMPLES / "gloo" / "order_swap"))["findings"][0]
    assert finding["kind"] == "type_mismatch" and finding["culprit_ranks"] == [3]
    assert finding["stacks"][0]["ranks"] == [3] and finding["stacks"][0]["frames"][0]["name"] == "broadcast"
    assert finding["culprit_frames"][0]["name"] == "broadcast"


def test_a_stack_is_printed_once_and_named_after_that():
    code, stdout, _ = run_cli("analyze", str(SAMPLES / "nccl" / "pipeline_stage_stopped"))
    assert code == 1
    assert stdout.count("stack of rank 8 (innermost first):") == 1
    assert "stack of rank 8: as in finding 1" in stdout


def test_a_gloo_ranks_last_op_never_reads_as_stuck_there():
    code, stdout, _ = run_cli("analyze", str(SKIP))
    said = " ".join(stdout.split())
    assert code == 1
    assert "rank 2's last op recorded: all_reduce #4 of tp (pg 2), state unknown: gloo records no completion" in said
    assert ", scheduled" not in said


def test_the_root_cause_of_a_send_without_its_recv_is_said_as_such():
    verdict = _report(str(SAMPLES / "nccl" / "pipeline_stage_stopped"))["verdict"]
    assert verdict["category"].startswith("a send or recv was never matched")
    assert _report(str(SAMPLES / "gloo" / "order_swap"))["verdict"]["category"].startswith(
        "ranks issued different collectives at the same point"
    )


def test_every_verdict_ends_with_its_next_step(tmp_path: Path):
    _, stdout, _ = run_cli("analyze", str(SKIP))
    next_part = " ".join(stdout.split("\nNext:\n", 1)[1].split())
    assert "py-spy dump --pid <its pid> > pyspy_rank_2.txt" in next_part
    assert f"fr2perfetto convert {SKIP} -o hang.pftrace --open" in next_part
    # where the capture helper's rank file says where rank 2 runs, the command is exact
    folder = tmp_path / "dumps"
    shutil.copytree(SKIP, folder)
    rank_file = {"rank": 2, "host": "node7", "pid": 4242, "start": 1, "run": "r", "signal": 10}
    (folder / "fr_pid_rank_2").write_text(json.dumps(rank_file))
    report = _report(str(folder))
    assert report["next_steps"][0].startswith("See where rank 2 is now, on node7: py-spy dump --pid 4242 >")
    slow = _report(str(SAMPLES / "nccl" / "straggler"))["next_steps"]
    assert "'enqueue lateness · default_pg (pg 0) · rank 6'" in slow[1]
    assert _report(str(SAMPLES / "gloo" / "healthy"))["next_steps"][0].startswith("Nothing in these dumps is wrong")


def test_how_a_rank_ended_is_read_and_an_exception_names_it(tmp_path: Path):
    folder = tmp_path / "dumps"
    shutil.copytree(SAMPLES / "gloo" / "healthy", folder)
    (folder / "gloo_trace_rank_1.ended").write_text("exception: ValueError: loss is NaN on rank 1\n")
    (folder / "gloo_trace_rank_0.ended").write_text("running\n")
    report = _report(str(folder))
    assert [(e["rank"], e["kind"], e["line"]) for e in report["log_events"]] == [
        (1, "exception", "ValueError: loss is NaN on rank 1")
    ]
    assert report["verdict"]["status"] != "healthy" and report["verdict"]["culprit_ranks"][:1] == [1]
    code, stdout, _ = run_cli("info", str(folder))
    assert code == 0 and "ended" in stdout and "exception:" in stdout and "running" in stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["analyze", str(SKIP), "--json", "--format", "markdown"], "--json and --format markdown ask for two formats"),
        (["convert", str(SKIP), "-o", "{tmp}/noext"], "noext: the name says no format: end it with one of .pftrace"),
        (["convert", str(SKIP), "-o", "{tmp}/t.txt"], "t.txt: the name says no format"),
        (["open", str(SKIP / "gloo_trace_rank_0")], "a Flight Recorder dump, not a trace: convert it first"),
        (["open", str(ROOT / "README.md")], "README.md: not a trace"),
        (["open", "{tmp}/t.pftrace", "--url", "ftp://x"], "--url: 'ftp://x' is not an http(s) address"),
        (["analyze", "{tmp}/nosuch"], "nosuch: no such file or directory"),
        (["analyze", "{tmp}/empty"], "empty: an empty folder"),
        (["analyze", "{tmp}/*.nope"], "the pattern matches no file"),
        (["analyze", "{tmp}/unrelated"], "unrelated: no Flight Recorder dump among its 3 files (no rank in its name: "),
        (["analyze", str(SKIP), "--keep-names"], "--keep-names only applies with --redact"),
        (["info", str(SKIP), "--keep-names"], "--keep-names only applies with --redact"),
        (["convert", str(SKIP), "-o", "{tmp}/kept.pftrace", "--keep-names"], "--keep-names only applies with --redact"),
    ],
)
def test_every_bad_choice_gets_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str):
    (tmp_path / "empty").mkdir()
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    for name in ("notes.md", "data.bin", "weights.ckpt"):
        (unrelated / name).write_text("x")
    shutil.copy(SKIP / "gloo_trace_rank_0", tmp_path / "t.pftrace")  # a dump under a trace's name
    if "ftp://x" in args:
        assert run_cli("convert", str(SKIP), "-o", str(tmp_path / "t.pftrace"), "-q")[0] == 0
    code, _, stderr = run_cli(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 2 and said in stderr and stderr.count("\n") == 1, stderr
    if "unrelated" in args[-1]:
        assert "notes.md" in stderr and "dumps are named like nccl_trace_rank_0" in stderr


def test_a_size_limit_not_met_is_said_and_ranks_chosen_are_not_called_folded(tmp_path: Path):
    out = str(tmp_path / "t.pftrace")
    code, stdout, stderr = run_cli("convert", str(SAMPLES / "nccl" / "pipeline_1f1b"), "-o", out, "--max-size", "0.01")
    assert code == 0 and re.search(r"over --max-size 0\.01 MB by [\d.]+ KB", stderr)
    code, stdout, _ = run_cli("convert", str(SAMPLES / "nccl" / "pipeline_1f1b"), "-o", out, "--ranks", "0-3")
    assert code == 0 and "Shown: only ranks 0-3 (--ranks)." in stdout and "Folded" not in stdout


def test_one_ranks_dump_alone_is_not_every_op_matched_on_every_rank(tmp_path: Path):
    shutil.copy(SKIP / "gloo_trace_rank_0", tmp_path / "gloo_trace_rank_0")
    verdict = _report(str(tmp_path))["verdict"]
    assert "every op matched" not in verdict["summary"]
    assert verdict["summary"].startswith("healthy: only rank 0's dump was read")


def test_counts_are_said_in_good_english():
    _, stdout, _ = run_cli("analyze", str(SAMPLES / "nccl" / "straggler"))
    assert "8 dumps read, 8 ranks, 1 group, 30 ops" in stdout
    assert "1 groups" not in stdout and "(median)," not in stdout


def _command(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """The command as a person runs it, in a terminal of ``columns`` without colour (bold and italic,
    which NO_COLOR leaves, taken out)."""
    environment = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "TTY_COMPATIBLE": "1"}
    done = subprocess.run([sys.executable, "-m", "fr2perfetto", *args], capture_output=True, text=True,
                          cwd=ROOT, env=environment, timeout=120)  # fmt: skip
    done.stdout = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    return done


def test_help_names_values_not_python_types_at_80_columns():
    for command in ("convert", "analyze", "open", "info", "trigger"):
        text = _command(command, "--help").stdout
        assert not re.search(r"<(bool|str|list\[str\]|int range|float|path)>", text), (command, text)
        usage = next(line for line in text.splitlines() if "Usage:" in line)
        assert "{" not in usage and "<" not in usage, usage
        assert all(len(line) <= 80 for line in text.splitlines())
    convert = _command("convert", "--help").stdout
    assert "fr2perfetto convert [OPTIONS] DUMPS..." in convert
    jobs = convert[convert.index("--jobs") :].split("--quiet")[0]
    assert "default: 0" not in jobs and "one per core" in " ".join(jobs.split())


def test_wrapped_lines_keep_their_indent():
    _, stdout, _ = run_cli("analyze", str(SAMPLES / "nccl" / "straggler"))
    lines = stdout.splitlines()
    for number, line in enumerate(lines[:-1]):
        if line.startswith("  • ") and lines[number + 1].strip() and not lines[number + 1].startswith(("  • ", "  ")):
            pytest.fail(f"a bullet's wrapped line lost its indent: {lines[number + 1]!r}")
    assert any(line.startswith("    ") and not line.startswith("     ") for line in lines)


def test_redact_keeps_torchs_and_pythons_own_frames_readable():
    frames = [f["filename"] for f in _report(str(SKIP), "--redact")["findings"][0]["stacks"][0]["frames"]]
    assert "<site-packages>/torch/distributed/distributed_c10d.py" in frames
    assert "<python>/multiprocessing/process.py" in frames
    assert not any("gloo_jobs" in f or "/job/" in f for f in frames)


def test_the_readmes_first_screen_says_what_to_run_and_shows_what_it_prints():
    readme = (ROOT / "README.md").read_text()
    first_screen = "\n".join(readme.splitlines()[:60])
    block = first_screen.split("$ fr2perfetto analyze samples/gloo/skip\n", 1)[1].split("```", 1)[0]
    result = _command("analyze", "samples/gloo/skip", columns=100)
    assert result.returncode == 1 and block == result.stdout
    install = readme.split("## Install", 1)[1].split("##", 1)[0]
    assert "make install" in install and ". .venv/bin/activate" in install and "Python 3.10" in install
    assert "pip install 'fr2perfetto" not in readme  # not on PyPI: nothing says it is


def test_the_project_says_how_to_work_on_it():
    make_help = subprocess.run(["make", "-s", "help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    targets = {line.split()[0] for line in make_help.stdout.splitlines() if line.strip()}
    assert {"install", "test", "test-fast", "lint", "demo", "bench", "samples", "proto"} <= targets
    assert (
        "Apache License" in (ROOT / "LICENSE").read_text()
        and 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    )
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert "make test-fast" in contributing and "python -m pytest tests/test_analyze.py" in contributing
    assert "dist/" in (ROOT / ".gitignore").read_text().split()


PAIR_SKIP = SAMPLES / "gloo" / "pair_skip"  # pairs made by new_group without a name: PyTorch says "undefined"


def _said(text: str) -> str:
    """Text as read: wrapped lines joined."""
    return " ".join(text.split())


def test_a_group_made_without_a_name_is_called_unnamed_never_undefined(tmp_path: Path):
    code, stdout, _ = run_cli("analyze", str(PAIR_SKIP))
    assert code == 1 and "undefined" not in stdout
    assert "rank 4 waits in all_reduce #3 of an unnamed group (pg 3, 2 ranks) for rank 5." in _said(stdout)
    code, markdown, _ = run_cli("analyze", str(PAIR_SKIP), "--format", "markdown")
    assert code == 1 and "undefined" not in markdown and "an unnamed group (pg 3, 2 ranks)" in markdown
    # and in the trace: every track's name and description (what a group's desc says stays in its slices' args)
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    out = tmp_path / "t.pftrace"
    assert run_cli("convert", str(PAIR_SKIP), "-o", str(out), "-q")[0] == 0
    trace = pb.Trace()
    trace.ParseFromString(out.read_bytes())
    tracks = [p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")]
    names = {t.name or t.static_name for t in tracks}
    assert not [text for t in tracks for text in (t.name, t.static_name, t.description) if "undefined" in text]
    assert "pg 3 · 2 ranks" in names and "enqueue lateness · unnamed group (pg 3) · rank 4" in names


def test_what_the_capture_helper_wrote_when_a_rank_ended_is_called_its_ended_file(tmp_path: Path):
    folder = tmp_path / "dumps"
    shutil.copytree(SAMPLES / "gloo" / "healthy", folder)
    (folder / "gloo_trace_rank_1.ended").write_text("exception: ValueError: loss is NaN on rank 1\n")
    code, stdout, _ = run_cli("analyze", str(folder))
    said = _said(stdout)
    assert code == 1 and "'s log" not in said and "its log says" not in said
    ended = folder / "gloo_trace_rank_1.ended"
    assert f"rank 1's .ended file (written by fr2perfetto.capture: {ended}): ValueError: loss is NaN" in said
    assert "(its log or .ended file says which)" in said
    # a rank that left no dump, only its .ended file: the verdict quotes that file as such
    folder = tmp_path / "lost"
    shutil.copytree(SKIP, folder)
    (folder / "gloo_trace_rank_2").unlink()
    (folder / "gloo_trace_rank_2.ended").write_text("exception: RuntimeError: CUDA out of memory\n")
    code, stdout, _ = run_cli("analyze", str(folder))
    said = _said(stdout)
    assert code == 1 and "rank 2's .ended file says: RuntimeError: CUDA out of memory" in said and "'s log" not in said
    assert "a rank crashed (its log or .ended file says why) and left no dump" in said


def test_a_deadlock_that_names_both_ranks_says_why_both(tmp_path: Path):
    code, stdout, _ = run_cli("analyze", str(SAMPLES / "gloo" / "deadlock"))
    said = _said(stdout)
    assert code == 1 and "culprit ranks 0, 1" in said
    assert (
        "ranks 0 and 1 wait for each other, a cycle: either side's order of ops may be the bug, and no rank's order "
        "differs from its peers', so the dumps cannot say which side to fix. Both are named: fix the one whose order "
        "differs from the program's."
    ) in said
    # where the other pairs show whose order is wrong, that rank alone is blamed first, and nothing says it cannot tell
    _, stdout, _ = run_cli("analyze", str(PAIR_SKIP))
    assert "cannot say which side" not in stdout and "Both are named" not in stdout


def test_the_stacks_a_next_step_points_at_are_counted_right():
    from dataclasses import replace

    from fr2perfetto.convert import analyse
    from fr2perfetto.diagnose.next_steps import next_steps
    from fr2perfetto.read.job import load_job

    code, stdout, _ = run_cli("analyze", str(SAMPLES / "gloo" / "size_mismatch"))
    said = _said(stdout)
    assert code == 1 and said.count("stack of rank 3 (innermost first):") == 1
    assert "called op #2 (the stack of rank 3 above): they passed different tensors to it." in said
    assert "the stacks above" not in said
    # two stacks shown: "the stacks above"
    analysis = analyse(load_job([str(SAMPLES / "gloo" / "size_mismatch")]))
    finding = analysis.diagnosis.findings[0]
    (ranks, frames), *_ = finding.stacks
    analysis.diagnosis.findings[0] = replace(finding, stacks=((ranks, frames), ((0,), frames[1:])))
    steps = next_steps(analysis.job, analysis.diagnosis, ["dumps"])
    assert "called op #2 (the stacks above):" in steps[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ranks", "0-3"], "the op that hung the job, all_reduce #4 of tp (pg 2) on rank 5: add 5 to --ranks"),
        (["--groups", "dp"], "the op that hung the job, all_reduce #4 of tp (pg 2): add tp to --groups to include it"),
        (["--ranks", "0", "--groups", "dp"], "on rank 5: add 5 to --ranks and tp to --groups to include it"),
        (["--ranks", "4-7", "--groups", "tp"], None),
        (["--ranks", "5"], None),
    ],
)
def test_a_trace_chosen_without_the_op_that_hung_the_job_says_so(tmp_path: Path, args: list[str], said: str | None):
    out = tmp_path / "t.pftrace"
    code, _, stderr = run_cli("convert", str(SAMPLES / "nccl" / "demo"), "-o", str(out), *args)
    assert code == 0 and out.exists()
    warnings = [line for line in stderr.splitlines() if "leaves out" in line]
    if said is None:
        assert not warnings, stderr
    else:
        assert len(warnings) == 1 and warnings[0].startswith("warning: the trace leaves out ") and said in warnings[0]
    # a straggler's verdict names a rank, not an op that hung
    code, _, stderr = run_cli("convert", str(SAMPLES / "nccl" / "straggler"), "-o", str(out), "--ranks", "0-1", "-q")
    assert code == 0 and "the trace leaves out rank 6, which the verdict names: add 6 to --ranks" in stderr


def test_keep_names_with_redact_is_taken():
    code, stdout, stderr = run_cli("analyze", str(SKIP), "--redact", "--keep-names")
    assert code == 1 and "--keep-names" not in stderr and "gloo_jobs.py" in stdout and "/job/" not in stdout


def test_every_environment_variable_is_documented_in_one_place():
    documented = (ROOT / "docs" / "environment.md").read_text()
    sources = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").glob("*.py"), ROOT / "Makefile"]
    named = {name for path in sources for name in re.findall(r"\b(?:FR2PERFETTO|TORCH)_[A-Z_]+[A-Z]", path.read_text())}
    named -= {"FR2PERFETTO_ASCII"}  # not a variable: a codec error handler's name
    missing = sorted(name for name in named if f"`{name}`" not in documented)
    assert not missing, f"not in docs/environment.md: {missing}"


def _project_url(label: str) -> str:
    """A URL of the installed package's metadata ([project.urls] of pyproject.toml), by its label."""
    from importlib.metadata import metadata

    urls = dict(entry.split(", ", 1) for entry in metadata("fr2perfetto").get_all("Project-URL") or [])
    return urls[label]


def test_an_internal_error_exits_70_in_one_line_with_its_traceback_saved_privately(tmp_path: Path):
    from fr2perfetto import __version__
    from fr2perfetto.cli import EXIT_INTERNAL_ERROR, FORCE_INTERNAL_ERROR, ISSUES_URL

    environment = {**os.environ, FORCE_INTERNAL_ERROR: "1", "TMPDIR": str(tmp_path), "COLUMNS": "80"}
    done = subprocess.run([sys.executable, "-m", "fr2perfetto", "info", str(SKIP)], capture_output=True, text=True,
                          env=environment, timeout=120)  # fmt: skip
    assert done.returncode == EXIT_INTERNAL_ERROR == 70 and done.stdout == ""
    assert _project_url("Issues") == ISSUES_URL
    said = re.fullmatch(
        rf"fr2perfetto {re.escape(__version__)}: internal error \(RuntimeError\): please report it at "
        rf"{re.escape(ISSUES_URL)}, with the traceback saved in (\S+)\n",
        done.stderr,
    )
    assert said, done.stderr  # one line, and no traceback on the terminal
    saved = Path(said.group(1))
    assert saved.parent == tmp_path and saved.name.startswith("fr2perfetto-crash-") and saved.suffix == ".txt"
    assert saved.stat().st_mode & 0o777 == 0o600
    text = saved.read_text()
    assert f"command: fr2perfetto info {SKIP}" in text and "Traceback (most recent call last):" in text
    assert f"RuntimeError: {FORCE_INTERNAL_ERROR} is set" in text.splitlines()[-1]


def test_an_internal_error_whose_traceback_cannot_be_saved_still_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    import tempfile

    from fr2perfetto import cli

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))  # where mkstemp writes: no such folder
    assert cli._internal_error(ValueError("\x1b[2J from a dump")) == cli.EXIT_INTERNAL_ERROR
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "\x1b" not in stderr
    assert "internal error (ValueError)" in stderr and "the traceback could not be saved (No such file" in stderr


def test_every_command_says_its_exit_codes_in_its_help():
    for command in ("convert", "analyze", "open", "info", "trigger"):
        code, stdout, _ = run_cli(command, "--help")
        said = _said(stdout)
        assert code == 0 and "Exit codes: 0 " in said and "70 internal error" in said, command
        assert "130 interrupted" in said and "141 standard output closed early" in said, command
    assert "3 undecided" in _said(run_cli("analyze", "--help")[1])
    assert "0 trace written (whatever the verdict" in _said(run_cli("convert", "--help")[1])


def test_the_readme_lists_every_exit_code():
    from fr2perfetto.cli import EXIT_INTERNAL_ERROR, EXIT_READER_LEFT, EXIT_UNUSABLE
    from fr2perfetto.diagnose.verdict import EXIT_FINDINGS, EXIT_HEALTHY, EXIT_UNDECIDED

    section = (ROOT / "README.md").read_text().split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    codes = {row.split("|")[1].strip() for row in section.splitlines() if row.startswith("| ")}
    expected = {EXIT_HEALTHY, EXIT_FINDINGS, EXIT_UNUSABLE, EXIT_UNDECIDED, EXIT_INTERNAL_ERROR, EXIT_READER_LEFT}
    assert {str(code) for code in expected} | {"130", "128 + N"} <= codes


def test_the_version_is_one_number_the_command_and_the_package_metadata_agree_on():
    from importlib.metadata import version

    import fr2perfetto

    printed = _command("--version").stdout.split()
    assert printed[:2] == ["fr2perfetto", version("fr2perfetto")] and printed[1] == fr2perfetto.__version__
    project = (ROOT / "pyproject.toml").read_text().split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    assert 'dynamic = ["version"]' in project and not re.search(r"^version\s*=", project, re.M)


def test_the_readmes_links_work_away_from_the_repository():
    # PyPI shows the README without the repository beside it: a relative link or picture would be broken there
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r"""src=["']([^"']+)""", readme)
    assert targets and all(target.startswith(("https://", "#")) for target in targets), [
        target for target in targets if not target.startswith(("https://", "#"))
    ]
    pictures = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme)
    raw = "https://raw.githubusercontent.com/fr2perfetto/fr2perfetto/"
    assert pictures and all(picture.startswith(raw) for picture in pictures)
    assert _project_url("Source") == "https://github.com/fr2perfetto/fr2perfetto"
    assert _project_url("Changelog").endswith("/CHANGELOG.md") and (ROOT / "CHANGELOG.md").is_file()
