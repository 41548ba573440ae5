"""Find what the inputs hold: dumps, stack snapshots and logs, in folders (searched through) and archives.

People have dumps the way they gathered them: a folder per node, a ``dumps.tar.gz`` attached to a bug
report, the folder PyTorch's debug server writes (``stacks_<time>.txt`` beside them), TorchComms'
``per_rank/rank_<N>`` or ``torchcomm_fr_trace_<rank>``. Folders are searched through (hidden ones
left out); ``.tar``, ``.tar.gz``/``.tgz`` and ``.zip`` archives are read in memory as if unpacked:
nothing is written, a member that would land outside the archive's folder (``../``, an absolute path)
refuses the archive, and so does one over the size limit, or more than ``ARCHIVE_LIMIT`` in all.
Each file is sorted by its name (and, for text, its first bytes) into a dump, a stack snapshot, a log,
or a file skipped, counted by why.
"""

from __future__ import annotations

import os
import posixpath
import re
import tarfile
import zipfile
from collections import Counter
from dataclasses import dataclass, field

from .files import expand_inputs, parse_dump_name
from .model import LoadProblem

ARCHIVE_LIMIT = 8 << 30  # bytes an archive may unpack to, in all
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
_STACK_NAME = re.compile(r"(^stacks_.*\.txt$|^pyspy.*|^py-spy.*|.*\.stacks?(\.txt)?$)", re.IGNORECASE)
_LOG_NAME = re.compile(r"(\.(log|out|err)$|^(stderr|stdout)(\.\w+)?$)", re.IGNORECASE)
# what fr2perfetto's own capture and writers leave beside dumps: passed over without a word
_COMPANIONS = re.compile(r"(^fr_(pid|pipe)_rank_|\.(ended|partial|pipe|pftrace|pftrace\.gz)$)")
_NOT_DUMPS = re.compile(
    r"(^\.|^fr_(pid|pipe)_rank_|\.(pftrace|gz|md|txt|log|py|sh|tmp|partial|pipe|ended|json\.gz|html|csv)$)"
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Source:
    """One file to read: its path as shown, and its bytes when it came from an archive (else None:
    read from disk)."""

    path: str
    data: bytes | None = None

    def read(self, limit: int) -> bytes:
        if self.data is not None:
            return self.data
        with open(self.path, "rb") as handle:
            return handle.read(limit)


@dataclass(slots=True)
class Found:
    """What the inputs hold."""

    dumps: list[Source] = field(default_factory=list)
    stacks: list[Source] = field(default_factory=list)
    logs: list[Source] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)  # why -> how many files
    problems: list[LoadProblem] = field(default_factory=list)


def find_inputs(inputs: list[str], max_bytes: int, logs: list[str] | None = None) -> Found:
    """Sort every file the inputs name or hold (and ``logs``: files or folders of logs) by kind."""
    found = Found()
    paths, unmatched = expand_inputs(inputs, recursive=True)
    found.problems += [LoadProblem(item, "no such file or directory, or no dump in it") for item in unmatched]
    for path in paths:
        if path.lower().endswith(ARCHIVE_SUFFIXES):
            _archive(path, max_bytes, found)
        else:
            _sort(Source(path), os.path.basename(path), found)
    if logs:
        log_paths, missing = expand_inputs(logs, recursive=True)
        found.problems += [LoadProblem(item, "no such log file or directory") for item in missing]
        found.logs += [Source(p) for p in log_paths]
    return found


def _sort(source: Source, name: str, found: Found) -> None:
    if _COMPANIONS.search(name):
        return
    if _STACK_NAME.search(name):
        found.stacks.append(source)
    elif _LOG_NAME.search(name):
        found.logs.append(source)
    elif name.lower().endswith(".txt") and _looks_like_stacks(source):
        found.stacks.append(source)
    elif _NOT_DUMPS.search(name):
        found.skipped["not a dump by its name"] += 1
    elif parse_dump_name(name) is None:
        found.skipped["no rank in its name"] += 1
    else:
        found.dumps.append(source)


def _looks_like_stacks(source: Source) -> bool:
    try:
        head = source.read(4096)[:4096]
    except OSError:
        return False
    return b"(most recent call first)" in head or re.match(rb"Process \d+: ", head) is not None


def _archive(path: str, max_bytes: int, found: Found) -> None:
    """Sort an archive's regular files, read in memory; refuse the whole archive in one line if a
    member would escape its folder or the sizes pass the limits."""
    try:
        members = _tar_members(path, max_bytes) if not path.lower().endswith(".zip") else _zip_members(path, max_bytes)
    except _Refused as refusal:
        found.problems.append(LoadProblem(path, f"archive refused: {refusal}"))
        return
    except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError, ValueError) as error:
        first = (str(error).splitlines() or [""])[0]
        found.problems.append(LoadProblem(path, f"not a readable archive ({type(error).__name__}: {first})"[:200]))
        return
    for name, data in members:
        _sort(Source(f"{path}!{name}", data), posixpath.basename(name), found)


class _Refused(Exception):
    """An archive that must not be read."""


def _safe_name(name: str) -> str:
    normal = posixpath.normpath(name.replace("\\", "/"))
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or normal == ".." or normal.startswith("../"):
        raise _Refused(f"member {name!r} would land outside the archive's folder")
    return normal


def _hidden(name: str) -> bool:
    return any(part.startswith(".") for part in name.split("/")[:-1])


def _tar_members(path: str, max_bytes: int) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    total = 0
    with tarfile.open(path, "r:*") as archive:
        for member in archive:
            name = _safe_name(member.name)
            if not member.isreg() or _hidden(name):
                continue  # links, devices, folders: nothing to read (and nothing is ever written)
            if member.size > max_bytes:
                raise _Refused(f"member {name!r} is {member.size >> 20} MB, over the largest dump read")
            handle = archive.extractfile(member)
            data = handle.read(max_bytes + 1) if handle is not None else b""
            total += len(data)
            if len(data) > max_bytes or total > ARCHIVE_LIMIT:
                raise _Refused(f"it unpacks to more than {min(max_bytes, ARCHIVE_LIMIT) >> 20} MB")
            out.append((name, data))
    return out


def _zip_members(path: str, max_bytes: int) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    total = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = _safe_name(info.filename)
            if info.is_dir() or _hidden(name):
                continue
            with archive.open(info) as handle:  # the sizes a zip declares may lie: read with a bound
                data = handle.read(max_bytes + 1)
            total += len(data)
            if len(data) > max_bytes or total > ARCHIVE_LIMIT:
                raise _Refused(f"member {name!r} unpacks to more than the largest dump read")
            out.append((name, data))
    return out


def read_limited(source: Source, limit: int) -> bytes:
    """A text file's bytes, at most ``limit`` (logs can be large: their end matters most)."""
    if source.data is not None:
        return source.data[-limit:]
    with open(source.path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            handle.seek(size - limit)
        return handle.read(limit)
