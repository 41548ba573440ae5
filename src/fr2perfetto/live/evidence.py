"""Write the evidence of a job that stands still into a folder of its own, in the names ``analyze`` reads:
each rank's Flight Recorder as ``<backend>_trace_rank_<rank>.json`` (``read.files``: the rank from the
name's trailing number) with ``<file>.ended`` beside it saying ``running`` (the capture helper's word for a
dump taken from a running job, which the diagnosis weighs), each round of its stacks as
``stacks_rank_<rank>_<YYYYmmdd_HHMMSS_micro>.txt`` (the capture helper's snapshot names; ``read.stacks``
takes the rank and the local time from them), and ``fr2perfetto_watch.json``, what was taken from where and
when (``read.inputs`` passes it over, as it passes over the report written beside).

Files only: what to take, and from where, is the caller's. Every file is written whole under a hidden
name and renamed into place, in a folder of this user that is not a link (``capture.write_into_folder``).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field

from ..capture import write_into_folder
from ..read.files import open_regular
from ..read.reader import DumpError, read_dump

MANIFEST = "fr2perfetto_watch.json"
REPORT = "fr2perfetto_report.json"
TRACE = "hang.pftrace"
_FOREIGN_HEADER = re.compile(rb"^=== Rank [^\n]*\n?", re.M)  # a rank's own stacks name no other rank
_BACKEND = re.compile(r"[a-z0-9]{1,16}")


@dataclass(slots=True)
class Taken:
    """What one rank gave in one round: its recorders' JSON by recorder name, its stacks, or why not."""

    recorders: dict[str, bytes] = field(default_factory=dict)
    stacks: bytes | None = None
    failure: str = ""


@dataclass(slots=True)
class Round:
    """One round of taking evidence: when (the wall clock) and what each rank gave."""

    time: float
    ranks: dict[int, Taken]


def check_out(path: str) -> str | None:
    """Why ``path`` cannot take a watch's evidence (something other than an empty folder, or a folder
    not yet made, is there); None when it can."""
    if os.path.islink(path):
        return "a symbolic link: give a folder of its own"
    if not os.path.exists(path):
        return None
    if not os.path.isdir(path):
        return "not a folder"
    try:
        if any(True for _ in os.scandir(path)):
            return "a folder with files in it already: the evidence of a watch goes into a folder of its own"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    return None


def folder_for(out: str | None, number: int, now: float) -> str:
    """The folder of the ``number``-th hang caught (from 1): ``out`` for the first, ``out-2`` after; by
    default ``fr2perfetto-hang-<local time>`` in the current folder. Made, private to the user."""
    if out is None:
        base = "fr2perfetto-hang-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        path = base if number == 1 or not os.path.exists(base) else f"{base}-{number}"
    else:
        path = out if number == 1 else f"{out.rstrip(os.sep)}-{number}"
    refused = check_out(path)
    if refused is not None:
        raise OSError(f"{path}: {refused}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return os.path.abspath(path)


def _stamp(moment: float) -> str:
    """``YYYYmmdd_HHMMSS_micro``, local time: the capture helper's snapshot names."""
    return time.strftime("%Y%m%d_%H%M%S", time.localtime(moment)) + f"_{int(moment % 1 * 1e6):06d}"


def write_rounds(folder: str, rounds: list[Round]) -> list[str]:
    """Write each rank's newest Flight Recorders (of the last round that gave each) and every round's
    stacks; return the names written. A recorder with entries is written; where none of a rank's has,
    the last one asked (an empty recorder still says the rank recorded nothing)."""
    written: list[str] = []
    newest: dict[int, dict[str, bytes]] = {}
    for taken_round in rounds:
        stamp = _stamp(taken_round.time)
        for rank, taken in sorted(taken_round.ranks.items()):
            if taken.recorders:
                newest[rank] = taken.recorders
            if taken.stacks:
                name = f"stacks_rank_{rank}_{stamp}.txt"
                write_into_folder(folder, name, _FOREIGN_HEADER.sub(b"", taken.stacks))
                written.append(name)
    for rank, recorders in sorted(newest.items()):
        chosen = {name: data for name, data in recorders.items() if _has_entries(data)}
        if not chosen:
            last = list(recorders)[-1]
            chosen = {last: recorders[last]}
        for backend, data in chosen.items():
            backend = backend if _BACKEND.fullmatch(backend) else "fr"
            name = f"{backend}_trace_rank_{rank}.json"
            write_into_folder(folder, f"{name}.ended", b"running\n")
            write_into_folder(folder, name, data)
            written.append(name)
    return written


def _has_entries(data: bytes) -> bool:
    """Whether a recorder's JSON reads as a dump with an entry (a rank that recorded nothing there)."""
    try:
        return bool(read_dump("rank_0.json", data, max_bytes=max(1, len(data))).entries)
    except DumpError:
        return False


def copy_into(folder: str, paths: list[str], max_bytes: int) -> list[str]:
    """Copy regular files (never what a link points to elsewhere, never a FIFO) into ``folder`` under their
    names; those over ``max_bytes``, or that cannot be read, are left; return the names copied."""
    copied = []
    for path in paths:
        name = os.path.basename(path)
        if not name or name.startswith(".") or os.path.islink(path):
            continue
        try:
            with open_regular(path) as handle:
                data = handle.read(max_bytes + 1)
            if len(data) > max_bytes:
                continue
            write_into_folder(folder, name, data)
            copied.append(name)
        except (OSError, ValueError):
            continue
    return copied


def write_manifest(folder: str, notes: dict[str, object]) -> None:
    """``fr2perfetto_watch.json``: what was taken, from where and when (``notes``, as JSON)."""
    write_into_folder(folder, MANIFEST, (json.dumps(notes, indent=2, sort_keys=True) + "\n").encode())
