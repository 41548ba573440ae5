"""Read one Flight Recorder dump (pickle or JSON, versions 1.x to 2.10) into a ``RankDump``.

Everything in a dump is checked before use: a file that is not a dump, is truncated, empty or of an
unknown version raises ``DumpError`` with a one-line reason; a single malformed entry is skipped and
counted, so one bad record does not cost a rank its whole history.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from functools import partial
from typing import Any

from ..base.model import (
    COMPLETED,
    MAX_GROUP_CLAIM,
    MAX_RANK,
    SCHEDULED,
    STARTED,
    Entry,
    Frame,
    GroupConfig,
    RankColumns,
    RankDump,
    group_counts,
    time_range,
)
from ..base.speedups import SPEEDUPS as _speedups
from ..base.text import path_text, safe_text
from . import columns
from .files import DumpName, NotRegularFile, open_regular, parse_dump_name
from .pickle_shape import MAX_DEPTH, max_nodes
from .safe_pickle import RefusedPickle, loads_plain

SUPPORTED_MAJOR_VERSIONS = (1, 2)
_INT64_MAX = 2**63 - 1
_P2P_PEERS = re.compile(r"(-?\d+)\s*(->|<-)\s*(-?\d+)")
_INTS = re.compile(r"-?\d+")
_STATES = {SCHEDULED, STARTED, COMPLETED}
# Version 2.0 wrote dtypes in lower case; later versions use ScalarType names.
_DTYPE_NAMES = {
    "float": "Float",
    "double": "Double",
    "half": "Half",
    "bfloat16": "BFloat16",
    "int": "Int",
    "long": "Long",
    "short": "Short",
    "char": "Char",
    "byte": "Byte",
    "bool": "Bool",
    "complexfloat": "ComplexFloat",
    "complexdouble": "ComplexDouble",
}


class DumpError(Exception):
    """A file that cannot be read as a Flight Recorder dump; the message is one line."""


class _BadEntry(Exception):
    """One entry that cannot be used; it is skipped."""


MAX_DUMP_BYTES = 1 << 30  # the largest file read as a dump by default (real ones are tens of MB)


def read_dump(path: str, data: bytes | None = None, max_bytes: int = MAX_DUMP_BYTES) -> RankDump:
    """Read the dump at ``path`` (or its bytes, if given) into a ``RankDump`` with its entries; raise
    ``DumpError``. Read as ``read_dump_columns`` reads it: where the C walker read it, the entries are
    made from its columns."""
    walked, data = _walked(path, data, max_bytes)
    if walked is None:
        return read_dump_reference(path, data, max_bytes)
    dump, rank_columns = walked
    columns.JobTables({}).fill(dump, columns.column_bytes(rank_columns), rank_columns.tables)
    return dump


def read_dump_columns(
    path: str, max_bytes: int = MAX_DUMP_BYTES, data: bytes | None = None
) -> tuple[RankDump, RankColumns]:
    """Read the dump at ``path`` (or its bytes, if given) into a ``RankDump`` without entries, and its
    entries as columns; raise ``DumpError``. A pickle is read in one pass by ``_speedups.pickle_columns``
    where it can; any file it cannot read exactly as the Python reader does (see ``_speedups.c``) is read
    by that reader, and its entries put in columns (``columns.from_entries``, the reference that the C
    path is tested against)."""
    walked, data = _walked(path, data, max_bytes)
    if walked is not None:
        return walked
    dump = read_dump_reference(path, data, max_bytes)
    rank_columns = columns.from_entries(dump.rank, dump.entries)
    dump.entries = []
    return dump, rank_columns


def _walked(path: str, data: bytes | None, max_bytes: int) -> tuple[tuple[RankDump, RankColumns] | None, bytes]:
    """The dump and its columns as ``pickle_columns`` reads them, or None where it does not (not a
    pickle, not built, or a file the Python reader must read); and the file's bytes (read here when
    not given). ``DumpError`` for a name that tells no rank and a file that is no dump's."""
    name = _rank_name(path)
    if data is None:
        data = _read_file(path, max_bytes)
    if data[:1] != b"\x80" or _speedups is None:
        return None, data
    walked = _speedups.pickle_columns(data, MAX_DEPTH, max_nodes(len(data)), _WALK_KEYS)
    if walked is None:
        return None, data
    return _from_walk(walked, name.rank, path_text(path), path_text(name.host) if name.host else None), data


def _from_walk(walked: tuple[Any, ...], rank: int, path: str, host: str | None) -> tuple[RankDump, RankColumns] | None:
    """A dump and its columns from what ``pickle_columns`` read; None where the Python reader must read
    it (a 1.x dump, an entry it would read otherwise)."""
    top, rows, data, shapes, objects, read_as_rows, first, last = walked
    entries = top.get("entries")
    if entries is not read_as_rows and (rows or entries):
        return None  # "entries" is not (only) the list read as rows: the Python reader says what it is
    dump = normalise(top, rank=rank, path=path, host=host, file_format="pickle")
    if dump.version.split(".")[0] != "2":
        return None  # 1.x names groups by pg_config: the Python reader reads it
    caches = _Caches()
    try:
        made = columns.from_raw(
            rank, (rows, data, shapes, objects), partial(_shape_fields, rank=rank, caches=caches),
            partial(_field, caches=caches),
        )  # fmt: skip
    except columns.GiveUp:
        return None
    dump.time_range = (first, last) if rows else None
    dump.group_counts = columns.group_counts(made)
    return dump, made


def _shape_fields(shape: tuple[Any, ...], rank: int, caches: _Caches) -> tuple[Any, ...]:
    """What ``_read_entry`` makes of an entry's repeating fields (``_SHAPE_KEYS``, ``shape``): (group,
    op, peers, is_p2p, state, retired, timeout, thread); ``GiveUp`` where that depends on more than them
    (a state inferred from the entry's times) or the entry would be skipped."""
    item: dict[str, Any] = dict(_NEUTRAL)
    item.update(zip(_ENTRY_KEYS[_SHAPE_KEYS], shape, strict=True))
    state = item["state"]
    if type(state) is not str or state not in _STATES:
        raise columns.GiveUp("a state inferred from times")
    try:
        entry = _read_entry(item, rank, 2, {}, caches)
    except _BadEntry as error:
        raise columns.GiveUp(str(error)) from None
    return (
        (entry.group_name, entry.group_desc), (entry.backend, entry.op), entry.p2p_local, entry.is_p2p,
        entry.state, entry.retired, entry.timeout_ms, (entry.thread_id, entry.thread_name),
    )  # fmt: skip


# Every field of an entry but its repeating ones, at values that make no difference to those.
_NEUTRAL: dict[str, Any] = {
    "record_id": 0, "pg_id": 0, "collective_seq_id": 0, "p2p_seq_id": 0, "op_id": 0, "time_created_ns": 0,
    "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "duration_ms": None,
    "input_sizes": [], "output_sizes": [], "input_dtypes": [], "output_dtypes": [], "frames": [],
}  # fmt: skip


def _field(name: str, value: Any, caches: _Caches) -> Any:
    """What the reader makes of one entry's sizes, dtypes or frames (``columns.ID_COLUMNS``' names);
    ``GiveUp`` where it would skip the entry."""
    try:
        if name == "frames":
            return _frames(value, caches)
        return (_sizes if name.endswith("sizes") else _dtypes)({name: value}, name)
    except _BadEntry as error:
        raise columns.GiveUp(str(error)) from None


def _rank_name(path: str) -> DumpName:
    """The rank and host from a dump's file name; ``DumpError`` where it does not tell."""
    name = parse_dump_name(path)
    if name is None:
        raise DumpError("cannot tell the rank from the file name (expected a name ending in the rank, e.g. rank_7)")
    if name.rank >= MAX_RANK:
        raise DumpError(f"rank {name.rank} (from the file name) is beyond the largest rank read, {MAX_RANK - 1}")
    return name


def read_dump_reference(path: str, data: bytes | None = None, max_bytes: int = MAX_DUMP_BYTES) -> RankDump:
    """The reference reader, in Python alone: the restricted unpickler (or ``json``), then ``normalise``.
    It reads what ``pickle_columns`` leaves to it, and the tests hold the C reader to it."""
    name = _rank_name(path)
    if data is None:
        data = _read_file(path, max_bytes)
    raw, file_format = _decode(data)
    return normalise(
        raw, rank=name.rank, path=path_text(path), host=path_text(name.host) if name.host else None,
        file_format=file_format,
    )  # fmt: skip


def _read_file(path: str, max_bytes: int) -> bytes:
    """The bytes of a regular file that looks like a dump from its first bytes and is not over
    ``max_bytes``: anything else is refused before it is read whole (a device or a FIFO, never opened)."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise DumpError(
                    f"{size / 2**20:.0f} MB, over the largest dump read ({max_bytes / 2**20:.0f} MB; --max-dump-size)"
                )
            head = handle.read(_HEAD)
            if not looks_like_a_dump(head):
                raise DumpError("not a Flight Recorder dump (neither a pickle nor JSON)")
            rest = handle.read(max_bytes + 1 - len(head))
            if len(head) + len(rest) > max_bytes:  # it grew while being read
                raise DumpError(f"over the largest dump read ({max_bytes / 2**20:.0f} MB; --max-dump-size)")
            return head + rest
    except NotRegularFile as error:
        raise DumpError(f"{error.strerror}: not read") from None
    except OSError as error:
        raise DumpError(f"cannot read: {error.strerror or error}") from None


_HEAD = 64  # bytes that tell a dump's format
_JSON_SPACE = " \t\n\r\x0b\x0c"  # what bytes.lstrip strips, as the test of a UTF-8 head always did


def looks_like_a_dump(head: bytes) -> bool:
    """Whether a file's first bytes could begin a dump: a pickle's protocol opcode, or JSON's ``{`` (after
    white space, in whichever encoding ``json.loads`` reads: UTF-8 with or without a byte-order mark,
    UTF-16 or UTF-32)."""
    return not head or head[:1] == b"\x80" or _json_start(head[:_HEAD]) in ("{", "")


def _json_start(data: bytes) -> str:
    """The first character of ``data`` past white space, decoded as ``json.loads`` decodes it (its
    ``detect_encoding``: a byte-order mark read and dropped, UTF-16 and UTF-32 told by their zero bytes);
    "" when there is none."""
    encoding = json.detect_encoding(data[:4])
    if encoding == "utf-8":
        return data.lstrip()[:1].decode("latin-1")
    # a dump's first key follows its "{" at once: the first bytes decoded tell (a character cut at
    # their end is dropped)
    return data[:_HEAD].decode(encoding, "ignore").lstrip(_JSON_SPACE)[:1]


def _decode(data: bytes) -> tuple[dict[str, Any], str]:
    if not data:
        raise DumpError("empty file")
    head = data[:1]
    if head == b"\x80":
        try:
            raw = loads_plain(data)
        except RefusedPickle as error:
            raise DumpError(str(error)) from None
        except RecursionError:
            raise DumpError("corrupt pickle: nested too deeply") from None
        except MemoryError:
            raise DumpError("corrupt pickle: it asks for far more memory than a dump of its size needs") from None
        except Exception as error:
            raise DumpError(f"truncated or corrupt pickle ({type(error).__name__}: {_short(error)})") from None
        file_format = "pickle"
    elif _json_start(data) == "{":
        raw = _loads_json(data)
        file_format = "json"
    else:
        raise DumpError("not a Flight Recorder dump (neither a pickle nor JSON)")
    if not isinstance(raw, dict):
        raise DumpError(f"not a Flight Recorder dump (top level is a {type(raw).__name__}, not a dict)")
    return raw, file_format


def _loads_json(data: bytes) -> Any:
    """A JSON dump decoded (``json.loads`` reads its byte-order mark or UTF-16/32 itself); ``DumpError``.

    Python refuses to read an integer of more digits than ``sys.get_int_max_str_digits()`` (a guard on
    time): such a dump is read again with each of those a ``LongNumber``, so that only the entry that
    holds one is lost."""
    try:
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise
        except ValueError:  # the only other ValueError json raises: an integer too long to read
            return json.loads(data, parse_int=_json_int)
    except RecursionError:
        raise DumpError("corrupt JSON: nested too deeply") from None
    except ValueError as error:  # UnicodeDecodeError included
        raise DumpError(f"truncated or corrupt JSON ({_short(error)})") from None


class LongNumber:
    """An integer of a JSON dump with more digits than Python reads, where it stood: never a number."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _json_int(text: str) -> int | LongNumber:
    try:
        return int(text)
    except ValueError:
        return LongNumber(len(text.lstrip("-")))


def _short(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return text[:120]


def normalise(
    raw: dict[str, Any],
    *,
    rank: int,
    path: str,
    host: str | None,
    file_format: str,
) -> RankDump:
    """Turn a decoded dump of any supported version into a ``RankDump``; raise ``DumpError``."""
    if "version" not in raw:
        raise DumpError("not a Flight Recorder dump (no 'version' key)")
    version = raw["version"]
    if not isinstance(version, str) or not re.fullmatch(r"\d{1,9}\.\d{1,9}", version):
        raise DumpError(f"unknown dump version {_value_text(version)}")
    major = int(version.split(".")[0])
    if major not in SUPPORTED_MAJOR_VERSIONS:
        raise DumpError(f"unknown dump version {version} (fr2perfetto reads 1.x and 2.x)")
    raw_entries = raw.get("entries", [])
    if raw_entries is None:
        raw_entries = []
    if not isinstance(raw_entries, list):
        raise DumpError(f"'entries' is a {type(raw_entries).__name__}, not a list")

    pg_config = _read_pg_config(raw.get("pg_config"), major)
    comm_lib = raw.get("comm_lib_version", raw.get("nccl_version", raw.get("xccl_version", "")))
    caches = _Caches()
    entries: list[Entry] = []
    skipped = 0
    first_reason = ""
    for index, item in enumerate(raw_entries):
        try:
            entries.append(_read_entry(item, rank, major, pg_config, caches))
        except _BadEntry as error:
            skipped += 1
            first_reason = first_reason or f"entry {index}: {error}"
    if raw_entries and not entries:
        raise DumpError(f"no usable entry ({first_reason})")
    return RankDump(
        rank=rank,
        path=path,
        host=host,
        version=version,
        file_format=file_format,
        comm_lib_version=comm_lib if isinstance(comm_lib, str) else "",
        entries=entries,
        pg_config=pg_config,
        pg_status=_read_pg_status(raw.get("pg_status")),
        skipped_entries=skipped,
        skipped_reason=first_reason,
        time_range=time_range(entries),
        group_counts=group_counts(entries),
    )


def _read_pg_config(value: Any, major: int) -> dict[str, GroupConfig]:
    """Read ``pg_config``; entries that make no sense (gloo's ``""`` with ``"[]"``) are dropped."""
    config: dict[str, GroupConfig] = {}
    if not isinstance(value, dict):
        return config
    for key, info in value.items():
        if isinstance(info, dict):  # 2.x: {name: {"name", "desc", "ranks"}}
            name = info.get("name", key)
            desc = info.get("desc", "")
            ranks, claimed = _parse_ranks(info.get("ranks"))
        elif isinstance(info, (list, tuple)):  # 1.x: {pg_id: [ranks]}
            name, desc, (ranks, claimed) = key, "", _parse_ranks(list(info))
        else:
            continue
        name = name if isinstance(name, str) else str(name) if type(name) is int and abs(name) < 2**63 else ""
        if name == "":
            continue  # gloo registers groups under "" with wrong or empty ranks
        name = safe_text(name)
        key = safe_text(key) if isinstance(key, str) else str(key) if type(key) is int and abs(key) < 2**63 else name
        config[key if major == 1 else name] = GroupConfig(
            name, safe_text(desc) if isinstance(desc, str) else "", ranks, claimed
        )
    return config


def _parse_ranks(value: Any) -> tuple[tuple[int, ...] | None, int]:
    """``"[0, 1]"`` or ``[0, 1]`` to a sorted tuple, and 0; None when absent, empty or not ranks. A
    claim of more than ``MAX_GROUP_CLAIM`` members is not read: None, and about how many it claims
    (counted from its separators, so that a claim of a million ranks costs no more than its text)."""
    claimed = value.count(",") + 1 if isinstance(value, str) else len(value) if isinstance(value, list) else 0
    if claimed > MAX_GROUP_CLAIM:
        return None, claimed
    if isinstance(value, str):
        return _parse_rank_text(value)
    if isinstance(value, (list, tuple)) and all(type(x) is int for x in value):
        return _sorted_ranks(list(value))
    return None, 0


# Every rank's dump lists the members of the groups it shares with others in the same text, so each
# text is read once per reading process: a world group of 4096 members costs as much to read as the
# rest of the dump, and every rank holds it. The texts kept add up to at most this many characters
# (then the cache starts anew), so that a hostile dump of many long ones cannot make it large.
RANK_TEXTS_KEPT = 1 << 22
_rank_texts: dict[str, tuple[tuple[int, ...] | None, int]] = {}
_rank_text_sizes = [0]


def _parse_rank_text(value: str) -> tuple[tuple[int, ...] | None, int]:
    known = _rank_texts.get(value)
    if known is None:
        # a number too long for a rank is no rank (and int() refuses one of thousands of digits)
        known = _sorted_ranks([int(x) if len(x) < 12 else -1 for x in _INTS.findall(value)])
        if _rank_text_sizes[0] + len(value) > RANK_TEXTS_KEPT:
            _rank_texts.clear()
            _rank_text_sizes[0] = 0
        _rank_texts[value] = known
        _rank_text_sizes[0] += len(value)
    return known


def _sorted_ranks(numbers: list[int]) -> tuple[tuple[int, ...] | None, int]:
    if not numbers or any(n < 0 or n >= MAX_RANK for n in numbers):
        return None, 0  # not ranks (or not ranks of a job anyone runs): the members used it tell instead
    return tuple(sorted(set(numbers))), 0


def _read_pg_status(value: Any) -> dict[str, tuple[int, int, int]]:
    status: dict[str, tuple[int, int, int]] = {}
    if not isinstance(value, dict):
        return status
    for key, info in value.items():
        if not isinstance(info, dict):
            continue
        try:
            values = tuple(
                int(info.get(k, -1))
                for k in ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
            )
        except (TypeError, ValueError, OverflowError):
            continue
        if isinstance(key, str):
            key = safe_text(key)
        elif type(key) is int and abs(key) <= _INT64_MAX:
            key = str(key)
        else:
            continue
        if all(abs(number) <= _INT64_MAX for number in values):  # else no op of a real run: a corrupt count
            status[key] = values  # type: ignore[assignment]
    return status


def _int(item: dict[str, Any], key: str, default: int | None = None, *, low: int = -1) -> int:
    value = item.get(key, default)
    if value is None and default is not None:
        value = default
    if type(value) is not int:  # bool is an int subclass; it is not a number here
        if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value):
            value = int(value)
        elif isinstance(value, LongNumber):
            raise _BadEntry(f"{key} is {_describe(value)}, out of range")
        else:
            raise _BadEntry(f"{key} is {_describe(value)}, not an integer")
    if not low <= value <= _INT64_MAX:
        raise _BadEntry(f"{key} is {_value_text(value)}, out of range")
    return value


def _optional_time(item: dict[str, Any], key: str) -> int | None:
    value = item.get(key)
    if value is None or value == 0:  # JSON writes 0 for "unknown"
        return None
    return _int(item, key, low=1)


def _describe(value: Any) -> str:
    """What a value of the wrong kind is, in words that never quote it."""
    if isinstance(value, LongNumber):
        return f"an integer of {value.digits} digits"
    if type(value) is int:
        return "an integer"
    return "missing" if value is None else f"a {type(value).__name__}"


_SHOWN_DIGITS = 24  # an integer up to this long is quoted; a longer one, by its length
_EXACT_DIGITS_BITS = 1 << 16  # counting the digits of a longer integer costs more than reading it did


def _value_text(value: Any) -> str:
    """A value from a dump in a one-line reason, bounded whatever it is: an integer of more than
    ``_SHOWN_DIGITS`` digits by how many it has (Python will not even write one of more than 4300
    digits), text cut to 40 characters, anything else by its type."""
    if type(value) is int:
        if abs(value) < 10**_SHOWN_DIGITS:
            return str(value)
        bits = value.bit_length()
        if bits > _EXACT_DIGITS_BITS:
            return f"an integer of more than {int(_EXACT_DIGITS_BITS * math.log10(2))} digits"
        digits = int(bits * math.log10(2))  # the count, or one less
        return f"an integer of {digits + (abs(value) >= 10**digits)} digits"
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return _describe(value)


def _str(item: dict[str, Any], key: str, default: str = "") -> str:
    value = item.get(key, default)
    if value is None:
        return default
    if isinstance(value, str):
        return safe_text(value)
    if type(value) is int and abs(value) <= _INT64_MAX:  # thread ids have been written as numbers
        return str(value)
    raise _BadEntry(f"{key} is {_describe(value)}, not a string")


def _sizes(item: dict[str, Any], key: str) -> tuple[tuple[int, ...], ...]:
    value = item.get(key) or []
    if not isinstance(value, (list, tuple)):
        raise _BadEntry(f"{key} is {_describe(value)}, not a list")
    out = []
    for dims in value:
        if not isinstance(dims, (list, tuple)) or not all(type(d) is int and -1 <= d <= _INT64_MAX for d in dims):
            raise _BadEntry(f"{key} holds {_describe(dims)}, not a list of sizes")
        out.append(tuple(dims))
    return tuple(out)


def _dtypes(item: dict[str, Any], key: str) -> tuple[str, ...]:
    value = item.get(key) or []
    if not isinstance(value, (list, tuple)) or not all(isinstance(d, str) for d in value):
        raise _BadEntry(f"{key} is not a list of dtype names")
    return tuple(_DTYPE_NAMES.get(d, safe_text(d)) for d in value)


def _frames(value: Any, caches: _Caches) -> tuple[Frame, ...]:
    if not value:
        return ()
    if not isinstance(value, (list, tuple)):
        raise _BadEntry(f"frames is {_describe(value)}, not a list")
    # PyTorch's pickler writes each distinct frame dict once; entries with the same stack share a tuple.
    ids = tuple(map(id, value))
    shared = caches.frame_tuples.get(ids)
    if shared is not None:
        return shared
    cache = caches.frames
    frames = []
    for raw in value:
        # PyTorch's pickler shares one dict per distinct frame; reuse one Frame for it.
        frame = cache.get(id(raw))
        if frame is None:
            if not isinstance(raw, dict):
                raise _BadEntry("a frame is not a dict")
            line = raw.get("line", 0)
            name, filename = raw.get("name"), raw.get("filename")
            frame = Frame(
                name=safe_text(name) if isinstance(name, str) else "?",
                filename=safe_text(filename) if isinstance(filename, str) else "?",
                line=line if type(line) is int and 0 <= line <= _INT64_MAX else 0,
            )
            cache[id(raw)] = frame
        frames.append(frame)
    shared = caches.frame_tuples[ids] = tuple(frames)
    return shared


def _is_duration(value: Any) -> bool:
    """Whether ``duration_ms`` is a duration: a finite float, or an integer a float holds (a longer one,
    which ``float()`` refuses, is as unknown as a missing one)."""
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is int and abs(value) <= _INT64_MAX


def _split_profiling_name(name: str) -> tuple[str, str, tuple[int, int] | None]:
    """``nccl:send 1->0`` to (``nccl``, ``send``, (1, 0)); ``nccl:recv 0<-1`` to (.., ``recv``, (1, 0))."""
    name = safe_text(name)
    backend, _, rest = name.partition(":") if ":" in name else ("", "", name)
    op, _, meta = rest.strip().partition(" ")
    peers = None
    match = _P2P_PEERS.search(meta)
    if match and len(match.group(1)) <= 10 and len(match.group(3)) <= 10:  # else no rank (and no int for Python)
        a, arrow, b = int(match.group(1)), match.group(2), int(match.group(3))
        if 0 <= a < MAX_RANK and 0 <= b < MAX_RANK:
            peers = (a, b) if arrow == "->" else (b, a)
    return backend, op or "?", peers


class _Caches:
    """Per-file caches: ops, groups, sizes and dtypes repeat from entry to entry; check each once."""

    def __init__(self) -> None:
        self.frames: dict[int, Frame] = {}
        self.frame_tuples: dict[tuple[int, ...], tuple[Frame, ...]] = {}
        self.names: dict[str, tuple[str, str, tuple[int, int] | None]] = {}
        self.groups: dict[tuple[object, ...], tuple[str, str]] = {}
        self.sizes: dict[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]] = {}
        self.dtypes: dict[tuple[str, ...], tuple[str, ...]] = {}


def _checked_once(
    item: dict[str, Any], key: str, cache: dict[Any, Any], as_key: Callable[[Any], Any], check: Callable[..., Any]
) -> Any:
    """``check(item, key)``, done once per distinct value in a file; a value it rejects always raises."""
    value = item.get(key)
    try:
        cache_key = as_key(value) if value else ()
        known = cache.get(cache_key)
    except TypeError:  # not even hashable: let the full check say what is wrong
        return check(item, key)
    if known is None:
        known = cache[cache_key] = check(item, key)
    return known


def _tuple_of_tuples(value: Any) -> tuple[Any, ...]:
    return tuple(map(tuple, value))


def _read_entry(item: Any, rank: int, major: int, pg_config: dict[str, GroupConfig], caches: _Caches) -> Entry:
    if type(item) is not dict:
        raise _BadEntry(f"is {_describe(item)}, not a dict")
    get = item.get
    profiling_name = get("profiling_name")
    parsed = caches.names.get(profiling_name) if type(profiling_name) is str else None
    if parsed is None:
        profiling_name = _str(item, "profiling_name")
        if not profiling_name:
            raise _BadEntry("has no profiling_name")
        parsed = caches.names[profiling_name] = _split_profiling_name(profiling_name)
    backend, op, peers = parsed
    pg_id = get("pg_id", 0)
    if type(pg_id) is not int or not 0 <= pg_id <= _INT64_MAX:
        pg_id = _int(item, "pg_id", 0)
    group: Any = get("process_group")  # any value a file holds: the checks below say what it may be
    group_key = tuple(group) if type(group) in (list, tuple) else group
    try:
        names = caches.groups.get(group_key)
    except TypeError:
        names = None
    if names is None:
        if isinstance(group, (list, tuple)) and len(group) >= 1 and all(isinstance(x, str) for x in group[:2]):
            names = (safe_text(group[0]), safe_text(group[1]) if len(group) > 1 else "")
        elif group is None and major == 1:
            names = (str(pg_id), "")
        else:
            raise _BadEntry(f"process_group is {_describe(group)}, not (name, desc)")
        if group is not None:
            caches.groups[group_key] = names
    group_name, group_desc = names
    if major == 1 and group_name not in pg_config and str(pg_id) in pg_config:
        group_name = str(pg_id)
    collective_seq = get("collective_seq_id")
    if type(collective_seq) is int and 0 <= collective_seq <= _INT64_MAX:
        p2p_seq = get("p2p_seq_id", 0)
        if type(p2p_seq) is not int or not 0 <= p2p_seq <= _INT64_MAX:
            p2p_seq = _int(item, "p2p_seq_id", 0, low=0)
    elif "collective_seq_id" in item:
        collective_seq = _int(item, "collective_seq_id", low=0)
        p2p_seq = _int(item, "p2p_seq_id", 0, low=0)
    else:
        seq = _int(item, "seq_id", low=0)
        collective_seq, p2p_seq = seq, (seq if peers else 0)
    is_p2p = get("is_p2p")
    if type(is_p2p) is not bool:
        is_p2p = peers is not None or op in ("send", "recv")
    started = get("time_discovered_started_ns")
    if started is not None and (type(started) is not int or not 0 < started <= _INT64_MAX):
        started = _optional_time(item, "time_discovered_started_ns")
    completed = get("time_discovered_completed_ns")
    if completed is not None and (type(completed) is not int or not 0 < completed <= _INT64_MAX):
        completed = _optional_time(item, "time_discovered_completed_ns")
    state = get("state")
    if type(state) is not str or state not in _STATES:
        state = COMPLETED if completed else STARTED if started else SCHEDULED
    duration = get("duration_ms")
    if not _is_duration(duration):
        duration = None
    timeout = get("timeout_ms")
    if not (type(timeout) is int and 0 <= timeout <= _INT64_MAX):
        timeout = None
    retired = get("retired")
    created = get("time_created_ns")
    if type(created) is not int or not 0 <= created <= _INT64_MAX:
        created = _int(item, "time_created_ns", low=0)
    record_id = get("record_id", 0)
    if type(record_id) is not int or not 0 <= record_id <= _INT64_MAX:
        record_id = _int(item, "record_id", 0, low=0)
    op_id = get("op_id", 0)
    if type(op_id) is not int or not 0 <= op_id <= _INT64_MAX:
        op_id = _int(item, "op_id", 0, low=0)
    thread_id = get("thread_id", "")
    thread_id = safe_text(thread_id) if type(thread_id) is str else _str(item, "thread_id")
    thread_name = get("thread_name", "")
    thread_name = safe_text(thread_name) if type(thread_name) is str else _str(item, "thread_name")
    return Entry(
        rank,
        group_name,
        group_desc,
        pg_id,
        record_id,
        collective_seq,
        p2p_seq,
        op_id,
        backend,
        op,
        peers,
        is_p2p,
        _checked_once(item, "input_sizes", caches.sizes, _tuple_of_tuples, _sizes),
        _checked_once(item, "output_sizes", caches.sizes, _tuple_of_tuples, _sizes),
        _checked_once(item, "input_dtypes", caches.dtypes, tuple, _dtypes),
        _checked_once(item, "output_dtypes", caches.dtypes, tuple, _dtypes),
        state,
        retired if type(retired) is bool else state == COMPLETED,
        created,
        started or None,
        completed or None,
        float(duration) if duration is not None else None,
        timeout,
        thread_id,
        thread_name,
        _frames(get("frames"), caches),
    )


# The keys every 2.x entry has: what ``_speedups.pickle_columns`` reads of an entry, in its field slots' order.
_ENTRY_KEYS = (
    "record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns",
    "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms",
    "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "frames",
    "profiling_name", "process_group", "state", "retired", "is_p2p", "timeout_ms", "thread_id", "thread_name",
)  # fmt: skip
_WALK_KEYS = (*_ENTRY_KEYS, "entries")  # and the dump's own key that holds the entries
_SHAPE_KEYS = slice(14, None)  # the fields an entry shares with most others of its rank
