"""Find what the inputs hold: dumps, stack snapshots and logs, in folders (searched through) and archives.

People have dumps the way they gathered them: a folder per node, a ``dumps.tar.gz`` attached to a bug
report, the folder PyTorch's debug server writes (``stacks_<time>.txt`` beside them), TorchComms'
``per_rank/rank_<N>`` or ``torchcomm_fr_trace_<rank>``. Folders are searched through (hidden ones
left out). Each file is sorted by its name (and, for text, its first bytes) into a dump, a stack
snapshot, a log, or a file skipped, counted by why. What is not a regular file (a link to a device, a
FIFO, a broken link) is never opened, and one line says so for each that would have been read; a log
or stack snapshot over ``TEXT_LIMIT`` is read from its end, and one line says so.

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
from .files import NotRegularFile, expand_inputs, not_regular, open_regular, parse_dump_name
from .reader import looks_like_a_dump

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
# (and the report and notes ``fr2perfetto watch`` writes beside the evidence it takes)
_COMPANIONS = re.compile(
    r"(^fr_(pid|pipe)_rank_|^fr2perfetto_(report|watch)\.(json|md)$|\.(ended|partial|pipe|pftrace|pftrace\.gz)$)"
)
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
        """Its first ``limit`` bytes (all of them, from an archive); ``OSError`` if it is not a regular file."""
        if self.data is not None:
            return self.data
        with open_regular(self.path) as handle:
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
    passed: list[str] = []
    paths, unmatched = expand_inputs(inputs, passed)
    found.problems += [LoadProblem(item, _why_nothing(item)) for item in unmatched]
    for path in paths:
        if path.lower().endswith(ARCHIVE_SUFFIXES):
            _archive(path, max_bytes, read_member, found)
        else:
            _sort(Source(path), os.path.basename(path), found)
    for path in passed:
        _not_read(path, os.path.basename(path), not_regular(path) or "not a regular file", found)
    if logs:
        passed = []
        log_paths, missing = expand_inputs(logs, passed)
        found.problems += [LoadProblem(item, _why_nothing(item, "log file")) for item in missing]
        found.problems += [LoadProblem(p, f"{not_regular(p) or 'not a regular file'}: not read", fatal=False)
                           for p in passed]  # fmt: skip
        found.logs += [Source(p) for p in log_paths]
    found.problems += _cut_on_disk(found)
    return found


_READ_KINDS = ("dump", "stacks", "log", "text", "ended", "rank file")


def _not_read(path: str, name: str, why: str, found: Found) -> None:
    """A file (or archive member) that is not a regular file, never opened: one line for each that would
    have been read (an error for a dump, which leaves its rank without one), counted among the skipped
    for the rest, and nothing for what fr2perfetto itself leaves beside dumps (the capture helper's FIFOs)."""
    kind = _kind(name)
    if kind in _READ_KINDS:
        # a dump left unread leaves its rank without one: an error, as an unreadable dump is
        found.problems.append(LoadProblem(path, f"{why}: not read", fatal=kind == "dump"))
    elif kind is not None:
        found.skipped.setdefault(kind, []).append(path)


def _cut_on_disk(found: Found) -> list[LoadProblem]:
    """One line for each log or stack snapshot on disk over ``TEXT_LIMIT``: only its end is read
    (``read_limited``), and what went before is not looked at."""
    problems = []
    for source in [*found.stacks, *found.logs]:
        if source.data is None:
            try:
                size = os.stat(source.path).st_size
            except OSError:
                continue  # said when it is read
            if size > TEXT_LIMIT:
                problems.append(LoadProblem(source.path, _cut_text(size), fatal=False))
    return problems


def _cut_text(size: int) -> str:
    """What is said of a log or stack snapshot of ``size`` bytes, over ``TEXT_LIMIT``."""
    limit = TEXT_LIMIT >> 20
    return f"{size / 2**20:.0f} MB, over the {limit} MB read of a log or stack snapshot: only its last {limit} MB read"


def _why_nothing(item: str, what: str = "file") -> str:
    """Why an input gave no file: it does not exist, it is an empty folder, a pattern matched nothing, or
    it is not a regular file (saying what it is: a link to a device, a FIFO...)."""
    if os.path.isdir(item):
        return "an empty folder (no file in it, hidden ones aside)"
    if os.path.lexists(item):
        return f"{not_regular(item) or 'not a regular file'}: not read"
    if glob.has_magic(item):
        return "the pattern matches no file"
    return f"no such {what} or directory"


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


def kind_of(name: str) -> str | None:
    """What a file is by its name, as the inputs are sorted: ``dump``, ``stacks``, ``log``, ``text``, ``ended``,
    ``rank file``; None for what fr2perfetto itself leaves beside dumps; else why it would be skipped."""
    return _kind(name)


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
        with open_regular(path) as raw:
            budget = _Budget(raw.tell)
            members = _zip_members(raw, budget) if path.lower().endswith(".zip") else _tar_members(raw, budget)
            for name, size, handle, irregular in members:
                read += 1
                if handle is None:  # a link or a device: nothing to read, and nothing is ever written
                    _not_read(f"{path}!{name}", posixpath.basename(name), irregular, found)
                    continue
                _archived_member(f"{path}!{name}", posixpath.basename(name), size, handle, max_bytes, budget,
                                 read_member, found)  # fmt: skip
    except _Refused as refusal:
        found.problems.append(LoadProblem(path, f"archive refused: {refusal}"))
    except NotRegularFile as error:  # it was one when the inputs were listed
        found.problems.append(LoadProblem(path, f"{error.strerror}: not read"))
    except Exception as error:  # zlib.error, EOFError, tarfile and zipfile errors, OSError: a damaged archive
        first = (str(error).splitlines() or [""])[0][:120]
        what = "not a readable archive" if read == 0 else f"damaged after {read} members (those are read)"
        found.problems.append(LoadProblem(path, f"{what} ({type(error).__name__}: {first})"))


# (name, declared size, reader, ""), or (name, 0, None, what it is) for a member that is not a regular file
_Member = tuple[str, int, "IO[bytes] | None", str]


def _tar_members(raw: IO[bytes], budget: _Budget):  # type: ignore[no-untyped-def]
    """Each regular file of a tar as the stream reaches it, and each link or device (never followed or
    made: said to be passed over); folders and hidden members are left out."""
    with tarfile.open(fileobj=raw, mode="r|*") as archive:
        for member in archive:
            budget.member()
            name = _safe_name(member.name)
            if member.isdir() or _hidden(name):
                continue
            if not member.isreg():
                yield name, 0, None, _tar_kind(member)
                continue
            budget.claim(member.size, repr(name))
            yield name, member.size, archive.extractfile(member), ""


def _tar_kind(member: tarfile.TarInfo) -> str:
    """What a tar member that is not a regular file is, in words."""
    if member.islnk():  # another member's bytes, under a second name
        return f"a hard link to {member.linkname}, whose bytes are read under that name"
    kinds = ((member.ischr, "a character device"), (member.isblk, "a block device"), (member.isfifo, "a FIFO"))
    what = f"a link to {member.linkname}" if member.issym() else next((w for test, w in kinds if test()), "")
    return f"{what}, not a regular file" if what else "not a regular file"


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
                yield name, info.file_size, handle, ""


def _archived_member(
    path: str, name: str, size: int, handle: IO[bytes], max_bytes: int, budget: _Budget,
    read_member: ReadMember, found: Found,
) -> None:  # fmt: skip
    """Read one member of an archive as its kind asks, within the archive's budget."""
    kind = _kind(name)
    if kind in ("ended", "rank file"):  # a line or two each
        source = Source(path, _read_tail(handle, SMALL_TEXT_LIMIT, budget, path)[0])
        (found.endings if kind == "ended" else found.rank_files).append(source)
        return
    if kind not in ("dump", "stacks", "log", "text"):
        if kind is not None:
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
    tail, total = _read_tail(handle, TEXT_LIMIT, budget, path)
    before = len(found.stacks) + len(found.logs)
    _sort(Source(path, tail), name, found)
    if total > TEXT_LIMIT and len(found.stacks) + len(found.logs) > before:  # read as a log or snapshot: cut
        found.problems.append(LoadProblem(path, _cut_text(total), fatal=False))


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


def _read_tail(handle: IO[bytes], keep: int, budget: _Budget, what: str) -> tuple[bytes, int]:
    """The last ``keep`` bytes of a member (a log's end matters most), read through within the budget,
    and how many bytes it holds in all."""
    kept = bytearray()
    total = 0
    while chunk := handle.read(CHUNK):
        budget.take(len(chunk), what)
        total += len(chunk)
        kept += chunk
        if len(kept) > 2 * keep:
            del kept[: len(kept) - keep]
    return bytes(kept[-keep:]), total


def _safe_name(name: str) -> str:
    normal = posixpath.normpath(name.replace("\\", "/"))
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or normal == ".." or normal.startswith("../"):
        raise _Refused(f"member {name!r} would land outside the archive's folder")
    return normal


def _hidden(name: str) -> bool:
    return any(part.startswith(".") for part in name.split("/")[:-1])


def read_limited(source: Source, limit: int) -> bytes:
    """A text file's bytes, at most ``limit`` (logs can be large: their end matters most); ``OSError``
    (``NotRegularFile``) for what is not a regular file, which is never opened."""
    if source.data is not None:
        return source.data[-limit:]
    with open_regular(source.path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            handle.seek(size - limit)
        return handle.read(limit)
