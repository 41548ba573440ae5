"""Find what the inputs hold: dumps, stack snapshots and logs, in folders (searched through) and archives.

People have dumps the way they gathered them: a folder per node, a ``dumps.tar.gz`` attached to a bug
report, the folder PyTorch's debug server writes (``stacks_<time>.txt`` beside them), TorchComms'
``per_rank/rank_<N>`` or ``torchcomm_fr_trace_<rank>``. Folders are searched through (hidden ones
left out). Each file is sorted by its name (and, for text, its first bytes) into a dump, a stack
snapshot, a log, or a file skipped, counted by why.

``.tar``, ``.tar.gz``/``.tgz`` and ``.zip`` archives are read as if unpacked, one member at a time and
nothing written: a dump member is read (never more than the largest dump read, and only once its first
bytes look like a dump) and handed to ``read_member`` at once, so that no more than one member's bytes
are held; of a log or stack snapshot only its end is kept. What an archive may cost is bounded while it
inflates, never taken from what it claims: at most ``ARCHIVE_LIMIT`` bytes and ``MAX_MEMBERS`` members in
all, and no more than ``MAX_RATIO`` times its compressed size (a compression bomb inflates a thousand
times; real dumps, three to ten). A member that would land outside the archive's folder (``../``, an
absolute path) refuses the archive; a damaged one is reported in one line, with what was read before
the damage kept.
"""

from __future__ import annotations

import glob
import os
import posixpath
import re
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from ..base.model import LoadProblem, RankDump
from .files import expand_inputs, parse_dump_name

ARCHIVE_LIMIT = 8 << 30  # bytes an archive may unpack to, in all
MAX_MEMBERS = 200_000
MAX_RATIO = 100  # inflated bytes per compressed byte, past RATIO_FLOOR
RATIO_FLOOR = 32 << 20  # an archive may inflate this much whatever its ratio
TEXT_LIMIT = 16 << 20  # bytes of a log or stack file read (its end)
SMALL_TEXT_LIMIT = 4096  # bytes of a .ended or rank file read
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
_STACK_NAME = re.compile(r"(^stacks_.*\.txt$|^pyspy.*|^py-spy.*|.*\.stacks?(\.txt)?$)", re.IGNORECASE)
_LOG_NAME = re.compile(r"(\.(log|out|err)$|^(stderr|stdout)(\.\w+)?$)", re.IGNORECASE)
# what fr2perfetto's own capture and writers leave beside dumps: passed over without a word
_RANK_FILE = re.compile(r"fr_pid_rank_\d{1,8}")  # capture.rank_file_name
_COMPANIONS = re.compile(r"(^fr_(pid|pipe)_rank_|\.(ended|partial|pipe|pftrace|pftrace\.gz)$)")
_NOT_DUMPS = re.compile(
    r"(^\.|^fr_(pid|pipe)_rank_|\.(pftrace|gz|md|txt|log|py|sh|tmp|partial|pipe|ended|json\.gz|html|csv)$)"
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Source:
    """One file to read: its path as shown, and its bytes when it came from an archive (else None:
    read from disk; for a log or snapshot from an archive, its last ``TEXT_LIMIT`` bytes)."""

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

    dumps: list[Source] = field(default_factory=list)  # on disk
    archived: list[RankDump | LoadProblem] = field(default_factory=list)  # dumps read from archives
    stacks: list[Source] = field(default_factory=list)
    logs: list[Source] = field(default_factory=list)
    endings: list[Source] = field(default_factory=list)  # <dump>.ended: how the capture helper's rank ended
    rank_files: list[Source] = field(default_factory=list)  # fr_pid_rank_<N>: the capture helper's host and pid
    skipped: dict[str, list[str]] = field(default_factory=dict)  # why -> the files skipped for it
    problems: list[LoadProblem] = field(default_factory=list)


ReadMember = Callable[[str, bytes], "RankDump | LoadProblem"]


def find_inputs(inputs: list[str], max_bytes: int, read_member: ReadMember, logs: list[str] | None = None) -> Found:
    """Sort every file the inputs name or hold (and ``logs``: files or folders of logs) by kind; a dump in
    an archive is read there and then, by ``read_member(path, data)``."""
    found = Found()
    paths, unmatched = expand_inputs(inputs)
    found.problems += [LoadProblem(item, _why_nothing(item)) for item in unmatched]
    for path in paths:
        if path.lower().endswith(ARCHIVE_SUFFIXES):
            _archive(path, max_bytes, read_member, found)
        else:
            _sort(Source(path), os.path.basename(path), found)
    if logs:
        log_paths, missing = expand_inputs(logs)
        found.problems += [LoadProblem(item, "no such log file or directory") for item in missing]
        found.logs += [Source(p) for p in log_paths]
    return found


def _why_nothing(item: str) -> str:
    """Why an input gave no file: it does not exist, it is an empty folder, or a pattern matched nothing."""
    if os.path.isdir(item):
        return "an empty folder (no file in it, hidden ones aside)"
    if os.path.lexists(item):
        return "not a regular file"
    if glob.has_magic(item):
        return "the pattern matches no file"
    return "no such file or directory"


def _kind(name: str) -> str | None:
    """What a file is by its name: ``stacks``, ``log``, ``text`` (a .txt that may be stacks), ``dump``,
    None for what fr2perfetto itself leaves beside dumps, else why it is skipped."""
    if name.endswith(".ended") and parse_dump_name(name[: -len(".ended")]) is not None:
        return "ended"
    if _RANK_FILE.fullmatch(name):
        return "rank file"
    if _COMPANIONS.search(name):
        return None
    if _STACK_NAME.search(name):
        return "stacks"
    if _LOG_NAME.search(name):
        return "log"
    if name.lower().endswith(".txt"):
        return "text"
    if _NOT_DUMPS.search(name):
        return "not a dump by its name"
    if parse_dump_name(name) is None:
        return "no rank in its name"
    return "dump"


def _sort(source: Source, name: str, found: Found) -> None:
    kind = _kind(name)
    if kind == "stacks" or (kind == "text" and _looks_like_stacks(source)):
        found.stacks.append(source)
    elif kind == "log":
        found.logs.append(source)
    elif kind == "dump":
        found.dumps.append(source)
    elif kind == "ended":
        found.endings.append(source)
    elif kind == "rank file":
        found.rank_files.append(source)
    elif kind == "text":
        found.skipped.setdefault("not a dump by its name", []).append(source.path)
    elif kind is not None:
        found.skipped.setdefault(kind, []).append(source.path)


def _looks_like_stacks(source: Source) -> bool:
    try:
        head = source.read(4096)[:4096]
    except OSError:
        return False
    return b"(most recent call first)" in head or re.match(rb"Process \d+: ", head) is not None


def looks_like_a_dump(head: bytes) -> bool:
    """Whether a file's first bytes could begin a dump: a pickle's protocol opcode, or JSON's ``{``."""
    return not head or head[:1] == b"\x80" or head.lstrip()[:1] in (b"{", b"")


class _Refused(Exception):
    """An archive that must not be read (further)."""


class _Budget:
    """What an archive may still inflate to, checked as it inflates: bytes in all, members, and bytes per
    compressed byte read so far (``compressed()``: how far into the archive's file reading has come)."""

    def __init__(self, compressed: Callable[[], int]) -> None:
        self.compressed = compressed
        self.inflated = 0
        self.members = 0

    def member(self) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise _Refused(f"more than {MAX_MEMBERS} members")

    def claim(self, size: int, what: str) -> None:
        """Before reading: a size the archive declares, checked as if inflated (tar sizes are what the
        stream holds; a zip's may lie, and the reading below still checks)."""
        self.check(self.inflated + size, what)

    def take(self, size: int, what: str) -> None:
        self.inflated += size
        self.check(self.inflated, what)

    def check(self, inflated: int, what: str) -> None:
        if inflated > ARCHIVE_LIMIT:
            raise _Refused(f"it inflates to more than {ARCHIVE_LIMIT >> 30} GB (at {what})")
        if inflated > RATIO_FLOOR and inflated > MAX_RATIO * max(1, self.compressed()):
            raise _Refused(
                f"it inflates more than {MAX_RATIO} times its compressed size (at {what}): a compression bomb?"
            )


def _archive(path: str, max_bytes: int, read_member: ReadMember, found: Found) -> None:
    """Sort an archive's regular files, one at a time; refuse the rest of the archive in one line if a
    member would escape its folder or a limit is passed, and say so in one line if it is damaged."""
    read = 0
    try:
        with open(path, "rb") as raw:
            budget = _Budget(raw.tell)
            members = _zip_members(raw, budget) if path.lower().endswith(".zip") else _tar_members(raw, budget)
            for name, size, handle in members:
                read += 1
                _archived_member(f"{path}!{name}", posixpath.basename(name), size, handle, max_bytes, budget,
                                 read_member, found)  # fmt: skip
    except _Refused as refusal:
        found.problems.append(LoadProblem(path, f"archive refused: {refusal}"))
    except Exception as error:  # zlib.error, EOFError, tarfile and zipfile errors, OSError: a damaged archive
        first = (str(error).splitlines() or [""])[0][:120]
        what = "not a readable archive" if read == 0 else f"damaged after {read} members (those are read)"
        found.problems.append(LoadProblem(path, f"{what} ({type(error).__name__}: {first})"))


_Member = tuple[str, int, "IO[bytes] | None"]


def _tar_members(raw: IO[bytes], budget: _Budget):  # type: ignore[no-untyped-def]
    """(name, declared size, reader) of each regular file of a tar, as the stream reaches it."""
    with tarfile.open(fileobj=raw, mode="r|*") as archive:
        for member in archive:
            budget.member()
            name = _safe_name(member.name)
            if not member.isreg() or _hidden(name):
                continue  # links, devices, folders: nothing to read (and nothing is ever written)
            budget.claim(member.size, repr(name))
            yield name, member.size, archive.extractfile(member)


def _zip_members(raw: IO[bytes], budget: _Budget):  # type: ignore[no-untyped-def]
    with zipfile.ZipFile(raw) as archive:
        infos = archive.infolist()
        if len(infos) > MAX_MEMBERS:
            raise _Refused(f"more than {MAX_MEMBERS} members")
        consumed = 0
        for info in infos:
            budget.member()
            name = _safe_name(info.filename)
            if info.is_dir() or _hidden(name):
                continue
            # a zip member's compressed bytes are known: the ratio is judged on what has been read
            consumed += info.compress_size
            budget.compressed = lambda done=consumed: done  # type: ignore[misc]
            budget.claim(info.file_size, repr(name))
            with archive.open(info) as handle:
                yield name, info.file_size, handle


def _archived_member(
    path: str, name: str, size: int, handle: IO[bytes] | None, max_bytes: int, budget: _Budget,
    read_member: ReadMember, found: Found,
) -> None:  # fmt: skip
    """Read one member of an archive as its kind asks, within the archive's budget."""
    kind = _kind(name)
    if kind in ("ended", "rank file") and handle is not None:  # a line or two each
        source = Source(path, _read_tail(handle, SMALL_TEXT_LIMIT, budget, path))
        (found.endings if kind == "ended" else found.rank_files).append(source)
        return
    if kind is None or handle is None or kind not in ("dump", "stacks", "log", "text"):
        if kind is not None and kind not in ("dump", "stacks", "log", "text"):
            found.skipped.setdefault(kind, []).append(path)
        return
    if kind == "dump":
        if size > max_bytes:
            found.archived.append(LoadProblem(path, f"{size >> 20} MB, over the largest dump read ({max_bytes >> 20} "
                                              "MB; --max-dump-size)"))  # fmt: skip
            return
        head = _read_bounded(handle, 64, budget, path)
        if not looks_like_a_dump(head):
            found.archived.append(LoadProblem(path, "not a Flight Recorder dump (neither a pickle nor JSON)"))
            return
        data = head + _read_bounded(handle, max_bytes + 1 - len(head), budget, path)
        if len(data) > max_bytes:
            too_large = f"over the largest dump read ({max_bytes >> 20} MB; --max-dump-size)"
            found.archived.append(LoadProblem(path, too_large))
            return
        found.archived.append(read_member(path, data))
        return
    _sort(Source(path, _read_tail(handle, TEXT_LIMIT, budget, path)), name, found)


CHUNK = 1 << 20


def _read_bounded(handle: IO[bytes], limit: int, budget: _Budget, what: str) -> bytes:
    """Up to ``limit`` bytes, taken from the budget a chunk at a time."""
    parts, left = [], limit
    while left > 0:
        chunk = handle.read(min(CHUNK, left))
        if not chunk:
            break
        budget.take(len(chunk), what)
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _read_tail(handle: IO[bytes], keep: int, budget: _Budget, what: str) -> bytes:
    """The last ``keep`` bytes of a member (a log's end matters most), read through within the budget."""
    kept = bytearray()
    while chunk := handle.read(CHUNK):
        budget.take(len(chunk), what)
        kept += chunk
        if len(kept) > 2 * keep:
            del kept[: len(kept) - keep]
    return bytes(kept[-keep:])


def _safe_name(name: str) -> str:
    normal = posixpath.normpath(name.replace("\\", "/"))
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or normal == ".." or normal.startswith("../"):
        raise _Refused(f"member {name!r} would land outside the archive's folder")
    return normal


def _hidden(name: str) -> bool:
    return any(part.startswith(".") for part in name.split("/")[:-1])


def read_limited(source: Source, limit: int) -> bytes:
    """A text file's bytes, at most ``limit`` (logs can be large: their end matters most)."""
    if source.data is not None:
        return source.data[-limit:]
    with open(source.path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            handle.seek(size - limit)
        return handle.read(limit)
