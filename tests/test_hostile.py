"""Dumps from a stranger: each hostile shape, built here as a small file, ends with a one-line error or
a trace, never a signal or a traceback, with and without the C speed-ups, under a cap on memory (and a
hang guard far above what each takes). And nothing fr2perfetto writes may replace evidence, or outlive
a SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT
from .helpers import wait_until
from .tracecheck import read_trace

T0 = 1_796_000_000_000_000_000
MEMORY_CAP = 3 << 30  # address space a command may use (ulimit -v)
HANG_GUARD = 300  # seconds: each case takes well under one; a shape that made work explode would never end


def _entry(seq: int = 1, **changes: Any) -> dict[str, Any]:
    entry = {
        "record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
        "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": T0 + seq,
        "duration_ms": 0.1, "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]],
        "output_dtypes": ["Float"], "state": "completed", "time_discovered_started_ns": T0 + seq + 10,
        "time_discovered_completed_ns": T0 + seq + 100, "retired": True, "timeout_ms": 600_000, "is_p2p": False,
        "frames": [{"name": "main", "filename": "/job/train.py", "line": 3}], "thread_id": "1", "thread_name": "main",
    }  # fmt: skip
    entry.update(changes)
    return entry


def _dump(entries: list[dict[str, Any]] | None = None, **changes: Any) -> dict[str, Any]:
    doc = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
        "pg_status": {"0": {"last_enqueued_collective": 1}},
        "entries": entries if entries is not None else [_entry()],
    }
    doc.update(changes)
    return doc


BLOB = "@@BLOB@@"


def _with_blob(doc: dict[str, Any], blob: bytes) -> bytes:
    """A pickle of ``doc`` where the string ``BLOB`` is replaced by raw pickle opcodes."""
    data = pickle.dumps(doc, protocol=2)
    encoded = b"X" + len(BLOB).to_bytes(4, "little") + BLOB.encode()
    assert encoded in data
    return data.replace(encoded, blob, 1)


DEEP = b")" + b"\x85" * 1_000_000  # a tuple nested a million deep: hashing it overflows the C stack
SHARED = b")q\x00" + b"".join(b"h" + bytes([k]) + b"h" + bytes([k]) + b"\x86q" + bytes([k + 1]) for k in range(30))
WRONG_TYPES = [None, True, 2**70, -5, 1.5, float("nan"), "text", b"bytes", [1, [2, [3]]], {"a": 1}, ("x",) * 3]


def hostile_cases() -> dict[str, tuple[str, bytes]]:
    """name -> (file name, bytes) of every hostile shape."""
    name = "nccl_trace_rank_0"
    odd_text = _entry(
        thread_name="\ud800",
        thread_id="\udfff",
        process_group=("\ud800", "tp\udc00"),
        profiling_name="nccl:all\ud800reduce",
        input_dtypes=["\udfff"],
        frames=[{"name": "f\ud800", "filename": "/x/\udfff.py", "line": 1}],
    )
    odd_config = {"\ud800": {"name": "\ud800", "desc": "\udfff", "ranks": "[0]"}}
    huge_config = {"0": {"name": "0", "desc": "d", "ranks": f"[0, {2**63 - 1}]"}}
    claim = {"0": {"name": "0", "desc": "d", "ranks": str(list(range(20_000)))}}
    huge_peer = _entry(profiling_name=f"nccl:send 0->{2**62}", is_p2p=True)
    cases = {
        "deep_group": (name, _with_blob(_dump([_entry(process_group=BLOB)]), DEEP)),
        "deep_sizes": (name, _with_blob(_dump([_entry(input_sizes=BLOB)]), DEEP)),
        "deep_status_key": (name, _with_blob(_dump(pg_status={BLOB: {}}), DEEP)),
        "shared_group": (name, _with_blob(_dump([_entry(process_group=BLOB)]), SHARED)),
        "shared_thread": (name, _with_blob(_dump([_entry(thread_name=BLOB)]), SHARED)),
        "surrogates": (name, pickle.dumps(_dump([odd_text], pg_config=odd_config))),
        "surrogates_json": (f"{name}.json", json.dumps(_dump([_entry(thread_name="\ud800")])).encode()),
        "huge_rank_name": ("nccl_trace_rank_2147483647", pickle.dumps(_dump())),
        "huge_rank_config": (name, pickle.dumps(_dump(pg_config=huge_config))),
        "huge_peer": (name, pickle.dumps(_dump([huge_peer]))),
        "claims_20000_ranks": (name, pickle.dumps(_dump(pg_config=claim))),
        "not_a_dump": (name, b"PK\x03\x04" + b"\0" * 5000),
        "memo_bomb": (name, b"\x80\x02}r\xff\xff\xff\x7f."),
        "code": (name, b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueR."),
    }
    # every field of an entry with every wrong type, one rank each, in one job
    wrong = [pickle.dumps(_dump([_entry(**{key: value})])) for key in _entry() for value in WRONG_TYPES]
    cases["wrong_types"] = ("", pickle.dumps(wrong))  # unpacked by the test into one file per rank
    return cases


def _run(args: list[str], pure: bool, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    if pure:
        env["FR2PERFETTO_NO_SPEEDUPS"] = "1"

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    return subprocess.run([sys.executable, "-m", "fr2perfetto", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=HANG_GUARD, preexec_fn=cap)  # fmt: skip


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_every_hostile_dump_ends_in_one_line(tmp_path: Path, pure: bool):
    broken = []
    for name, (file_name, data) in hostile_cases().items():
        folder = tmp_path / name
        folder.mkdir()
        if file_name:
            (folder / file_name).write_bytes(data)
        else:
            for rank, each in enumerate(pickle.loads(data)):
                (folder / f"nccl_trace_rank_{rank}").write_bytes(each)
        out = folder / "t.pftrace"
        done = _run(["convert", str(folder), "-o", str(out), "-j", "1"], pure, tmp_path)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        if (
            done.returncode < 0
            or done.returncode > 2
            or "Traceback" in done.stderr
            or any(not line.startswith(("error: ", "warning: ")) for line in lines)
        ):
            broken.append(f"{name}: exit {done.returncode}: {done.stderr[-300:]}")
            continue
        if done.returncode == 2:
            assert lines and str(folder) in lines[0], name  # the file is named in its one line
        else:
            assert read_trace(str(out)).processes, name
    assert not broken, "\n".join(broken)


def test_hostile_dumps_among_good_ones_are_reported_and_the_rest_analysed(tmp_path: Path):
    cases = [case for case in hostile_cases().values() if case[0]]
    for rank, (file_name, data) in enumerate(cases, start=1):
        name = file_name.replace("_0", f"_{rank}") if file_name.endswith(("_0", "_0.json")) else file_name
        (tmp_path / name).write_bytes(data)
    for path in (ROOT / "samples" / "gloo" / "healthy").iterdir():
        (tmp_path / path.name.replace("gloo_trace_rank_", "gloo_trace_rank_9")).write_bytes(path.read_bytes())
    for command in (["analyze", str(tmp_path), "--json"], ["analyze", str(tmp_path)], ["info", str(tmp_path)]):
        done = _run(command, False, tmp_path)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr[-500:]
        assert done.stdout.strip()


def test_a_dump_over_the_size_limit_is_refused_unread(tmp_path: Path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(_dump([_entry(s) for s in range(1, 40_000)])))
    done = _run(["analyze", str(tmp_path), "--max-dump-size", "1"], False, tmp_path)
    assert done.returncode == 2 and "over the largest dump read (1 MB; --max-dump-size)" in done.stderr


def test_output_never_replaces_evidence(tmp_path: Path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dump = dumps / "nccl_trace_rank_0"
    dump.write_bytes(pickle.dumps(_dump()))
    before = dump.read_bytes()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    for target, why in ((dump, "is one of the input dumps"), (fifo, "is not a regular file"),
                        (link, "is not a regular file"), (Path("/dev/null"), "is not a regular file")):  # fmt: skip
        done = _run(["convert", str(dumps), "-o", str(target)], False, tmp_path)
        assert done.returncode == 2 and why in done.stderr, (target, done.stderr)
    assert dump.read_bytes() == before and fifo.is_fifo() and link.is_symlink()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    piped = subprocess.run([sys.executable, "-m", "fr2perfetto", "convert", str(dumps), "-o", "-"],  # on purpose
                           capture_output=True, env=env, timeout=60)  # fmt: skip
    assert piped.returncode == 0
    (tmp_path / "piped.pftrace").write_bytes(piped.stdout)
    assert read_trace(str(tmp_path / "piped.pftrace")).processes


def test_sigterm_leaves_no_file_and_no_process(tmp_path: Path):
    sys.path.insert(0, str(ROOT / "bench"))
    from generate import generate

    dumps = tmp_path / "dumps"
    generate(str(dumps), 256, 300, processes=2)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "fr2perfetto", "convert", str(dumps), "-o", str(out / "t.pftrace"), "--full",
               "-j", "2", "-q"]  # fmt: skip
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    children: set[int] = set()
    deadline = time.monotonic() + HANG_GUARD
    while not any(out.iterdir()) and time.monotonic() < deadline:  # writing has begun
        children |= _children(process.pid)
        time.sleep(0.01)
    children |= _children(process.pid)
    assert any(out.iterdir()), "the conversion never began writing"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=HANG_GUARD)
    # the killed workers are reaped by the system in their time
    wait_until(lambda: not any(_alive(pid) for pid in children), HANG_GUARD)
    assert process.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in stderr
    assert list(out.iterdir()) == []  # neither the .partial trace nor the writers' part files
    assert not [pid for pid in children if _alive(pid)]


@pytest.mark.parametrize("made_by", ["open", "mkdir"])
def test_a_stop_just_after_a_scratch_path_is_made_leaves_nothing(
    made_by: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The moment between making a partial file (or the writers' folder) and knowing it must go is
    where a signal once left one behind: a stop there removes it too."""
    from fr2perfetto.base import cleanup
    from fr2perfetto.base.output import atomic_output

    made = getattr(os, made_by)

    def make_then_stop(path: Any, *args: Any, **kwargs: Any) -> Any:
        result = made(path, *args, **kwargs)
        if ".fr2perfetto-" in str(path):
            cleanup.abandon()  # what the signal handler does, before it ends the process
            assert not os.path.exists(path)
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(cleanup.os, made_by, make_then_stop)
    with pytest.raises(KeyboardInterrupt):
        if made_by == "open":
            with atomic_output(str(tmp_path / "t.pftrace")):
                pass
        else:
            with cleanup.scratch_folder(str(tmp_path), ".fr2perfetto-"):
                pass
    assert list(tmp_path.iterdir()) == []


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


MARK = "zq7MARK"


def _marked_job(folder: Path) -> None:
    """Two ranks whose every string holds MARK (rank 1 never issues op #3, so that findings quote the
    group and the op), dump files named with hosts in several shapes, a bad file and a duplicate rank."""
    group = (f"{MARK}pg", f"{MARK}desc")
    for rank, name in ((0, f"nccl_trace_rank_{MARK}host_0"), (1, f"{MARK}gpu-node07_1")):
        entries = [
            _entry(seq, process_group=group, profiling_name=f"{MARK}backend:{MARK}op", thread_id=f"{MARK}tid",
                   thread_name=f"{MARK}thread", input_dtypes=[f"{MARK}dtype"], output_dtypes=[f"{MARK}dtype"],
                   state="scheduled" if seq == 3 else "completed",
                   frames=[{"name": f"{MARK}fn", "filename": f"C:\\Users\\{MARK}\\{MARK}.py", "line": 1},
                           {"name": f"{MARK}fn2", "filename": f"/home/{MARK}/{MARK}lib/{MARK}.py", "line": 2}])
            for seq in ((1, 2, 3) if rank == 0 else (1, 2))
        ]  # fmt: skip
        config = {f"{MARK}pg": {"name": f"{MARK}pg", "desc": f"{MARK}desc", "ranks": "[0, 1]"}}
        status = {f"{MARK}pg": {"last_enqueued_collective": 3}}
        doc = _dump(entries, pg_config=config, pg_status=status, comm_lib_version=f"{MARK}nccl")
        (folder / name).write_bytes(pickle.dumps(doc))
    (folder / f"fr_{MARK}node09_rank4").write_bytes(b"not a dump")
    (folder / "sub").mkdir()
    (folder / "sub" / f"nccl_trace_rank_{MARK}host_0").write_bytes(
        (folder / f"nccl_trace_rank_{MARK}host_0").read_bytes()
    )


def test_redact_leaves_no_name_from_the_dumps_in_any_output(tmp_path: Path):
    folder = tmp_path / f"{MARK}dumps"
    folder.mkdir()
    _marked_job(folder)
    inputs = [str(folder), str(folder / "sub")]
    outputs = []
    for name in ("t.pftrace", "t.json"):
        done = _run(["convert", *inputs, "-o", str(tmp_path / name), "--redact"], False, tmp_path)
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr, (tmp_path / name).read_bytes().decode("utf-8", "replace")]
    commands = (["analyze", "--redact"], ["analyze", "--redact", "--json"],
                ["analyze", "--redact", "--format", "markdown"], ["info", "--redact"])  # fmt: skip
    for command in commands:
        done = _run([command[0], *inputs, *command[1:]], False, tmp_path)
        assert done.returncode in (0, 1) and done.stdout.strip(), done.stderr
        outputs += [done.stdout, done.stderr]
    leaks = [text[max(0, text.find(MARK) - 60) : text.find(MARK) + 20] for text in outputs if MARK in text]
    assert not leaks, leaks
    # what stays readable: the finding, in PyTorch's words and placeholders
    done = _run(["analyze", *inputs, "--redact", "--json"], False, tmp_path)
    report = json.loads(done.stdout)
    assert report["verdict"]["summary"].startswith("hang: rank 1 never issued op1 #3 of group1 (pg pg1, 2 ranks)")
    # and without --redact, the same names are all there (the test would catch nothing otherwise)
    done = _run(["analyze", *inputs, "--json"], False, tmp_path)
    assert f"{MARK}op #3 of {MARK}desc" in done.stdout


def test_redact_keeps_the_evidence_beside_the_dumps_and_none_of_its_names(tmp_path: Path):
    """Redaction is a view: stack snapshots, logs, .ended and rank files still decide, shown without names."""
    folder = tmp_path / f"{MARK}dumps"
    shutil.copytree(ROOT / "samples" / "gloo" / "pipeline_stopped", folder)
    for stacks in folder.glob("stacks_*.txt"):
        stacks.write_text(stacks.read_text().replace("/job/train.py", f"/home/{MARK}/{MARK}train.py")
                          .replace(" forward\n", f" {MARK}forward\n"))  # fmt: skip
    log = (
        "[rank3]: Traceback (most recent call last):\n"
        f'[rank3]:   File "/home/{MARK}/x.py", line 3, in {MARK}fn\n'
        f"[rank3]: RuntimeError: Connection closed by peer {MARK}host:29500\n"
    )
    (folder / "train.log").write_text(log)
    (folder / "gloo_trace_rank_0.ended").write_text(f"exception: ValueError: {MARK} secret\n")
    (folder / "fr_pid_rank_1").write_text(json.dumps({"rank": 1, "host": f"{MARK}node", "pid": 7, "start": 1,
                                                       "run": "r", "signal": 10}))  # fmt: skip
    verdicts = []
    for redact in ([], ["--redact"]):
        done = _run(["analyze", str(folder), "--json", *redact], False, tmp_path)
        verdict = json.loads(done.stdout)["verdict"]
        verdicts.append((done.returncode, verdict["status"], verdict.get("culprit_ranks")))
        if redact:
            texts = [done.stdout, done.stderr]
            for command in (["analyze"], ["analyze", "--format", "markdown"], ["info"]):
                more = _run([command[0], str(folder), *command[1:], "--redact"], False, tmp_path)
                texts += [more.stdout, more.stderr]
            leaks = [t[max(0, t.find(MARK) - 60) : t.find(MARK) + 20] for t in texts if MARK in t]
            assert not leaks, leaks
    assert verdicts[0] == verdicts[1] and verdicts[0][:2] == (1, "hang") and verdicts[0][2][0] == 2


def test_the_server_serves_only_the_link_and_outlasts_idle_clients(tmp_path: Path):
    import socket
    import threading
    import urllib.error
    import urllib.parse
    import urllib.request

    from fr2perfetto import serve

    trace = tmp_path / "t.pftrace"
    trace.write_bytes(b"trace bytes")
    links: list[str] = []
    result: dict[str, object] = {}
    ready = threading.Event()

    def announce(link: str, opened: bool) -> None:
        links.append(link)
        ready.set()

    def run() -> None:
        result["fetched"] = serve.serve_once(str(trace), port=0, open_browser=lambda _: False, announce=announce)

    server = threading.Thread(target=run)
    server.start()
    assert ready.wait(10)
    url = urllib.parse.unquote(links[0].split("url=", 1)[1].split("&", 1)[0])
    port = int(url.split("127.0.0.1:")[1].split("/")[0])
    idle = socket.create_connection(("127.0.0.1", port))  # connects and says nothing
    with pytest.raises(urllib.error.HTTPError):  # the file without the token in the link: not served
        urllib.request.urlopen(f"http://127.0.0.1:{port}/t.pftrace", timeout=10)
    aborted = socket.create_connection(("127.0.0.1", port))  # starts asking, then goes away
    aborted.sendall(f"GET {url.split(str(port), 1)[1]} HTTP/1.1\r\nHost:".encode())
    aborted.close()
    with urllib.request.urlopen(url, timeout=HANG_GUARD) as response:  # served whatever the others do
        assert response.read() == b"trace bytes"
    server.join(10)
    idle.close()
    assert result["fetched"] is True
