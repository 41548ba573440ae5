"""The UI lands on the problem: ranks in rank order, culprits named where the UI shows names, a link that
frames the first finding, a report to paste, terminal output that fits, samples that say nothing of the
machine that made them."""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from fr2perfetto.convert import analyse, write_trace
from fr2perfetto.layout.timeline import PID_BASE
from fr2perfetto.read.job import load_job

from .conftest import ROOT, run_cli
from .tracecheck import read_trace

SAMPLES = sorted(p.parent for p in (ROOT / "samples").glob("*/*/*rank*") if p.is_file())
SAMPLES = sorted(set(SAMPLES))
DEMO = ROOT / "samples" / "nccl" / "demo"


def _name(sample: Path) -> str:
    return str(sample.relative_to(ROOT / "samples"))


def test_samples_are_found():
    names = {_name(s) for s in SAMPLES}
    assert {"nccl/demo", "nccl/missing_dump", "gloo/healthy", "gloo/grid_3d_skip"} <= names
    assert len(SAMPLES) >= 20


@pytest.mark.parametrize("sample", SAMPLES, ids=_name)
def test_every_sample_trace_orders_ranks_and_names_culprits(sample: Path, tmp_path: Path):
    analysis = analyse(load_job([str(sample)]))
    out = tmp_path / "t.pftrace"
    write_trace(analysis, str(out))
    trace = read_trace(str(out))
    assert trace.explicit_process_order, "the root descriptor does not ask for explicit process order"
    ranks = sorted(analysis.job.ranks)
    assert sorted(n for n in trace.processes.values()) == sorted(f"rank {r}" for r in ranks)
    # every process has an order, and ordering by it gives the ranks in numeric order
    assert set(trace.process_order) == set(trace.processes.values())
    by_order = sorted(trace.process_order, key=trace.process_order.get)
    assert by_order == [f"rank {r}" for r in ranks]
    culprits = set(analysis.diagnosis.verdict.culprit_ranks)
    for rank in ranks:
        title = trace.titles[f"rank {rank}"]
        if rank in culprits:
            assert title == f"rank {rank} · CULPRIT"
        elif rank in analysis.job.missing_ranks:
            assert title == f"rank {rank} · no dump"
        else:
            assert title == f"rank {rank}"
    # a rank without a dump is on screen: one of its tracks holds an event
    for rank in analysis.job.missing_ranks:
        process = next(u for u, (n, parent) in trace.tracks.items() if n == f"rank {rank}" and parent is None)
        children = [u for u, (_, parent) in trace.tracks.items() if parent == process]
        events = sum(len(trace.slices.get(u, [])) + len(trace.instants.get(u, [])) for u in children)
        assert events >= 1, f"rank {rank} has no dump and no event"


def test_a_rank_without_a_dump_shows_where_the_others_wait(tmp_path: Path):
    sample = ROOT / "samples" / "nccl" / "missing_dump"
    analysis = analyse(load_job([str(sample)]))
    assert analysis.job.missing_ranks == [3]
    out = tmp_path / "t.pftrace"
    write_trace(analysis, str(out))
    trace = read_trace(str(out))
    [track] = [u for u, (n, parent) in trace.tracks.items() if n == "no dump" and parent is not None]
    assert trace.process_of(track) == "rank 3"
    [(start, end, name, args)] = trace.slices[track]
    assert name.startswith("no dump: the others wait for it in ") and "#" in name
    assert start < end and args["status"] == "this rank left no dump"


def _link_parts(link: str) -> dict[str, str]:
    assert link.startswith("https://ui.perfetto.dev/#!/?")
    return dict(urllib.parse.parse_qsl(link.split("#!/?", 1)[1], keep_blank_values=True))


def test_open_url_links_to_the_trace_there_framing_the_first_finding_on_demo(tmp_path: Path):
    trace_path = tmp_path / "demo.pftrace"
    code, _, stderr = run_cli("convert", str(DEMO), "-o", str(trace_path), "-q")
    assert code == 0, stderr
    code, stdout, stderr = run_cli("open", str(trace_path), "--url", "https://example.org/t.pftrace")
    assert code == 0, stderr
    [link] = [line for line in stdout.splitlines() if line.startswith("https://")]
    args = _link_parts(link)
    assert args["url"] == "https://example.org/t.pftrace"
    start, end = int(args["visStart"]), int(args["visEnd"])
    trace = read_trace(str(trace_path))

    # the window holds the first finding's op (all_reduce #4 of tp, pg 2) on the culprit and its peers,
    # and lies within the trace (the UI ignores a window that does not)
    analysis = analyse(load_job([str(DEMO)]))
    assert list(analysis.diagnosis.verdict.culprit_ranks) == [5]
    in_op = [
        (trace.process_of(uuid), t)
        for uuid, items in trace.instants.items()
        for t, name in items
        if "all_reduce #4" in name
    ] + [(trace.process_of(uuid), s) for uuid, s, _, name, _ in trace.all_slices() if "all_reduce #4" in name]
    ranks_in_op = {process for process, _ in in_op}
    assert {"rank 4", "rank 5", "rank 6", "rank 7"} <= ranks_in_op
    for process, t in in_op:
        if process in {"rank 4", "rank 5", "rank 6", "rank 7"}:
            assert start <= t <= end, f"{process}'s part of the op at {t} is outside [{start}, {end}]"
    first_event = min([s for _, s, _, _, _ in trace.all_slices()] + [t for i in trace.instants.values() for t, _ in i])
    last_event = max(e for _, _, e, _, _ in trace.all_slices())
    assert first_event <= start < end <= last_event

    # the selected slice is the first finding, and the first slice with that start and duration
    ts, dur = int(args["ts"]), int(args["dur"])
    matching = sorted((uuid, name) for uuid, s, e, name, _ in trace.all_slices() if s == ts and e - s == dur)
    assert matching and matching[0][1].startswith("missing: rank 5 never issued all_reduce #4")
    assert trace.tracks[matching[0][0]][0] == "1. missing"

    # expand and pin: exactly the culprit's process (as the UI titles it, "<name> <pid>") and Findings
    commands = json.loads(args["startupCommands"])
    assert [c["id"] for c in commands] == ["dev.perfetto.ExpandTracksByRegex", "dev.perfetto.PinTracksByRegex"]
    ui_names = [f"{trace.titles[name]} {pid}" for pid, name in trace.processes.items()]
    ui_names += [name for name, parent in trace.tracks.values() if parent is not None or name == "Findings"]
    for command in commands:
        pattern, mode = command["args"]
        assert mode == "name"
        matched = {name for name in ui_names if re.search(pattern, name)}
        assert matched == {"Findings", f"rank 5 · CULPRIT {PID_BASE + 5}"}


def test_open_url_on_a_healthy_trace_has_no_focus(tmp_path: Path):
    trace_path = tmp_path / "healthy.pftrace"
    assert run_cli("convert", str(ROOT / "samples" / "gloo" / "healthy"), "-o", str(trace_path), "-q")[0] == 0
    code, stdout, _ = run_cli("open", str(trace_path), "--url", "https://example.org/t.pftrace")
    args = _link_parts(stdout.strip())
    assert code == 0 and "visStart" not in args and "startupCommands" not in args


@pytest.mark.parametrize("damage", ["corrupt packet", "focus of the wrong shape"])
def test_open_url_on_a_damaged_trace_opens_it_unframed(tmp_path: Path, damage: str):
    from fr2perfetto.layout.focus import METADATA_NAME, metadata_packet

    if damage == "corrupt packet":  # a packet whose length runs past what it holds
        data = b"\x0a\x05\x0a\x10abc"
    else:
        packet = metadata_packet({"visStart": "soon", "visEnd": [], "pin": 3, "expand": None}, 1)
        assert METADATA_NAME.encode() in packet
        data = b"\x0a" + bytes([len(packet)]) + packet
    trace_path = tmp_path / "damaged.pftrace"
    trace_path.write_bytes(data)
    code, stdout, stderr = run_cli("open", str(trace_path), "--url", "https://example.org/t.pftrace")
    args = _link_parts(stdout.strip())
    assert code == 0 and "Traceback" not in stderr
    assert args["url"] == "https://example.org/t.pftrace" and "visStart" not in args and "startupCommands" not in args


def test_open_over_ssh_prints_the_port_forwarding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    trace_path = tmp_path / "demo.pftrace"
    assert run_cli("convert", str(DEMO), "-o", str(trace_path), "-q")[0] == 0
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.2 52344 10.0.0.7 22")
    import fr2perfetto.cli as cli

    served = {}

    def fake_serve_once(path, port, announce, serve=True, open_browser=None, **_):
        served["opened"] = open_browser("x") if open_browser else None
        announce(f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/t/demo.pftrace", False)
        return True

    monkeypatch.setattr(cli, "serve_once", fake_serve_once)
    code, stdout, _ = run_cli("open", str(trace_path), "--port", "9001")
    assert code == 0
    assert served["opened"] is False  # no browser is tried on the remote machine
    assert re.search(r"^  ssh -L 9001:127\.0\.0\.1:9001 \S+$", stdout, re.M), stdout
    assert "Open this link in a browser there" in stdout


def _markdown(sample: Path, *extra: str) -> str:
    code, stdout, stderr = run_cli("analyze", str(sample.relative_to(ROOT)), "--format", "markdown", *extra)
    assert code in (0, 1, 3), stderr
    return stdout


@pytest.mark.parametrize("sample", SAMPLES, ids=_name)
def test_markdown_report_renders_with_its_culprit_table(sample: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)
    analysis = analyse(load_job([str(sample)]))
    text = _markdown(sample)
    html = MarkdownIt("commonmark").enable("table").render(text)
    assert html.startswith("<h2>fr2perfetto verdict: ")
    culprits = analysis.diagnosis.verdict.culprit_ranks
    if culprits:
        assert "<table>" in html
        header = re.search(r"<thead>(.*?)</thead>", html, re.S).group(1)
        # a host column only where the culprits' hosts are known (a column that would be empty is left out)
        columns = re.findall(r"<th[^>]*>(.*?)</th>", header)
        assert [c for c in columns if c != "host"] == ["rank", "group", "op", "state", "why"]
        assert ("host" in columns) == any(analysis.job.host_of(rank) for rank in culprits)
        body = re.search(r"<tbody>(.*?)</tbody>", html, re.S).group(1)
        rows = re.findall(r"<tr>\s*<td[^>]*>(\d+)</td>", body)
        assert [int(r) for r in rows] == list(culprits)[:32]
        cells = re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
        assert all(cell.strip() for cell in cells), "an empty cell"
    else:
        assert "<table>" not in html
    # GitHub links #4 to issue 4 and @name to a person in any text outside code: none may be left there
    gfm = MarkdownIt("gfm-like").render(text)
    outside_code = re.sub(r"<(code|pre)>.*?</\1>", "", gfm, flags=re.S)
    assert not re.search(r"(?<![\w&])#\d+", outside_code), re.findall(r".{30}(?<![\w&])#\d+.{10}", outside_code)
    assert not re.search(r"(?<![\w/])@[A-Za-z]", outside_code)
    assert "fr2perfetto analyze samples/" in text and "--format markdown" in text


def test_markdown_report_golden(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)
    from fr2perfetto import __version__

    text = _markdown(Path("samples/nccl/demo").resolve())
    golden = (ROOT / "tests" / "golden" / "demo.md").read_text().replace("{version}", __version__)
    assert text == golden


def test_markdown_report_redacted_names_no_host_and_no_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.chdir(ROOT)
    text = _markdown(DEMO, "--redact")
    assert "analyze &lt;dumps&gt; --format markdown --redact" in text and "samples/nccl" not in text
    assert "/job/train.py" not in text and "train.py" not in text


def test_format_json_is_json_and_unknown_format_is_refused():
    code, stdout, _ = run_cli("analyze", str(DEMO), "--format", "json")
    assert code == 1 and json.loads(stdout)["verdict"]["culprit_ranks"] == [5]
    code, _, stderr = run_cli("analyze", str(DEMO), "--format", "html")
    assert code != 0 and "--format" in stderr and stderr[-1] == "\n" and stderr.count("\n") == 1


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _invoke(args: list[str], columns: int, terminal: bool = False) -> tuple[int, str, str]:
    """Run the CLI in-process at ``columns`` columns, its output a terminal (rich's ``TTY_COMPATIBLE``)
    or not (as piped); return (exit code, stdout without escape sequences, stderr)."""
    from typer.testing import CliRunner

    from fr2perfetto.cli import app

    env = {"COLUMNS": str(columns), "NO_COLOR": "1", "TTY_COMPATIBLE": "1" if terminal else "0"}
    result = CliRunner().invoke(app, args, env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    if not terminal:
        assert "\x1b[" not in result.stdout  # plain text for a non-terminal
    return result.exit_code, ANSI.sub("", result.stdout), result.stderr


@pytest.mark.parametrize("command", ["info", "analyze"])
def test_terminal_output_fits_80_columns_with_whole_headers(command: str):
    # info fits its tables to the width wherever it goes; analyze wraps its lines on a terminal only
    code, stdout, _ = _invoke([command, str(DEMO)], 80, terminal=command == "analyze")
    assert code in (0, 1, 3)
    lines = stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert not re.search(r"\w…", stdout), "a word cut short"  # "…/torch/x.py" abbreviates a path
    if command == "info":
        # each column is shown with its whole header, or named among those left out to fit
        text = " ".join(stdout.split())
        for header in ("rank", "file", "version", "format", "backend", "entries", "group", "desc", "size", "members"):
            assert header in text, header


DEMO_VERDICT = "hang: rank 5 never issued all_reduce #4 of tp (pg 2, 4 ranks); ranks 4,6-7 wait in it"


def test_piped_analyze_writes_each_line_whole_however_long():
    code, stdout, _ = _invoke(["analyze", str(DEMO)], 80)
    lines = stdout.splitlines()
    assert code == 1
    assert "fr2perfetto verdict:  HANG   culprit rank 5" in lines and DEMO_VERDICT in lines
    assert len(DEMO_VERDICT) > 80  # rich would break it at 80 columns
    [step] = [line for line in lines if "py-spy dump" in line]  # a bullet of the next steps, one line
    assert step.startswith("  • See where rank 5 is now") and step.endswith("with the snapshot beside the dumps.")
    assert not any(line.startswith("│") or line.startswith("╭") for line in lines)  # no box to grep through


def test_piped_quiet_analyze_is_one_line_for_grep():
    import os
    import subprocess
    import sys

    # as a person runs it: `fr2perfetto analyze -q samples/gloo/skip | grep rank`
    env = {**os.environ, "COLUMNS": "80"}
    env.pop("FORCE_COLOR", None), env.pop("TTY_COMPATIBLE", None)
    command = [sys.executable, "-m", "fr2perfetto", "analyze", "-q", str(ROOT / "samples" / "gloo" / "skip")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    [line] = [line for line in done.stdout.splitlines() if "rank" in line]
    assert line == "hang: rank 2 never issued all_reduce #4 of default_pg (pg 0, 4 ranks); ranks 0-1,3 wait in it"


STATUSES = ["hang", "mismatch", "healthy", "undecided", "crash", "slow"]


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "file"])
@pytest.mark.parametrize("width", [1, 10, 39])
@pytest.mark.parametrize("status", STATUSES)
def test_any_width_writes_the_status_word_whole(status: str, width: int, terminal: bool):
    import dataclasses
    import io

    from rich.console import Console

    from fr2perfetto.render.terminal import render_analysis

    analysis = analyse(load_job([str(DEMO)]))
    diagnosis = analysis.diagnosis
    diagnosis = dataclasses.replace(diagnosis, verdict=dataclasses.replace(diagnosis.verdict, status=status))
    written = io.StringIO()
    console = Console(file=written, width=width, force_terminal=terminal, no_color=True)
    render_analysis(console, analysis.job, diagnosis, len(analysis.ops))
    lines = ANSI.sub("", written.getvalue()).splitlines()
    assert re.search(rf"(^| ){status.upper()}( |$)", lines[0]), lines[:3]
    assert DEMO_VERDICT in lines  # nothing cut into pieces of the width


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
@pytest.mark.parametrize("command", ["analyze", "info"])
def test_a_terminal_one_column_wide_gets_no_traceback(command: str, terminal: bool):
    code, stdout, stderr = _invoke([command, str(DEMO)], 1, terminal=terminal)
    assert code == (1 if command == "analyze" else 0) and "Traceback" not in stderr
    if command == "analyze":  # info's tables cannot fit one column; the verdict's lines are written whole
        assert "HANG" in stdout.split() and DEMO_VERDICT in stdout.splitlines()


HEADERS = {"rank", "host", "file", "version", "format", "backend", "entries", "first op", "last op", "ended",
           "group", "desc", "size", "members", "with a dump"}  # fmt: skip


def _headers(stdout: str) -> list[list[str]]:
    """The header cells of each table printed (rich's heavy header row: ``┃ rank ┃ file ┃``)."""
    rows = [line.strip().strip("┃").split("┃") for line in stdout.splitlines() if line.startswith("┃")]
    return [[cell.strip() for cell in row] for row in rows]


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
@pytest.mark.parametrize("sample", ["nccl/demo", "gloo/torchrun_abort", "gloo/grid_3d_skip"])
def test_info_at_40_columns_keeps_each_header_whole(sample: str, terminal: bool):
    code, stdout, _ = _invoke(["info", str(ROOT / "samples" / sample)], 40, terminal=terminal)
    assert code == 0
    rank_headers, group_headers = _headers(stdout)
    for header in [*rank_headers, *group_headers]:
        assert header in HEADERS, f"a header cut: {header!r}"
    assert rank_headers[0] == "rank" and group_headers[0] == "group"
    assert "with a dump" in group_headers  # the last header, cut short at 40 columns before
    if sample == "gloo/torchrun_abort":
        assert "ended" in rank_headers  # how a rank ended stays: it may be why
    assert all(len(line) <= 40 for line in stdout.splitlines() if line.startswith(("┃", "│", "┏", "└")))


GRID = ROOT / "samples" / "gloo" / "grid_3d_skip"  # finding 1: ranks 5,7 in dp; finding 2: ranks 1,5 in pp
GRID_VERDICT = "hang: rank 5 never issued all_reduce #2 of dp (pg 12, 2 ranks); rank 7 waits in it"


@pytest.mark.parametrize(
    ("narrowing", "kept", "left", "said"),
    [
        (["--ranks", "1"], "2. missing", "1. missing", "Findings of rank 1 only (--ranks): 1 of 2 findings"),
        (["--ranks", "7"], "1. missing", "2. missing", "Findings of rank 7 only (--ranks): 1 of 2 findings"),
        (["--groups", "pp"], "2. missing", "1. missing", "Findings in group pp only (--groups): 1 of 2 findings"),
    ],
)
def test_analyze_narrowed_to_ranks_or_groups_keeps_the_jobs_verdict(
    narrowing: list[str], kept: str, left: str, said: str
):
    code, whole, _ = _invoke(["analyze", str(GRID)], 200)
    assert code == 1 and kept + "  culprit 5" in whole.splitlines() and left + "  culprit 5" in whole.splitlines()
    code, stdout, _ = _invoke(["analyze", str(GRID), *narrowing], 200)
    lines = stdout.splitlines()
    assert code == 1  # the job's, whatever is shown
    assert GRID_VERDICT in lines and said in lines
    assert kept + "  culprit 5" in lines  # under its number among the job's findings
    assert left + "  culprit 5" not in lines


def test_analyze_narrowed_in_json_and_markdown_too():
    code, stdout, _ = run_cli("analyze", str(GRID), "--ranks", "1", "--json")
    report = json.loads(stdout)
    assert code == 1 and report["verdict"]["summary"] == GRID_VERDICT
    assert [f["ranks"] for f in report["findings"]] == [[1, 5]]
    code, stdout, _ = run_cli("analyze", str(GRID), "--groups", "pp", "--format", "markdown")
    html = MarkdownIt("commonmark").render(stdout)
    assert code == 1 and GRID_VERDICT.split(":")[0] in html
    assert "Findings in group pp only (--groups): 1 of 2 findings." in stdout
    # finding 2 keeps its number where rendered: the list starts there
    assert re.findall(r"<ol[^>]*>", html) == ['<ol start="2">'] and "analyze samples" not in stdout
    assert "--groups pp</code>" in stdout


def test_analyze_all_lists_every_finding():
    many = ROOT / "samples" / "nccl" / "pipeline_stage_stopped"  # 17 findings
    numbered = re.compile(r"^\d+\. ", re.M)
    code, stdout, _ = _invoke(["analyze", str(many)], 200)
    assert code == 1 and len(numbered.findall(stdout)) == 12
    assert "17 findings; the first 12 shown, 5 more with --all (or in --json)." in stdout.splitlines()
    code, stdout, _ = _invoke(["analyze", str(many), "--all"], 200)
    assert code == 1 and len(numbered.findall(stdout)) == 17 and "--all" not in stdout


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--ranks", "x", "error: --ranks: 'x' is neither a rank nor a range of ranks (expected e.g. 0-7,85)"),
        ("--ranks", "99", "error: --ranks: no rank 99 in this job (its ranks: 0-7)"),
        ("--groups", "nope", "error: --groups: no group nope in this job"),
    ],
)
def test_analyze_refuses_ranks_or_groups_the_job_lacks_in_one_line(flag: str, value: str, said: str):
    code, stdout, stderr = run_cli("analyze", str(DEMO), flag, value)
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith(said), stderr


def test_no_sample_carries_the_path_of_the_machine_that_made_it():
    checkout = str(ROOT)
    home = str(Path.home())
    found = []
    for path in (ROOT / "samples").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for needle in {checkout, home, "/tmp/", "site-packages/torch/../"}:
                if needle.encode() in data and path.suffix != ".py":
                    found.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not found, found
    # the frames read as a job's would: a virtualenv, the standard library, the job's own folder
    data = b"".join(p.read_bytes() for p in (ROOT / "samples" / "gloo").rglob("*rank*"))
    assert b"/opt/venv/lib/python3.11/site-packages/torch/" in data and b"/job/samples/gloo_jobs.py" in data


@pytest.mark.parametrize(
    "command", [["analyze"], ["analyze", "--format", "markdown"], ["info"]], ids=["analyze", "markdown", "info"]
)
def test_an_ascii_only_output_gets_the_verdict_and_no_traceback(tmp_path: Path, command: list[str]):
    import os
    import subprocess
    import sys

    demo = Path(__file__).resolve().parent.parent / "samples" / "nccl" / "demo"
    env = {**os.environ, "LC_ALL": "C", "PYTHONIOENCODING": "ascii"}  # CI logs, cron, old terminals
    done = subprocess.run([sys.executable, "-m", "fr2perfetto", *command, str(demo)], env=env,
                          capture_output=True, timeout=300)  # fmt: skip
    assert b"Traceback" not in done.stderr and done.returncode == (0 if command == ["info"] else 1)
    text = done.stdout.decode("ascii")  # every byte is ASCII
    assert ("8 dumps, 8 ranks" if command == ["info"] else "rank 5 never issued") in text


def test_a_trace_into_a_folder_that_does_not_exist_is_refused_as_cp_would(tmp_path: Path):
    from .conftest import run_cli

    demo = Path(__file__).resolve().parent.parent / "samples" / "nccl" / "demo"
    target = tmp_path / "made" / "up" / "crash.pftrace"
    code, _, stderr = run_cli("convert", str(demo), "-o", str(target))
    assert code == 2 and f"its folder {target.parent} does not exist" in stderr.replace("\n", "")
    assert not (tmp_path / "made").exists()  # no folder made on the way


def _a_trace(tmp_path: Path) -> Path:
    trace_path = tmp_path / "skip.pftrace"
    assert run_cli("convert", str(ROOT / "samples" / "gloo" / "skip"), "-o", str(trace_path), "-q")[0] == 0
    return trace_path


def test_open_on_a_port_in_use_names_it_and_says_how_to_choose_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import socket

    from fr2perfetto import serve

    trace_path = _a_trace(tmp_path)
    # were the port free after all, the command would serve and wait: it stops at once, and the test fails
    monkeypatch.setattr(serve.webbrowser, "open_new_tab", lambda link: False)
    monkeypatch.setattr(serve._OneTraceServer, "handle_request", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, stdout, stderr = run_cli("open", str(trace_path), "--port", str(port))
    assert code == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert f"port {port} on 127.0.0.1 is in use" in stderr and "choose another port with --port PORT" in stderr


@pytest.mark.parametrize("shell", ["local, no display", "local", "ssh client only", "ssh tty only"])
def test_open_says_remote_shell_only_over_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shell: str):
    import fr2perfetto.cli as cli

    trace_path = _a_trace(tmp_path)
    for name in ("SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    if shell == "local":
        monkeypatch.setenv("DISPLAY", ":0")
    elif shell == "ssh client only":
        monkeypatch.setenv("SSH_CLIENT", "10.0.0.2 52344 22")
    elif shell == "ssh tty only":
        monkeypatch.setenv("SSH_TTY", "/dev/pts/3")
    tried = []

    def fake_serve_once(path, port, announce, open_browser=None, **_):
        tried.append(open_browser("x") if open_browser else "the browser module")
        announce(f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/t/skip.pftrace", False)  # none opened
        return True

    monkeypatch.setattr(cli, "serve_once", fake_serve_once)
    code, stdout, _ = run_cli("open", str(trace_path))
    assert code == 0 and "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/t/skip.pftrace" in stdout
    if shell.startswith("ssh"):
        assert tried == [False]  # no browser is tried on the remote machine
        assert "This is a remote shell" in stdout and "ssh -L 9001:127.0.0.1:9001 " in stdout
    else:
        assert tried == ["the browser module"]
        assert "remote" not in stdout and "ssh -L" not in stdout
        assert "No browser could be opened here: open this link in a browser on this machine" in stdout
