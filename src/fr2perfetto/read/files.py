"""Find dump files and tell each one's rank (and host, where the name has one) from its name."""

from __future__ import annotations

import glob
import os
import re
import stat
from dataclasses import dataclass
from typing import BinaryIO

from ..base.text import path_text

_SUFFIXES = (".json", ".pkl", ".pickle", ".pt")
_TRAILING_NUMBER = re.compile(r"(\d+)$")


@dataclass(frozen=True, slots=True)
class DumpName:
    """What a dump's file name says: its rank, and a host if the name carries one."""

    rank: int
    host: str | None


def parse_dump_name(path: str) -> DumpName | None:
    """Read the rank (the trailing number) and host from a file name, or None if it has no rank.

    ``nccl_trace_rank_7``, ``trace_7``, ``rank_7.json``, ``gloo_trace_rank_7.json`` give rank 7;
    ``nccl_trace_rank_node02_7`` gives rank 7 on host ``node02``.
    """
    stem = os.path.basename(path)
    for suffix in _SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    match = _TRAILING_NUMBER.search(stem)
    if not match:
        return None
    rank = int(match.group(1))
    if rank >= 2**31:
        return None  # not a rank: a timestamp or a hash
    tokens = re.split(r"[_]", stem[: match.start()].rstrip("_-"))
    host = None
    if "rank" in tokens:
        after = tokens[len(tokens) - 1 - tokens[::-1].index("rank") + 1 :]
        if after:
            host = "_".join(after)
    return DumpName(rank, host)


def expand_inputs(inputs: list[str], passed: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Turn directories, files and glob patterns into a sorted list of files.

    Returns (files, inputs that matched nothing). A directory contributes every regular file under it,
    hidden folders and files left out: the caller sorts them by kind (``inputs``). What a directory or
    a pattern holds that is not a regular file (a link to a device, a FIFO, a socket, a broken link) is
    never opened: it goes to ``passed``, where given, for the caller to say so.
    """
    files: list[str] = []
    unmatched: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = []
            for folder, folders, names in os.walk(item):
                folders[:] = sorted(f for f in folders if not f.startswith("."))
                found += [os.path.join(folder, n) for n in names if not n.startswith(".")]
        elif os.path.isfile(item):
            found = [item]
        elif glob.has_magic(item):
            found = [p for p in glob.glob(item) if not os.path.isdir(p)]
        else:
            found = []
        regular: list[str] = []
        irregular: list[str] = []
        for path in found:
            (regular if os.path.isfile(path) else irregular).append(path)
        if passed is not None:
            passed += sorted(irregular, key=_natural_key)
        if not found:
            unmatched.append(item)
        files.extend(regular)
    unique = list(dict.fromkeys(files))  # each file once, the first time it was named
    return sorted(unique, key=_natural_key), unmatched


_KINDS = (
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
)  # fmt: skip


def not_regular(path: str) -> str | None:
    """Why ``path`` is passed over unread, in words (``a link to /dev/urandom, a character device, not a
    regular file``); None when it is a regular file or a link to one. Only its status is looked at:
    opening a device can have effects of its own, and reading a FIFO or a terminal waits for ever."""
    link = os.path.islink(path)
    target = ""
    if link:
        try:
            target = path_text(os.readlink(path))
        except OSError:
            target = "?"
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if link:
            return f"a link to {target}, which cannot be followed ({error.strerror or error})"
        return f"cannot be looked at ({error.strerror or error})"
    if stat.S_ISREG(mode):
        return None
    what = next((name for test, name in _KINDS if test(mode)), "not a file")
    return f"{'a link to ' + target + ', ' if link else ''}{what}, not a regular file"


class NotRegularFile(OSError):
    """A path that names something other than a regular file; ``strerror`` says what (``not_regular``)."""


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file (or a link to one); else ``NotRegularFile``.

    It is checked before it is opened (``not_regular``), opened without blocking, and checked again once
    open: a FIFO put in its place in between is never waited on, and what is read is what was checked."""
    why = not_regular(path)
    if why is not None:
        raise NotRegularFile(0, why)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    descriptor = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotRegularFile(0, "not a regular file (it changed while it was opened)")
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def _natural_key(path: str) -> tuple[object, ...]:
    parsed = parse_dump_name(path)
    return (os.path.dirname(path), parsed.rank if parsed else -1, path)
