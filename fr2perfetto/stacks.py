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

from .model import Frame, StackSnapshot, ThreadStack
from .text import safe_text

_SECTION = re.compile(r"^=== Rank (\d+)\b.*===\s*$")
_FAULT_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FAULT_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')
_SPY_THREAD = re.compile(r'^Thread (\d+|0x[0-9a-fA-F]+)(?: \((\w+)\))?:?\s*(?:"(.*)")?\s*$')
_SPY_FRAME = re.compile(r"^\s+(\S.*?) \((.*):(\d+)\)\s*$")
_NAME_TIME = re.compile(r"(\d{8})_(\d{6})")
_NAME_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
MAX_FRAMES = 256


def parse_stacks(text: str, source: str, mtime_ns: int | None = None) -> list[StackSnapshot]:
    """Every rank's snapshot in one file (one, when the file is of one rank)."""
    when = _time_from_name(os.path.basename(source)) or mtime_ns
    default_rank = _rank_from_path(source)
    sections: list[tuple[int | None, list[str]]] = [(default_rank, [])]
    for line in text.splitlines():
        header = _SECTION.match(line)
        if header:
            sections.append((int(header.group(1)), []))
        else:
            sections[-1][1].append(line)
    snapshots = []
    for rank, lines in sections:
        threads = _threads(lines)
        if rank is not None and threads and rank < 1 << 24:
            snapshots.append(StackSnapshot(rank, when, source, threads))
    return snapshots


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
        spy = None if fault else _SPY_THREAD.match(line)
        if fault or spy:
            close()
            frames = []
            if fault:
                name, current = f"thread {fault.group(2)}", fault.group(1) == "Current thread"
            else:
                assert spy is not None
                name, current = safe_text(spy.group(3) or f"thread {spy.group(1)}"), False
            continue
        frame = _FAULT_FRAME.match(line)
        if frame:
            frames.append(Frame(safe_text(frame.group(3)), safe_text(frame.group(1)), int(frame.group(2))))
            continue
        frame = _SPY_FRAME.match(line)
        if frame and name is not None:
            frames.append(Frame(safe_text(frame.group(1)), safe_text(frame.group(2)), int(frame.group(3))))
    close()
    return [t for t in threads if t.frames]


def _time_from_name(name: str) -> int | None:
    found = _NAME_TIME.search(name)
    if not found:
        return None
    try:
        moment = datetime.datetime.strptime(found.group(1) + found.group(2), "%Y%m%d%H%M%S")
    except ValueError:
        return None
    return int(moment.timestamp()) * 1_000_000_000  # the debug server writes local time


def _rank_from_path(path: str) -> int | None:
    name = os.path.basename(path)
    found = _NAME_RANK.search(name)
    if found:
        return int(found.group(1))
    parent = os.path.basename(os.path.dirname(path.replace("!", "/")))
    return int(parent) if parent.isdigit() and len(parent) < 8 else None


def main_thread(snapshot: StackSnapshot) -> ThreadStack | None:
    """The thread that runs the script: py-spy's ``MainThread``, else the one whose outermost frame is
    the script's ``<module>``, else the last one listed that is not the dumping thread."""
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


def _library(filename: str) -> bool:
    return (
        bool(_LIBRARY_PATH.search(filename))
        or os.path.basename(filename) in _LIBRARY_FILES
        or (filename.startswith("<"))
    )


def where(thread: ThreadStack) -> tuple[Frame, bool]:
    """Where a thread is: its innermost frame in the script's own code (not torch's, not the standard
    library's), and whether it is inside a collective (torch.distributed's frames above it)."""
    in_collective = any(re.search(r"torch[/\\]distributed[/\\]", f.filename) for f in thread.frames)
    for frame in thread.frames:
        if not _library(frame.filename):
            return frame, in_collective
    return thread.frames[0], in_collective
