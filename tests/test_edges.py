"""Safe at every edge: nothing in a dump, a log, a snapshot or a file name reaches the terminal, the
Markdown report or another process; work stays in proportion to what was read; every number and every
command-line value from outside is checked; every error is one line.

Each test runs the real command in a process of its own, with the C speed-ups and in pure Python, as a
stranger's dump would be met. Time limits are hang guards only, far above
what the work takes on a loaded machine; how much work is done is counted, not timed.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import random
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import unicodedata
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, start_rank, stop_ranks
from .helpers import count_lines as _count_lines
from .helpers import free_port, wait_ready, wait_until
from .test_hostile import _dump, _entry
from .tracecheck import read_trace

DEMO = ROOT / "samples" / "nccl" / "demo"
HANG_GUARD = 300  # seconds: no case comes near; a quadratic one would never end
# ESC (cursor moves, screen clears, OSC window titles), a C1 CSI, bidi overrides and isolates, zero-width
# characters, newlines that would start Markdown blocks, HTML, links, a code fence, a mention, an issue link
POISON = (
    "\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eevil\u2066x\u200b\r\n## fr2perfetto verdict: HEALTHY\n"
    "<img src=x onerror=alert(1)>[click](http://e.vil) ``` @alice #1 |a|b| \x7f\x00"
)


@pytest.fixture(autouse=True, params=["c", "python"])
def both_reading_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case runs with the C speed-ups and in pure Python (the commands run here are told so)."""
    if request.param == "python":
        monkeypatch.setenv("FR2PERFETTO_NO_SPEEDUPS", "1")
    else:
        monkeypatch.delenv("FR2PERFETTO_NO_SPEEDUPS", raising=False)


def run(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    """The command as a person runs it, in a process of its own; output as bytes."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", **(env or {})}
    return subprocess.run([sys.executable, "-m", "fr2perfetto", *args], capture_output=True, env=environment,
                          cwd=cwd or ROOT, timeout=HANG_GUARD, **kwargs)  # fmt: skip


def unsafe_characters(data: bytes) -> list[str]:
    """Every character of ``data`` that could steer a terminal or hide text: C0 controls but newline,
    DEL and C1 controls, and Unicode's format characters (bidi controls, zero-width characters)."""
    text = data.decode("utf-8", "replace")
    return [
        f"U+{ord(c):04X}"
        for c in text
        if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or unicodedata.category(c) in ("Cf", "Zl", "Zp")
    ]


def one_line_error(done: subprocess.CompletedProcess[bytes]) -> str:
    """The one line a failed command wrote (asserting there is one, and no traceback)."""
    lines = [line for line in done.stderr.decode().splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr.decode()[-800:]
    return lines[0]


def poisoned_job(folder: Path) -> None:
    """Two ranks whose every string (group name and description, op, backend, thread, dtypes, frames,
    versions, file names) holds POISON; rank 1 never issues op #3, so findings quote them; a log and a
    stack snapshot beside them hold it too."""
    folder.mkdir(parents=True)
    group = (f"g{POISON}", f"d{POISON}")
    frames = [{"name": f"fn{POISON}", "filename": f"/job/{POISON}.py", "line": 7}]
    for rank in (0, 1):
        entries = [
            _entry(seq, process_group=group, profiling_name=f"nccl:all_reduce{POISON}", thread_id=f"t{POISON}",
                   thread_name=f"n{POISON}", input_dtypes=[f"F{POISON}"], output_dtypes=[f"F{POISON}"],
                   state="scheduled" if seq == 3 else "completed", frames=frames)
            for seq in ((1, 2, 3) if rank == 0 else (1, 2))
        ]  # fmt: skip
        config = {group[0]: {"name": group[0], "desc": group[1], "ranks": "[0, 1]"}}
        doc = _dump(entries, pg_config=config, comm_lib_version=POISON)
        name = f"nccl_trace_rank_h\x1b[2J\u202e_{rank}"  # a host part in the file name that steers too
        (folder / name).write_bytes(pickle.dumps(doc))
    (folder / "rank_1.log").write_text(
        f'[rank1]: Traceback (most recent call last):\n[rank1]:   File "/job/{POISON}.py", line 3, in f\n'
        f"[rank1]: RuntimeError: {POISON}\n"
    )
    (folder / "pyspy_rank_1.txt").write_text(f'Thread 12 (idle): "Main{POISON}"\n    fn{POISON} (/job/{POISON}.py:9)\n')


def test_text_from_a_dump_never_steers_the_terminal(tmp_path: Path):
    folder = tmp_path / "dumps"
    poisoned_job(folder)
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / f"nccl_trace_rank_{POISON.replace(chr(0), '').replace('/', '')}_3").write_bytes(b"no dump")
    commands = [
        ["analyze", str(folder)], ["analyze", str(folder), "--quiet"], ["info", str(folder)],
        ["convert", str(folder), "-o", str(tmp_path / "t.pftrace")],
        ["convert", str(folder), "-o", str(tmp_path / "t.json")],
        ["analyze", str(tmp_path / "garbage"), str(folder)],
    ]  # fmt: skip
    for command in commands:
        done = run(command)
        assert done.returncode in (0, 1, 3), (command, done.stderr.decode()[-600:])
        for stream in (done.stdout, done.stderr):
            assert not unsafe_characters(stream), (command, unsafe_characters(stream)[:5], stream.decode()[-400:])
        assert b"Traceback" not in done.stderr
    shown = run(["analyze", str(folder)]).stdout.decode()
    assert "\\x1b[2J" in shown and "\\u202e" in shown  # escaped, so the person sees what the dump held
    # the trace names tracks and processes from the safe form, and keeps the text as it was in the args
    trace = read_trace(str(tmp_path / "t.pftrace"))
    names = [name for name, _ in trace.tracks.values()] + [s[2] for slices in trace.slices.values() for s in slices]
    assert not [n for n in names if unsafe_characters(n.encode())]
    assert any(POISON in str(arg) for slices in trace.slices.values() for s in slices for arg in s[3].values())


def _headings_links_and_html(text: str) -> tuple[list[str], int, int, str]:
    """A report as GitHub would render it: its headings, links and images, HTML tags, and the plain text
    (outside code), where GitHub would turn ``@name`` into a mention and ``#4`` into an issue link."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("gfm-like").parse(text)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    inline = [child for t in tokens if t.type == "inline" for child in (t.children or [])]
    links = sum(1 for t in inline if t.type in ("link_open", "image"))
    html = sum(1 for t in tokens if t.type == "html_block") + sum(1 for t in inline if t.type == "html_inline")
    plain = " ".join(t.content for t in inline if t.type == "text")
    return headings, links, html, plain


def test_text_from_a_dump_never_rewrites_the_markdown_report(tmp_path: Path):
    folder = tmp_path / "dumps"
    poisoned_job(folder)
    clean = tmp_path / "clean"
    clean.mkdir()
    for rank in (0, 1):  # the same job with plain names: the report's shape to expect
        entries = [_entry(seq, process_group=("g", "d"), state="scheduled" if seq == 3 else "completed")
                   for seq in ((1, 2, 3) if rank == 0 else (1, 2))]  # fmt: skip
        (clean / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(_dump(entries)))
    report = run(["analyze", str(folder), "--format", "markdown"]).stdout.decode()
    expected = run(["analyze", str(clean), "--format", "markdown"]).stdout.decode()
    headings, links, html, plain = _headings_links_and_html(report)
    clean_headings, clean_links, clean_html, _ = _headings_links_and_html(expected)
    assert len(headings) == len(clean_headings) and "HEALTHY" not in " ".join(headings), headings
    assert (links, html) == (clean_links, clean_html)  # no link, image or tag from the dump
    assert not unsafe_characters(report.encode())
    assert "@alice" not in plain and "#1" not in plain and "<img" in plain  # shown as text, inert


def test_a_stack_frame_cannot_close_its_code_block():
    from fr2perfetto.base.text import code_block

    lines = code_block(["f (a.py:1)", "```", "x ```` y", "</details><script>"])
    assert lines[0] == lines[-1] == "`````" and all(not line.startswith("`````") for line in lines[1:-1])


# ---- archives -------------------------------------------------------------------------------------


def _peak_child_memory(args: list[str]) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """Run the command; return it and the largest resident memory of its process, in bytes."""
    probe = (
        "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True); "
        "sys.stdout.buffer.write(done.stderr); "
        "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}  # with or without the speed-ups, as set
    done = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "fr2perfetto", *args],
                          capture_output=True, env=env, timeout=HANG_GUARD)  # fmt: skip
    *lines, peak = done.stdout.decode().splitlines()
    assert peak.startswith("PEAK "), done.stdout
    return subprocess.CompletedProcess(args, done.returncode, b"", "\n".join(lines).encode()), int(peak[5:]) * 1024


def _gzip_bomb(path: Path, member: str, size: int, head: bytes = b"") -> None:
    """A .tar.gz of one member of ``size`` bytes (``head`` then zeros), made in a moment: gzip members
    may be concatenated, so one compressed MB of zeros is repeated."""
    info = tarfile.TarInfo(member)
    info.size = size
    mb = 1 << 20
    zeros = gzip.compress(bytes(mb), compresslevel=9, mtime=0)
    with open(path, "wb") as out:
        out.write(gzip.compress(info.tobuf() + head + bytes(mb - len(head)), mtime=0))
        for _ in range(size // mb - 1):
            out.write(zeros)


@pytest.mark.parametrize("head", [b"", b"\x80\x02}q\x00"], ids=["zeros", "pickle_head"])
def test_an_archive_that_inflates_a_thousandfold_is_refused_in_little_memory(tmp_path: Path, head: bytes):
    bomb = tmp_path / "dumps.tar.gz"
    _gzip_bomb(bomb, "job/nccl_trace_rank_0", 3 << 30, head)
    assert bomb.stat().st_size < 4 << 20
    done, peak = _peak_child_memory(["analyze", str(bomb)])
    assert "archive refused" in one_line_error(done) and str(bomb) in done.stderr.decode()
    assert peak < 300 << 20, f"peak {peak >> 20} MB"


def test_a_zip_that_inflates_a_thousandfold_is_refused(tmp_path: Path):
    bomb = tmp_path / "dumps.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive, archive.open("nccl_trace_rank_0", "w") as out:
        out.write(b"\x80\x02")
        for _ in range(512):
            out.write(bytes(1 << 20))
    done, peak = _peak_child_memory(["analyze", str(bomb)])
    assert "compression bomb" in one_line_error(done) and peak < 300 << 20


def _timeless(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_damaged_archive_is_one_line_and_the_folder_beside_it_still_runs(tmp_path: Path, kind: str):
    archive = tmp_path / f"dumps.{kind}"
    # the same archive and the same damage on every run and checkout (no times in it): one outcome
    if kind == "zip":
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
            for dump in sorted(DEMO.iterdir()):
                out.writestr(zipfile.ZipInfo(dump.name, (1980, 1, 1, 0, 0, 0)), dump.read_bytes(), zipfile.ZIP_DEFLATED)
    else:
        with (
            archive.open("wb") as raw,
            gzip.GzipFile("", mode="wb", fileobj=raw, mtime=0) as packed,
            tarfile.open(fileobj=packed, mode="w") as out,
        ):
            out.add(DEMO, arcname="dumps", filter=_timeless)
    data = bytearray(archive.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = random.Random(31).randbytes(64)  # a download that went wrong half way
    archive.write_bytes(bytes(data))
    good = tmp_path / "good"
    shutil.copytree(ROOT / "samples" / "gloo" / "skip", good)
    done = run(["analyze", str(archive), str(good), "--json"])
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr.decode()[-500:]
    lines = [line for line in done.stderr.decode().splitlines() if line.strip()]
    assert len([line for line in lines if str(archive) in line]) == 1, lines
    report = json.loads(done.stdout)
    assert 2 in report["verdict"]["culprit_ranks"]  # the good folder's verdict: rank 2 skipped the op


# ---- pickles that grow after they are counted --------------------------------------------------


def _growing_pickle(entries: int, items: int) -> bytes:
    """A dump whose entries all hold one frames list that, once every entry refers to it, grows to
    ``items`` frames: counted small by a model that counts it where it is referred to."""
    import pickletools

    doc = _dump([_entry(seq) for seq in range(1, entries + 1)])
    shared = doc["entries"][0]["frames"]
    for entry in doc["entries"]:
        entry["frames"] = shared  # pickled once, then fetched from the memo by every entry
    data = pickle.dumps(doc, protocol=2)
    memo: dict[str, int] = {}  # the memo index of the frames list and of its one frame dict
    after_frames, last_made = False, ""
    for op, argument, _ in pickletools.genops(data):
        if op.name == "SHORT_BINUNICODE" or op.name == "BINUNICODE":
            after_frames = after_frames or argument == "frames"
        elif op.name in ("EMPTY_LIST", "EMPTY_DICT") and after_frames:
            last_made = "list" if op.name == "EMPTY_LIST" else "dict"
        elif op.name in ("BINPUT", "LONG_BINPUT") and last_made:
            memo.setdefault(last_made, argument)
            last_made = ""
        if len(memo) == 2:
            break

    def get(index: int) -> bytes:
        return b"h" + bytes([index]) if index < 256 else b"j" + index.to_bytes(4, "little")

    assert data.endswith(b"u.")
    return data[:-1] + get(memo["list"]) + b"(" + get(memo["dict"]) * items + b"e0."


def test_a_list_that_grows_after_it_is_shared_is_refused(tmp_path: Path):
    data = _growing_pickle(5_000, 500_000)
    assert len(data) < 3 << 20
    probe = pickle.loads(data)
    assert len(probe["entries"][-1]["frames"]) == 500_001  # what an unchecked reader would walk 5,000 times
    (tmp_path / "nccl_trace_rank_0").write_bytes(data)
    done = run(["analyze", str(tmp_path)])
    assert "grows after it is shared" in one_line_error(done)


# ---- work in proportion to the input -----------------------------------------------------------


def _ratio(work: Any, small: Any, large: Any) -> float:
    return _count_lines(work, large) / max(1, _count_lines(work, small))


def test_stack_and_log_reading_work_grows_with_the_text():
    from fr2perfetto.read.logs import parse_log
    from fr2perfetto.read.stacks import parse_stacks

    def stacks(size: int) -> str:
        nested = "(" * size + "x" + ")" * size
        return f'Thread 1 (idle): "MainThread"\n    {nested} ({nested}:{"9" * size})\n' * 20

    def log(size: int) -> str:
        return (f"[PG ID 1 PG GUID {'x' * size} Rank 3] " + "9" * size + ' File "' + '", line ' * size + "\n") * 20

    for parse, make in ((lambda text: parse_stacks(text, "stacks_rank_1.txt"), stacks),
                        (lambda text: parse_log(text, "rank_1.log"), log)):  # fmt: skip
        ratio = _ratio(parse, make(2000), make(4000))
        assert ratio < 2.5, ratio
    # and in time, a line of 120 KB of nested parentheses is read at once (this took minutes)
    started = time.process_time()
    parse_stacks(stacks(60_000), "stacks_rank_1.txt")
    parse_log(log(60_000), "rank_1.log")
    assert time.process_time() - started < 60  # a hang guard, far above the work (milliseconds)


# ---- numbers and dates from outside ------------------------------------------------------------

HUGE = "9" * 5000


def test_huge_numbers_and_far_dates_in_logs_and_snapshots_end_in_a_report(tmp_path: Path):
    for dump in DEMO.iterdir():
        shutil.copy(dump, tmp_path / dump.name)
    (tmp_path / "job.log").write_text(
        f"[rank{HUGE}]: NCCL error\n"
        f"[rank2]: E0810 03:04:11 Watchdog caught collective operation timeout: WorkNCCL(SeqNum={HUGE}, "
        f"OpType=ALLREDUCE, Timeout(ms)={HUGE}) ran for {HUGE} milliseconds before timing out.\n"
        "[rank3]: 9999-12-31 23:59:59 CUDA error: an illegal memory access was encountered\n"
        "[rank4]: 0001-01-01 00:00:00 NCCL error: ncclRemoteError\n"
        f"  time      : 9999-12-31_23:59:59\n  rank      : 6\n  exitcode  : {HUGE}\n  traceback : x\n"
        f'[rank5]: Traceback (most recent call last):\n[rank5]:   File "a.py", line {HUGE}, in f\n'
        "[rank5]: RuntimeError: boom\n"
    )
    (tmp_path / "stacks_99991231_235959.txt").write_text(
        f'=== Rank {HUGE}: x ===\nThread 0x1 (most recent call first):\n  File "a.py", line {HUGE} in f\n'
        '=== Rank 5: x ===\nThread 0x1 (most recent call first):\n  File "/job/train.py", line 3 in train\n'
    )
    old = tmp_path / "pyspy_rank_4.txt"
    old.write_text('Thread 1 (idle): "MainThread"\n    f (a.py:1)\n')
    os.utime(old, ns=(2**62, 2**62))  # a file time centuries away
    for command in (["analyze", "--json"], ["analyze"], ["convert", "-o", str(tmp_path / "t.pftrace")]):
        done = run([command[0], str(tmp_path), *command[1:]])
        assert done.returncode in (0, 1, 3) and b"Traceback" not in done.stderr, done.stderr.decode()[-800:]
    report = json.loads(run(["analyze", str(tmp_path), "--json"]).stdout)
    from fr2perfetto.render.report import parse_report_json

    parse_report_json(json.dumps(report))  # every 64-bit time within range: the schema takes it
    assert all(0 <= int(e.get("time_ns", 0)) < 2**63 for e in report.get("log_events", []))
    assert any("no plausible date" in p["reason"] for p in report["input_problems"])
    assert not any(e["rank"] > 1 << 24 for e in report.get("log_events", []))


def test_file_names_that_are_not_utf8_are_shown_escaped(tmp_path: Path):
    folder = os.fsencode(tmp_path / "dumps")
    os.mkdir(folder)
    for dump in DEMO.iterdir():
        shutil.copy(dump, os.path.join(folder, os.fsencode(dump.name)))
    with open(os.path.join(folder, b"rank_1\xff\x1b.log"), "w") as log:
        log.write("[rank1]: CUDA error: an illegal memory access was encountered\n")
    with open(os.path.join(folder, b"nccl_trace_rank_\xfe_9"), "wb") as bad:
        bad.write(b"not a dump")
    for command in (["analyze", "--json"], ["analyze"], ["info"]):
        done = run([command[0], os.fsdecode(folder), *command[1:]])
        assert done.returncode in (0, 1, 3) and b"Traceback" not in done.stderr, done.stderr.decode()[-800:]
        assert not unsafe_characters(done.stdout + done.stderr)
    report = json.loads(run(["analyze", os.fsdecode(folder), "--json"]).stdout)
    assert any("\\xff\x1b.log" in e["source"] for e in report["log_events"])  # bytes named, text as it was
    assert any("\\xfe" in p["path"] for p in report["input_problems"])


# ---- nothing passed over unsaid: every input not read is named, in one line, with why -------------


def _pure(monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process too, read as the case's commands do: in pure Python where they are told to."""
    from fr2perfetto.read import reader

    if os.environ.get("FR2PERFETTO_NO_SPEEDUPS") == "1":
        monkeypatch.setattr(reader, "_speedups", None)


def _said(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    """The lines a command that ran to a verdict wrote to stderr (asserting it did, without a traceback)."""
    stderr = done.stderr.decode()
    assert done.returncode in (0, 1, 3) and "Traceback" not in stderr, stderr[-800:]
    return [line for line in stderr.splitlines() if line.strip()]


def test_a_dump_that_is_a_device_a_fifo_or_a_broken_link_is_named_and_never_opened(tmp_path: Path):
    folder = tmp_path / "dumps"
    shutil.copytree(DEMO, folder)
    for rank, target in ((7, "/dev/urandom"), (6, "/dev/zero"), (5, "/dev/stdin"), (3, str(tmp_path / "gone"))):
        (folder / f"nccl_trace_rank_{rank}").unlink()
        (folder / f"nccl_trace_rank_{rank}").symlink_to(target)
    (folder / "nccl_trace_rank_4").unlink()
    os.mkfifo(folder / "nccl_trace_rank_4")
    os.mkfifo(folder / "rank_4.log")
    os.mkfifo(folder / "nccl_trace_rank_4.pipe")  # the capture helper's own: passed over without a word
    archive = tmp_path / "more.tar"
    with tarfile.open(archive, "w") as out:
        link = tarfile.TarInfo("job/nccl_trace_rank_2")
        link.type, link.linkname = tarfile.SYMTYPE, "/dev/urandom"
        out.addfile(link)
    reading, writing = os.pipe()  # /dev/stdin is this pipe, held open: a read of it would wait for ever
    try:
        lines = _said(run(["analyze", str(folder), str(archive)], stdin=reading))
    finally:
        os.close(reading)
        os.close(writing)
    not_read = "not a regular file: not read"
    assert sorted(line for line in lines if "not read" in line) == sorted(
        [
            f"error: {archive}!job/nccl_trace_rank_2: a link to /dev/urandom, {not_read}",
            f"error: {folder}/nccl_trace_rank_3: a link to {tmp_path}/gone, which cannot be followed (No such file or "
            "directory): not read",
            f"error: {folder}/nccl_trace_rank_4: a FIFO (named pipe), {not_read}",
            f"error: {folder}/nccl_trace_rank_5: a link to /dev/stdin, a FIFO (named pipe), {not_read}",
            f"error: {folder}/nccl_trace_rank_6: a link to /dev/zero, a character device, {not_read}",
            f"error: {folder}/nccl_trace_rank_7: a link to /dev/urandom, a character device, {not_read}",
            f"warning: {folder}/rank_4.log: a FIFO (named pipe), {not_read}",
        ]
    )  # one line each
    assert not [line for line in lines if ".pipe" in line]
    # named on the command line, it is said the same way
    assert one_line_error(run(["analyze", str(folder / "nccl_trace_rank_7")])) == (
        f"error: {folder}/nccl_trace_rank_7: a link to /dev/urandom, a character device, {not_read}"
    )


def test_json_dumps_with_a_byte_order_mark_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import codecs

    from fr2perfetto.read import reader

    _pure(monkeypatch)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4]"}}
    text = json.dumps(_dump([_entry(seq) for seq in (1, 2, 3)], pg_config=config))
    encoded = {
        0: codecs.BOM_UTF8 + text.encode(),
        1: codecs.BOM_UTF16_LE + text.encode("utf-16-le"),
        2: codecs.BOM_UTF16_BE + text.encode("utf-16-be"),
        3: codecs.BOM_UTF32_LE + text.encode("utf-32-le"),
    }
    for rank, data in encoded.items():
        (tmp_path / f"nccl_trace_rank_{rank}.json").write_bytes(data)
        assert len(reader.read_dump(str(tmp_path / f"nccl_trace_rank_{rank}.json")).entries) == 3
    with zipfile.ZipFile(tmp_path / "more.zip", "w") as archive:  # and from an archive
        archive.writestr("nccl_trace_rank_4.json", codecs.BOM_UTF8 + text.encode())
    done = run(["analyze", str(tmp_path), "--json"])
    assert not [line for line in _said(done) if ".json" in line]
    assert json.loads(done.stdout)["job"]["ranks_with_dump"] == [0, 1, 2, 3, 4]


def test_an_integer_too_long_costs_its_entry_and_not_its_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from fr2perfetto.read import reader

    _pure(monkeypatch)
    huge = 10**10_000  # 10,001 digits: more than Python writes or reads as text
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4]"}}
    cases = {0: ("collective_seq_id", 10**30), 1: ("record_id", huge), 2: ("time_created_ns", huge)}
    for rank, (key, value) in cases.items():
        entries = [_entry(1), _entry(2, **{key: value}), _entry(3)]
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(_dump(entries, pg_config=config)))
    # in JSON, where the number is text Python refuses to read
    text = json.dumps(_dump([_entry(1), _entry(2, record_id="HUGE"), _entry(3)], pg_config=config))
    (tmp_path / "nccl_trace_rank_3.json").write_text(text.replace('"HUGE"', "1" + "0" * 10_000))
    # a duration or a group's count too long for a float or a count: the entry stays, without it
    odd = _dump([_entry(1), _entry(2, duration_ms=huge), _entry(3)], pg_config=config,
                pg_status={"0": {"last_enqueued_collective": huge}})  # fmt: skip
    (tmp_path / "nccl_trace_rank_4").write_bytes(pickle.dumps(odd))
    lines = _said(run(["analyze", str(tmp_path)]))
    why = {
        0: "collective_seq_id is an integer of 31 digits",
        1: "record_id is an integer of 10001 digits",
        2: "time_created_ns is an integer of 10001 digits",
        3: "record_id is an integer of 10001 digits",
    }
    for rank, reason in why.items():
        name = tmp_path / (f"nccl_trace_rank_{rank}" + (".json" if rank == 3 else ""))
        assert any(line.startswith(f"warning: {name}: ") and f"(entry 1: {reason}, out of range)" in line
                   for line in lines), (rank, lines)  # fmt: skip
        dump = reader.read_dump(str(name))
        assert (len(dump.entries), dump.skipped_entries) == (2, 1)
        assert [entry.collective_seq for entry in dump.entries] == [1, 3]
    dump = reader.read_dump(str(tmp_path / "nccl_trace_rank_4"))
    assert [entry.duration_ms for entry in dump.entries] == [0.1, None, 0.1] and dump.pg_status == {}
    assert not [line for line in lines if "nccl_trace_rank_4" in line]


def test_a_log_in_one_line_still_shows_its_error_and_what_is_cut_is_said(tmp_path: Path):
    shutil.copytree(DEMO, tmp_path, dirs_exist_ok=True)
    filler = "q" * (1 << 20)
    error = "[rank5]:E1130 00:53:21.000 ProcessGroupNCCL.cpp:1970] NCCL error in: unhandled system error"
    # 20 MB written without a newline: rank 5's error 10 MB in (in the 16 MB read), rank 3's 2 MB in (cut)
    (tmp_path / "job.log").write_text(filler * 2 + error.replace("5", "3", 1) + filler * 8 + error + filler * 10)
    section = (
        '=== Rank {}: 10.0.0.1:29500 ===\nThread 0x1 (most recent call first):\n  File "/job/train.py", line 3 in f\n'
    )
    stacks = "".join(section.format(rank) for rank in range(8)) + ("#" * 1023 + "\n") * (17 << 10)
    (tmp_path / "stacks_20261130_005321.txt").write_text(stacks)  # 17 MB: its first ranks are cut
    done = run(["analyze", str(tmp_path), "--json"])
    _said(done)
    report = json.loads(done.stdout)
    cut = "over the 16 MB read of a log or stack snapshot: only its last 16 MB read"
    assert {"path": f"{tmp_path}/job.log", "reason": f"20 MB, {cut}"} in report["input_problems"]
    assert {"path": f"{tmp_path}/stacks_20261130_005321.txt", "reason": f"17 MB, {cut}"} in report["input_problems"]
    events = [(e["rank"], e["kind"], e["source"], e["line"][:14]) for e in report["log_events"]]
    assert events == [(5, "nccl_error", f"{tmp_path}/job.log:1", "NCCL error in:")]


def test_an_error_that_a_window_of_a_long_line_cuts_is_found_once():
    from fr2perfetto.read.logs import MAX_SCAN, OVERLAP, STEP, parse_log

    error = "[rank3]: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"
    places = [*range(STEP - len(error) - 2, STEP + 2), *range(MAX_SCAN - len(error) - 2, MAX_SCAN + 2), 2 * STEP - 9]
    for at in places:
        events = parse_log("x" * at + error + "y" * (3 * MAX_SCAN), "job.log")
        assert [(e.rank, e.kind, e.line[:14]) for e in events] == [(3, "nccl_error", "NCCL error in:")], at
    # two errors further apart than a message is long are two events, wherever the windows fall
    events = parse_log(("x" * 2000 + error) * 10, "job.log")
    assert len(events) == 10 and OVERLAP < 2000


# ---- standard output, command-line values, outputs ----------------------------------------------


def test_output_that_cannot_be_written_is_one_line_and_exit_2():
    for command in (["analyze", str(DEMO)], ["analyze", str(DEMO), "--json"], ["info", str(DEMO)],
                    ["convert", str(DEMO), "-o", "-"]):  # fmt: skip
        with open("/dev/full", "wb") as full:
            done = subprocess.run([sys.executable, "-m", "fr2perfetto", *command], stdout=full, stderr=subprocess.PIPE,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD)  # fmt: skip
        assert "cannot write to standard output" in one_line_error(done)


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    # `fr2perfetto analyze dumps | head -3`: the reader got what it wanted, nothing to report
    reader, writer = os.pipe()
    os.close(reader)
    with os.fdopen(writer, "wb") as closed:
        done = subprocess.run([sys.executable, "-m", "fr2perfetto", "analyze", str(DEMO)], stdout=closed,
                              stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              timeout=HANG_GUARD)  # fmt: skip
    assert done.stderr == b""
    assert done.returncode == 141


@pytest.mark.parametrize(
    "args, why",
    [
        (["convert", "--ranks", "0-100000000"], "beyond any job's ranks"),
        (["convert", "--ranks", "0-16000000"], "no rank 8-16000000 in this job"),
        (["convert", "--ranks", "9-12"], "no rank 9-12 in this job (its ranks: 0-7)"),
        (["convert", "--ranks", "abc"], "neither a rank nor a range"),
        (["convert", "--groups", "nosuch"], "no group nosuch in this job"),
        (["convert", "--max-size", "inf"], "--max-size: inf is not a size"),
        (["convert", "--max-size", "nan"], "--max-size: nan is not a size"),
        (["convert", "--max-size", "-3"], "--max-size: -3 is not a size"),
        (["analyze", "--max-dump-size", "1e300"], "--max-dump-size: 1e+300 is not a size"),
        (["analyze", "--max-dump-size", "abc"], "--max-dump-size"),
        (["analyze", "--no-such-flag"], "No such option"),
    ],
)
def test_command_line_values_from_outside_are_checked_in_one_line(tmp_path: Path, args: list[str], why: str):
    done = run([args[0], str(DEMO), *args[1:], *(["-o", str(tmp_path / "t.pftrace")] if args[0] == "convert" else [])])
    assert why in one_line_error(done)


def test_workers_are_never_more_than_the_work(monkeypatch: pytest.MonkeyPatch):
    from concurrent.futures import ProcessPoolExecutor

    from fr2perfetto.base import pools
    from fr2perfetto.read import job

    asked: list[int] = []

    class Recording(ProcessPoolExecutor):
        def __init__(self, max_workers: int, **kwargs: Any) -> None:
            asked.append(max_workers)
            super().__init__(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(pools, "ProcessPoolExecutor", Recording)
    loaded = job.load_job([str(DEMO)], jobs=2000)
    assert len(loaded.dumps) == 8 and asked and max(asked) <= 8


def test_no_output_may_replace_an_input_log_or_stack_file(tmp_path: Path):
    dumps = tmp_path / "dumps"
    shutil.copytree(DEMO, dumps)
    log = tmp_path / "job.log"
    log.write_text("[rank1]: NCCL error\n")
    stacks = dumps / "stacks_20260101_000000.txt"
    stacks.write_text("=== Rank 1: x ===\n")
    for output, extra in ((log, ["--logs", str(log)]), (stacks, [])):
        before = output.read_bytes()
        done = run(["convert", str(dumps), *extra, "-o", str(output)])
        assert "refusing to overwrite it" in one_line_error(done)
        assert output.read_bytes() == before


# ---- the open server ----------------------------------------------------------------------------


def test_a_slow_client_never_delays_the_fetch_and_is_cut_off(tmp_path: Path):
    from fr2perfetto import serve

    trace = tmp_path / "t.pftrace"
    trace.write_bytes(b"trace bytes" * 1000)
    links: list[str] = []
    ready = threading.Event()
    result: dict[str, object] = {}

    def announce(link: str, opened: bool) -> None:
        links.append(link)
        ready.set()

    server = threading.Thread(target=lambda: result.setdefault("fetched", serve.serve_once(
        str(trace), port=0, open_browser=lambda _: False, announce=announce)))  # fmt: skip
    server.start()
    assert ready.wait(30)
    url = urllib.parse.unquote(links[0].split("url=", 1)[1].split("&", 1)[0])
    port = int(url.split("127.0.0.1:")[1].split("/")[0])
    slow = socket.create_connection(("127.0.0.1", port))
    cut_off = threading.Event()

    def trickle() -> None:  # a byte at a time, each in time for a per-read timeout, never done
        request = f"GET {url.split(str(port), 1)[1]} HTTP/1.1\r\nHost: x\r\n" + "X-Pad: y\r\n" * 1000
        for byte in request.encode():
            try:
                slow.sendall(bytes([byte]))
                if slow.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                    break
            except BlockingIOError:
                pass
            except OSError:
                break
            time.sleep(0.5)
        cut_off.set()

    threading.Thread(target=trickle, daemon=True).start()
    time.sleep(1)
    with urllib.request.urlopen(url, timeout=60) as response:  # served while the slow one still trickles
        assert response.read() == trace.read_bytes()
    assert not cut_off.is_set()
    server.join(60)
    assert result["fetched"] is True
    assert cut_off.wait(HANG_GUARD)  # the slow one is closed once its request's deadline passed
    slow.close()


# ---- capture: only its own files, only its own run's processes ------------------------------------

CAPTURE_SCRIPT = """
import os, sys, time
from datetime import timedelta
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
capture.install()
pair = dist.new_group([1, 2])  # its collectives never touch rank 0's connections
t = torch.ones(4)
dist.all_reduce(t)
print("ready", flush=True)
if dist.get_rank() == 0:
    time.sleep(2)
    raise RuntimeError("rank 0 fails")  # it dumps, then wakes the other ranks of this run
if dist.get_rank() == 2:
    time.sleep(600)
dist.all_reduce(t, group=pair)  # rank 1 blocks here until killed
"""


def _start_ranks(script: Path, folder: Path, world: int) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    ranks = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}  # fmt: skip
        ranks.append(start_rank([sys.executable, str(script), str(folder)], env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE))  # fmt: skip
    return ranks


@pytest.mark.torch_job
def test_a_failing_rank_wakes_only_its_own_runs_ranks_and_writes_through_no_link(tmp_path: Path):
    folder = tmp_path / "dumps"
    folder.mkdir(mode=0o700)
    strangers = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]  # SIGUSR1 would end them
    host = socket.gethostname()
    from fr2perfetto.trigger import RankProcess, process_start, rank_file_text

    # rank files left in a reused folder: the old form, a live pid whose start time differs (pid reused),
    # and the right start time of a process of another run
    (folder / "fr_pid_rank_7").write_text(f"{host} {strangers[0].pid}\n")
    reused = RankProcess(8, host, strangers[1].pid, (process_start(strangers[1].pid) or 0) + 1, "old", 10)
    (folder / "fr_pid_rank_8").write_text(rank_file_text(reused))
    other_run = RankProcess(9, host, strangers[2].pid, process_start(strangers[2].pid) or 0, "another run", 10)
    (folder / "fr_pid_rank_9").write_text(rank_file_text(other_run))
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    for name in ("gloo_trace_rank_0.partial", "gloo_trace_rank_1.partial", "gloo_trace_rank_0.ended.partial"):
        (folder / name).symlink_to(outside)
    script = tmp_path / "train.py"
    script.write_text(CAPTURE_SCRIPT)
    ranks = _start_ranks(script, folder, 3)
    try:
        wait_ready(ranks)
        assert ranks[0].wait(HANG_GUARD) == 1  # the exception ends it
        woken = wait_until((folder / "gloo_trace_rank_1").exists, HANG_GUARD)
        assert woken, "the rank of the same run was not woken"
        assert (folder / "gloo_trace_rank_1.ended").read_text() == "running\n" and ranks[1].poll() is None
        assert (folder / "gloo_trace_rank_0.ended").read_text().startswith("exception: RuntimeError: rank 0 fails")
    finally:
        stop_ranks(ranks)
    try:
        assert [s.poll() for s in strangers] == [None, None, None]  # no stranger received a signal
    finally:
        for stranger in strangers:
            stranger.kill()
            stranger.wait()
    assert outside.read_text() == "keep me" and all((folder / n).is_symlink() for n in ("gloo_trace_rank_0.partial",))
    assert not (folder / "fr_pid_rank_0").exists()  # the failed rank removed its rank file on the way out
    from fr2perfetto.read.job import load_job

    assert sorted(load_job([str(folder)]).dumps) == [0, 1, 2]


def test_capture_refuses_a_linked_or_foreign_dump_folder(tmp_path: Path):
    from fr2perfetto import capture

    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(capture.UnsafeFolder, match="symbolic link"):
        capture.write_into_folder(str(link), "gloo_trace_rank_0", b"x")
    assert not list(real.iterdir())
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, 12345, 12345)
        with pytest.raises(capture.UnsafeFolder, match="belongs to user 12345"):
            capture.write_into_folder(str(foreign), "gloo_trace_rank_0", b"x")
    # a link where the dump goes is replaced, never written through
    outside = tmp_path / "outside"
    outside.write_text("keep me")
    (real / "gloo_trace_rank_0").symlink_to(outside)
    capture.write_into_folder(str(real), "gloo_trace_rank_0", b"dump")
    assert outside.read_text() == "keep me" and (real / "gloo_trace_rank_0").read_bytes() == b"dump"


def test_trigger_signals_only_the_process_a_rank_file_names(tmp_path: Path):
    from fr2perfetto.trigger import RankProcess, process_start, rank_file_text, signal_ranks

    sleeper = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGUSR1, "
                                "lambda *_: sys.exit(7)); print('ready', flush=True); time.sleep(600)"],
                               stdout=subprocess.PIPE)  # fmt: skip
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        wait_ready([sleeper])
        host = socket.gethostname()
        mine = RankProcess(0, host, sleeper.pid, process_start(sleeper.pid) or 0, "run", int(signal.SIGUSR1))
        stale = RankProcess(1, host, stranger.pid, (process_start(stranger.pid) or 0) + 5, "run", int(signal.SIGUSR1))
        (tmp_path / "fr_pid_rank_0").write_text(rank_file_text(mine))
        (tmp_path / "fr_pid_rank_1").write_text(rank_file_text(stale))
        assert signal_ranks(str(tmp_path)) == [0]
        assert sleeper.wait(HANG_GUARD) == 7 and stranger.poll() is None
    finally:
        for process in (sleeper, stranger):
            with contextlib.suppress(OSError):
                process.kill()
            process.wait()


def test_redact_keeps_names_out_of_error_lines_too(tmp_path: Path):
    mark = "zq7MARK"
    folder = tmp_path / "dumps"
    shutil.copytree(DEMO, folder)
    (folder / "nccl_trace_rank_20").write_bytes(pickle.dumps(_dump(version=f"{mark}9")))
    (folder / "nccl_trace_rank_21").write_bytes(f"\x80\x02c{mark}mod\n{mark}fn\n)R.".encode())
    with tarfile.open(tmp_path / "more.tar.gz", "w:gz") as archive:
        member = tarfile.TarInfo(f"../{mark}node07/nccl_trace_rank_22")
        member.size = 3
        archive.addfile(member, io.BytesIO(b"abc"))
    for command in (["analyze"], ["analyze", "--json"], ["info"], ["convert", "-o", str(tmp_path / "t.pftrace")]):
        done = run([command[0], str(folder), str(tmp_path / "more.tar.gz"), *command[1:], "--redact"])
        assert done.returncode in (0, 1, 3), done.stderr.decode()[-500:]
        output = (done.stdout + done.stderr).decode()
        assert mark not in output, output[max(0, output.find(mark) - 80) : output.find(mark) + 20]
        assert "refused" in done.stderr.decode() and "unknown dump version" in done.stderr.decode()
