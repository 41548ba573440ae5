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


@pytest.mark.parametrize("command", ["info", "analyze"])
def test_terminal_output_fits_80_columns_with_whole_headers(command: str):
    from typer.testing import CliRunner

    from fr2perfetto.cli import app

    result = CliRunner().invoke(app, [command, str(DEMO)], env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code in (0, 1, 3)
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert not re.search(r"\w…", result.stdout), "a word cut short"  # "…/torch/x.py" abbreviates a path
    assert "\x1b[" not in result.stdout  # plain text for a non-terminal
    if command == "info":
        # each column is shown with its whole header, or named among those left out to fit
        text = " ".join(result.stdout.split())
        for header in ("rank", "file", "version", "format", "backend", "entries", "group", "desc", "size", "members"):
            assert header in text, header


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
