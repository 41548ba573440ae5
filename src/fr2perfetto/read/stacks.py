"""Read stack snapshots: where each thread of each rank was, at a moment.

Two text forms, as people have them when a job hangs:

- Python's ``faulthandler.dump_traceback`` (what PyTorch's debug server writes per rank into
  ``stacks_<YYYYmmdd_HHMMSS>.txt``, under ``=== Rank <N>: <address> ===`` headers)::

      Thread 0x00007fb9e27d3b80 (most recent call first):
        File "/job/train.py", line 140 in train_step

- py-spy's ``dump`` (taken by hand on a hung rank)::

      Thread 2345 (idle): "MainThread"
          train_step (train.py:140)

Frames come innermost first in both. A snapshot's rank comes from its section header, else from the
file name (``pyspy_rank_3.txt``, ``3/stacks.txt``); its time from the debug server's file name (local
time), else from the file's modification time. Lines that are neither are ignored.
"""

from __future__ import annotations

import datetime
import os
import re

from ..base.model import MAX_RANK, Frame, StackSnapshot, ThreadStack, plausible_time
from ..base.text import is_number, safe_text

_FAULT_THREAD = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]{1,16}) \(most recent call first\):")
_SPY_THREAD = re.compile(r"Thread (\d{1,20}|0x[0-9a-fA-F]{1,16})(?: \((\w{1,32})\))?:?")
_NAME_TIME = re.compile(r"(\d{8})_(\d{6})")
_NAME_RANK = re.compile(r"rank[_-]?(\d{1,8})(?!\d)", re.IGNORECASE)
MAX_FRAMES = 256
# Longer lines are cut before they are read: no frame or header is this long, and every step below
# is then bounded per line, so reading a file costs time in proportion to its size.
MAX_LINE = 4096
MAX_LINE_NUMBER = 1 << 31


def parse_stacks(
    text: str, source: str, mtime_ns: int | None = None, notes: list[str] | None = None
) -> list[StackSnapshot]:
    """Every rank's snapshot in one file (one, when the file is of one rank). A time that is no
    plausible date is dropped (the snapshot stays, untimed), and ``notes`` says so."""
    found = _time_from_name(os.path.basename(source)) or mtime_ns
    when = plausible_time(found)
    if found is not None and when is None and notes is not None:
        notes.append("its time is no plausible date (before 1990 or after 2199): ignored")
    default_rank = _rank_from_path(source)
    sections: list[tuple[int | None, list[str]]] = [(default_rank, [])]
    for line in text.splitlines():
        line = line[:MAX_LINE]
        rank = _section_rank(line)
        if rank is not None:
            sections.append((rank, []))
        else:
            sections[-1][1].append(line)
    snapshots = []
    for rank, lines in sections:
        threads = _threads(lines)
        if rank is not None and threads and rank < MAX_RANK:
            snapshots.append(StackSnapshot(rank, when, source, threads))
    return snapshots


def _section_rank(line: str) -> int | None:
    """The rank of a debug-server section header, ``=== Rank 3: 10.0.0.7:29500 ===``; None: not one."""
    if not line.startswith("=== Rank ") or not line.rstrip().endswith("==="):
        return None
    digits = line[9:].split(":", 1)[0].split(" ", 1)[0]
    return int(digits) if is_number(digits) and len(digits) <= 8 else None


def python_frame(body: str, before_name: str) -> Frame | None:
    """``File "/job/train.py", line 140<before_name>train_step`` (no indent) as a frame; None: not one.
    Python's tracebacks put ``, in `` before the name, faulthandler `` in ``."""
    if not body.startswith('File "'):
        return None
    quote = body.rfind('", line ')
    if quote < 5:
        return None
    number, found, name = body[quote + 8 :].partition(before_name)
    if not found or not name.strip() or not _line_number(number):
        return None
    return Frame(safe_text(name.strip()), safe_text(body[6:quote]), int(number))


def _fault_frame(line: str) -> Frame | None:
    """``  File "/job/train.py", line 140 in train_step`` (faulthandler's form)."""
    if not line[:1].isspace():
        return None
    return python_frame(line.strip(), " in ")


def _spy_frame(line: str) -> Frame | None:
    """``    train_step (train.py:140)`` (py-spy's form)."""
    if not line[:1].isspace():
        return None
    body = line.strip()
    if not body.endswith(")"):
        return None
    inner = body[:-1]
    colon = inner.rfind(":")
    number = inner[colon + 1 :]
    opening = inner.find(" (", 1)
    if colon < 0 or not _line_number(number) or opening < 0 or opening + 2 > colon:
        return None
    return Frame(safe_text(inner[:opening]), safe_text(inner[opening + 2 : colon]), int(number))


def _line_number(text: str) -> bool:
    return text.isdigit() and text.isascii() and len(text) <= 10 and int(text) < MAX_LINE_NUMBER


def _spy_thread(line: str) -> tuple[str, str | None] | None:
    """``Thread 2345 (idle): "MainThread"``: (its id, its name if given); None: not such a line."""
    head = _SPY_THREAD.match(line)
    if head is None:
        return None
    rest = line[head.end() :].strip()
    if not rest:
        return head.group(1), None
    if len(rest) >= 2 and rest[0] == rest[-1] == '"':
        return head.group(1), rest[1:-1]
    return None


def _threads(lines: list[str]) -> list[ThreadStack]:
    threads: list[ThreadStack] = []
    name: str | None = None
    frames: list[Frame] = []
    current = False

    def close() -> None:
        if name is not None:
            threads.append(ThreadStack(name, tuple(frames[:MAX_FRAMES]), current))

    for line in lines:
        fault = _FAULT_THREAD.match(line)
        spy = None if fault else _spy_thread(line)
        if fault or spy:
            close()
            frames = []
            if fault:
                name, current = f"thread {fault.group(2)}", fault.group(1) == "Current thread"
            else:
                assert spy is not None
                name, current = safe_text(spy[1] or f"thread {spy[0]}"), False
            continue
        frame = _fault_frame(line) or (_spy_frame(line) if name is not None else None)
        if frame is not None and len(frames) < MAX_FRAMES:
            frames.append(frame)
    close()
    return [t for t in threads if t.frames]


def _time_from_name(name: str) -> int | None:
    found = _NAME_TIME.search(name)
    if not found:
        return None
    try:
        moment = datetime.datetime.strptime(found.group(1) + found.group(2), "%Y%m%d%H%M%S")
        return int(moment.timestamp()) * 1_000_000_000  # the debug server writes local time
    except (ValueError, OverflowError, OSError):
        return None


def _rank_from_path(path: str) -> int | None:
    name = os.path.basename(path)
    found = _NAME_RANK.search(name)
    if found:
        return int(found.group(1))
    parent = os.path.basename(os.path.dirname(path.replace("!", "/")))
    return int(parent) if parent.isdigit() and parent.isascii() and len(parent) < 8 else None


def main_thread(snapshot: StackSnapshot) -> ThreadStack | None:
    """The thread that runs the script, the one judged: py-spy's ``MainThread``, else the one whose
    outermost frame is the script's ``<module>``, else the last one listed that is not the dumping
    thread (faulthandler lists threads newest first: the main thread, the oldest, comes last)."""
    for thread in snapshot.threads:
        if thread.name == "MainThread":
            return thread
    for thread in snapshot.threads:
        if thread.frames[-1].name == "<module>":
            return thread
    others = [t for t in snapshot.threads if not t.current] or snapshot.threads
    return others[-1] if others else None


_LIBRARY_PATH = re.compile(r"(site-packages|dist-packages|[/\\]lib[/\\]python\d|(^|[/\\])torch[/\\])")
# standard-library files py-spy names without their folder, where threads wait
_LIBRARY_FILES = {
    "threading.py", "queue.py", "selectors.py", "socket.py", "subprocess.py", "connection.py",
    "synchronize.py", "popen_fork.py", "pool.py", "thread.py", "_base.py", "process.py", "ssl.py", "tempfile.py",
}  # fmt: skip
_DISTRIBUTED = re.compile(r"torch[/\\]distributed[/\\]")
_COMMUNICATION_FILES = ("distributed_c10d.py", "c10d_logger.py")
_COMMUNICATION_CALL = re.compile(r"wait|recv|send|barrier|reduce|gather|scatter|broadcast|all_to_all|p2p|collective")


def _library(filename: str) -> bool:
    return (
        bool(_LIBRARY_PATH.search(filename))
        or os.path.basename(filename) in _LIBRARY_FILES
        or (filename.startswith("<"))
    )


def communication_call(thread: ThreadStack) -> Frame | None:
    """The communication call a thread waits in, or None: its innermost frame, when that is
    torch.distributed's code of a collective, a send or recv, or a wait on one (``all_reduce`` in
    ``distributed_c10d.py``, ``_wait_batch_p2p`` in ``pipelining/schedules.py``). Those calls block in
    C++, below their last Python frame, so the innermost Python frame is where the thread waits; a
    thread with torch.distributed's frames further out (a pipeline stage running its module's
    forward) is not waiting in one."""
    inner = thread.frames[0]
    if not _DISTRIBUTED.search(inner.filename):
        return None
    if inner.filename.endswith(_COMMUNICATION_FILES) or _COMMUNICATION_CALL.search(inner.name.lower()):
        return inner
    return None


def where(thread: ThreadStack) -> tuple[Frame, bool]:
    """Where a thread is: its innermost frame in the script's own code (not torch's, not the standard
    library's), and whether it waits in a communication call (``communication_call``)."""
    in_communication = communication_call(thread) is not None
    for frame in thread.frames:
        if not _library(frame.filename):
            return frame, in_communication
    return thread.frames[0], in_communication
