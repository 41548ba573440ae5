"""A rank's entries as columns: fixed-width arrays, one value per entry, and ids into interned tables.

The columnar core (docs/scaling.md, "The columnar core"): the reader writes these, a reading process
sends their bytes to the parent (``ColumnBytes``), and the parent makes ``Entry`` objects from those when
asked for (``EntryRows``), whose columns the matcher files collectives by (``KEPT_COLUMNS``). Every column
is the standard library's ``array``; None, where a field may be None, is a sentinel:

=================  ==========  ===================================================================
column             type        holds
=================  ==========  ===================================================================
record_id ...      int64 (q)   record id, pg id, collective seq, p2p seq, op id, created (ns)
started            int64 (q)   discovered started (ns); ``NONE`` (-1) for None
completed          int64 (q)   discovered completed (ns); ``NONE`` for None
timeout            int64 (q)   timeout (ms); ``NONE`` for None
duration           float64 (d) duration (ms); NaN for None
state              uint8 (B)   index into ``STATES``
retired, is_p2p    uint8 (B)   0 or 1
p2p_src, p2p_dst   int32 (i)   a send's or recv's group-local source and destination; ``NONE``: no peers
group ... frames   uint32 (I)  ids into the tables: groups (name, desc), ops (backend, op), threads
                               (id, name), sizes (input and output), dtypes (input and output), stacks
=================  ==========  ===================================================================

The fields' meanings are the PyTorch writer's (torch/csrc/distributed/c10d/FlightRecorder.hpp, ``Entry``),
as ``base.model.Entry`` documents them. A table's ids are given in order of first use, column by column
in ``ID_COLUMNS``' order: so the same entries always give the same bytes, whichever reader made them.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from functools import partial
from itertools import repeat
from typing import Any, Literal, overload

from ..base.model import COMPLETED, SCHEDULED, STARTED, Entry, RankColumns, RankDump
from ..base.speedups import SPEEDUPS as _speedups

NONE = -1  # None in an int column: no time, timeout or peer of a real op is negative
STATES = (SCHEDULED, STARTED, COMPLETED)
_STATE_INDEX = {state: index for index, state in enumerate(STATES)}

INT_COLUMNS = ("record_id", "pg_id", "collective_seq", "p2p_seq", "op_id", "created", "started", "completed")
# id column -> the table it indexes
ID_COLUMNS = {
    "group": "groups", "op": "ops", "thread": "threads", "input_sizes": "sizes", "output_sizes": "sizes",
    "input_dtypes": "dtypes", "output_dtypes": "dtypes", "frames": "stacks",
}  # fmt: skip
TABLES = ("groups", "ops", "threads", "sizes", "dtypes", "stacks")
# column -> its ``array`` type code
TYPES = {
    **dict.fromkeys(INT_COLUMNS, "q"), "timeout": "q", "duration": "d", "state": "B", "retired": "B",
    "is_p2p": "B", "p2p_src": "i", "p2p_dst": "i", **dict.fromkeys(ID_COLUMNS, "I"),
}  # fmt: skip
COLUMNS = tuple(TYPES)

Tables = dict[str, list[Any]]
# A rank's columns as their bytes (column -> its values' machine bytes, of its ``TYPES`` code): what a
# reading process sends the parent, and what entries are made from, with no array made on the way
ColumnBytes = dict[str, bytes]
# What the matcher reads of a rank's columns (``EntryRows.kept_columns``), and the
# field of ``Entry`` each column is read into
_KEPT_FIELDS = {
    "group": "group_name", "collective_seq": "collective_seq", "op": "op", "input_sizes": "input_sizes",
    "input_dtypes": "input_dtypes", "state": "state", "created": "time_created_ns", "is_p2p": "is_p2p",
}  # fmt: skip
KEPT_COLUMNS = tuple(_KEPT_FIELDS)


def _ids(values: Sequence[Any] | map[Any], table: dict[Any, int]) -> array[int]:
    """Each value's id in ``table`` (value -> id, filled in order of first use)."""
    return array("I", [table.setdefault(value, len(table)) for value in values])


def _nones(values: Sequence[int | None]) -> array[int]:
    return array("q", [NONE if value is None else value for value in values])


def from_entries(rank: int, entries: Sequence[Entry], names: Sequence[str] = COLUMNS) -> RankColumns:
    """The reference: columns of entries the Python reader made (every one's ``closed_by`` None); only
    those ``names`` (in their order), whose tables then hold only what those columns index."""
    tables: dict[str, dict[Any, int]] = {name: {} for name in TABLES}
    fields = list(zip(*entries, strict=True)) if entries else [()] * len(Entry._fields)
    get = dict(zip(Entry._fields, fields, strict=True))
    peers = get["p2p_local"]
    columns: dict[str, array[Any]] = {
        "record_id": array("q", get["record_id"]), "pg_id": array("q", get["pg_id"]),
        "collective_seq": array("q", get["collective_seq"]), "p2p_seq": array("q", get["p2p_seq"]),
        "op_id": array("q", get["op_id"]), "created": array("q", get["time_created_ns"]),
        "started": _nones(get["time_started_ns"]), "completed": _nones(get["time_completed_ns"]),
        "timeout": _nones(get["timeout_ms"]),
        "duration": array("d", [math.nan if d is None else d for d in get["duration_ms"]]),
        "state": array("B", map(_STATE_INDEX.__getitem__, get["state"])),
        "retired": array("B", get["retired"]), "is_p2p": array("B", get["is_p2p"]),
        "p2p_src": array("i", [NONE if p is None else p[0] for p in peers]),
        "p2p_dst": array("i", [NONE if p is None else p[1] for p in peers]),
    }  # fmt: skip
    sources = {
        "group": zip(get["group_name"], get["group_desc"], strict=True),
        "op": zip(get["backend"], get["op"], strict=True),
        "thread": zip(get["thread_id"], get["thread_name"], strict=True), "input_sizes": get["input_sizes"],
        "output_sizes": get["output_sizes"], "input_dtypes": get["input_dtypes"],
        "output_dtypes": get["output_dtypes"], "frames": get["frames"],
    }  # fmt: skip
    for name, table in ID_COLUMNS.items():
        if name in names:  # the costly ones: a lookup per entry
            columns[name] = _ids(list(sources[name]), tables[table])
    kept = {name: columns[name] for name in names}
    return RankColumns(rank, kept, {name: list(table) for name, table in tables.items()})


class GiveUp(Exception):
    """What the C reader read cannot be put in columns as the Python reader would: read it that way."""


def from_raw(
    rank: int,
    raw: tuple[int, tuple[bytes, ...], list[tuple[Any, ...]], list[Any]],
    normalise_shape: Callable[[tuple[Any, ...]], tuple[Any, ...]],
    normalise_field: Callable[[str, Any], Any],
) -> RankColumns:
    """Columns from what ``_speedups.pickle_columns`` read: its numbers as they are, each distinct shape
    (the repeating fields, ``reader._SHAPE_KEYS``) and sizes, dtypes or stack made what the Python reader
    makes of it by ``normalise_shape`` and ``normalise_field`` (which raise ``GiveUp``), ids renumbered
    as ``from_entries`` numbers them. Array work is done by ``gather`` and ``first_uses``, in C."""
    rows, data, shapes, objects = raw
    columns = {name: _from_bytes("q", chunk) for name, chunk in zip(INT_COLUMNS, data[:8], strict=True)}
    columns["duration"] = _from_bytes("d", data[8])
    shape_ids, *raw_ids = data[9:]
    # made: (group, op, peers, is_p2p, state, retired, timeout, thread), one per shape
    made = [normalise_shape(shape) for shape in shapes]
    per_shape = {
        "timeout": array("q", [NONE if m[6] is None else m[6] for m in made]),
        "state": array("B", [_STATE_INDEX[m[4]] for m in made]),
        "retired": array("B", [m[5] for m in made]),
        "is_p2p": array("B", [m[3] for m in made]),
        "p2p_src": array("i", [NONE if m[2] is None else m[2][0] for m in made]),
        "p2p_dst": array("i", [NONE if m[2] is None else m[2][1] for m in made]),
    }
    for name, values in per_shape.items():
        columns[name] = _from_bytes(values.typecode, gather(shape_ids, values.tobytes(), values.itemsize))
    tables: dict[str, dict[Any, int]] = {name: {} for name in TABLES}
    for name, index in (("group", 0), ("op", 1), ("thread", 7)):
        columns[name] = _renumbered(shape_ids, [m[index] for m in made].__getitem__, tables[ID_COLUMNS[name]])
    fields = ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "frames")
    for name, ids in zip(fields, raw_ids, strict=True):
        value_of = partial(_field_value, normalise_field, name, objects)
        columns[name] = _renumbered(ids, value_of, tables[ID_COLUMNS[name]])
    if any(len(column) != rows for column in columns.values()):
        raise GiveUp("columns of different lengths")
    ordered = {name: columns[name] for name in COLUMNS}
    return RankColumns(rank, ordered, {name: list(table) for name, table in tables.items()})


def _field_value(normalise_field: Callable[[str, Any], Any], name: str, objects: list[Any], raw_id: int) -> Any:
    """The value of field ``name`` the raw id stands for (raw id 0 is None), as the reader makes it."""
    return normalise_field(name, objects[raw_id])


def _from_bytes(kind: str, chunk: bytes) -> array[Any]:
    column = array(kind)
    column.frombytes(chunk)
    return column


def gather_in_python(ids: bytes, table: bytes, width: int) -> bytes:
    """``table``'s item ``ids[i]`` (``width`` bytes each) for each uint32 of ``ids``; ``_speedups.gather``.
    An id past the table is a ValueError, as there."""
    if not 1 <= width <= 8 or len(ids) % 4 or len(table) % width:
        raise ValueError("gather: ids of 4 bytes, a table of width 1 to 8")
    numbers = _from_bytes("I", ids)
    if numbers and max(numbers) >= len(table) // width:
        raise ValueError("gather: an id past the table")
    return b"".join(table[width * i : width * i + width] for i in numbers)


def first_uses_in_python(ids: bytes) -> list[int]:
    """The distinct uint32s of ``ids`` in order of first use; ``_speedups.first_uses``."""
    return list(dict.fromkeys(_from_bytes("I", ids)))


# ``gather_in_python`` and ``first_uses_in_python``, in C where the speed-ups are built
gather: Callable[[bytes, bytes, int], bytes] = gather_in_python if _speedups is None else _speedups.gather
first_uses: Callable[[bytes], list[int]] = first_uses_in_python if _speedups is None else _speedups.first_uses


def _renumbered(raw: bytes, value_of: Callable[[int], Hashable], table: dict[Any, int]) -> array[int]:
    """``raw`` ids (uint32 bytes) as ids into ``table`` of their values (``value_of``), given in order of
    first use."""
    uses = first_uses(raw)
    remap = array("I", bytes(4 * (max(uses, default=0) + 1)))
    for raw_id in uses:
        remap[raw_id] = table.setdefault(value_of(raw_id), len(table))
    return _from_bytes("I", gather(raw, remap.tobytes(), 4))


class JobTables:
    """The job's tables, each value once: a rank's are merged in and its id columns remapped to them.
    ``canonical`` (value -> itself) makes equal strings and tuples one object across ranks."""

    def __init__(self, canonical: dict[object, object]) -> None:
        self.canonical = canonical
        self.ids: dict[str, dict[Any, int]] = {name: {} for name in TABLES}
        self.values: Tables = {name: [] for name in TABLES}

    @classmethod
    def going_on_from(cls, tables: Tables) -> JobTables:
        """Job tables that go on from ``tables``, a set that ranks' columns index already: each of its values
        keeps its id, and a rank merged in gets ids into it (new values appended)."""
        job = cls({})
        job.values = tables
        job.ids = {name: {value: index for index, value in enumerate(values)} for name, values in tables.items()}
        return job

    def _shared(self, value: Any) -> Any:
        if type(value) is tuple and value and type(value[0]) is str:  # (name, desc) and such: each part too
            value = tuple(self.canonical.setdefault(part, part) for part in value)
        return self.canonical.setdefault(value, value)

    def merged_bytes(self, columns: ColumnBytes, tables: Tables) -> ColumnBytes:
        """A rank's columns (as bytes, ids into ``tables``) with its id columns remapped to the job's tables
        (which take what they lack of ``tables``), every other column as it is."""
        remaps: dict[str, bytes | None] = {}  # table -> each of the rank's ids' in the job's; None: the same
        for table in TABLES:
            ids, values = self.ids[table], self.values[table]
            remap = []
            for value in tables[table]:
                known = ids.get(value)
                if known is None:
                    known = ids[value] = len(values)
                    values.append(self._shared(value))
                remap.append(known)
            remaps[table] = array("I", remap).tobytes() if remap != list(range(len(remap))) else None
        merged = dict(columns)
        for name, table in ID_COLUMNS.items():
            in_job = remaps[table]
            if name in merged and in_job is not None:
                merged[name] = gather(merged[name], in_job, 4)
        return merged

    def fill(self, dump: RankDump, columns: ColumnBytes, tables: Tables) -> None:
        """Give ``dump`` its entries, made from its ``columns`` (as bytes, ids into ``tables``) when asked
        for (``EntryRows``, which the matcher reads the columns of), after its tables are merged into the
        job's: every name, size, dtype list and stack one object across the job's ranks, and one id per
        value in every rank's columns."""
        merged = self.merged_bytes(columns, tables)
        count = len(merged["created"]) // 8
        dump.entries = EntryRows(count, entry_sources(dump.rank, merged, self.values, self.canonical), self.values)


_BOOLS = (False, True)
_NONE_I32 = array("i", [NONE]).tobytes()

# Where one field of the entries comes from, for ``make_entries``: a kind, its data and one more thing.
#   ("v", values, None)       the values, one per entry
#   ("c", None, value)        the same value for every entry
#   ("q", int64 bytes, ints)  each an int: one object per value through ``ints`` (value -> itself), if given
#   ("Q", int64 bytes, ints)  the same, or None where the column holds ``NONE``
#   ("d", float64 bytes, None) each a float, or None where the column holds NaN
#   ("I", uint32 bytes, table), ("B", uint8 bytes, table)  each ``table[id]``
#   ("0", uint32 bytes, table), ("1", ...)  each ``table[id][0]`` (``[1]``): a part of a pair (name, desc)
Source = tuple[str, Any, Any]
MakeEntries = Callable[[type[Entry], int, list[Source]], list[Entry]]


def entries_in_python(
    entry_type: type[Entry], count: int, sources: list[Source], rows: bytes | None = None
) -> list[Entry]:
    """The entries of ``entry_type`` at ``rows`` (uint32 bytes; None: all ``count``), field by field from
    ``sources`` (``Source``), each of ``count`` rows: what ``_speedups.entries_from_columns`` does, and
    where the speed-ups are not built."""
    wanted: Sequence[int] = range(count) if rows is None else array("I", rows)
    if any(row >= count for row in wanted):
        raise IndexError("entries_from_columns: a row beyond the columns")
    fields = [source_values(source, wanted) for source in sources]
    return list(map(tuple.__new__, repeat(entry_type), zip(*fields, strict=True)))


def source_values(source: Source, wanted: Sequence[int]) -> Sequence[Any]:
    """The values of one field at rows ``wanted`` (each below the source's count), as the entries made there
    hold them."""
    kind, data, extra = source
    if kind == "v":
        return [data[row] for row in wanted]
    if kind == "c":
        return [extra] * len(wanted)
    column: Any = array({"0": "I", "1": "I", "q": "q", "Q": "q"}.get(kind, kind), data)
    # every row (linking reads a rank's every op) without a lookup of each row
    picked = column if wanted == range(len(column)) else map(column.__getitem__, wanted)
    if kind in ("I", "B"):
        return list(map(extra.__getitem__, picked))
    if kind in ("0", "1"):
        part = int(kind)
        return [extra[id_][part] for id_ in picked]
    values = list(picked)
    if kind == "d":
        return [None if value != value else value for value in values]
    if extra is not None:
        values = list(map(extra.setdefault, values, values))
    return values if kind == "q" else [None if value == NONE else value for value in values]


def make_entries(entry_type: type[Entry], count: int, sources: list[Source], rows: bytes | None = None) -> list[Entry]:
    """``entries_in_python``, in C where the speed-ups are built."""
    if _speedups is not None:
        return _speedups.entries_from_columns(entry_type, count, sources, rows)  # type: ignore[no-any-return]
    return entries_in_python(entry_type, count, sources, rows)


class _MadeFromRows(Sequence[Entry]):
    """A rank's entries made when asked for, a sequence of them by ``rows`` and ``__len__``: indexing makes one
    row, iterating a chunk of rows at a time."""

    __slots__ = ()
    CHUNK = 4096  # rows made at once while iterating: one C call each, little held

    def rows(self, rows: Sequence[int]) -> list[Entry]:
        """The entries at ``rows``, in their order."""
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> Entry: ...
    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...
    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        count = len(self)
        if isinstance(index, slice):
            return self.rows(range(*index.indices(count)))
        row = index + count if index < 0 else index
        if not 0 <= row < count:
            raise IndexError("entry index out of range")
        return self.rows((row,))[0]

    def __iter__(self) -> Iterator[Entry]:
        count = len(self)
        for start in range(0, count, self.CHUNK):
            yield from self.rows(range(start, min(start + self.CHUNK, count)))

    def __reversed__(self) -> Iterator[Entry]:
        for stop in range(len(self), 0, -self.CHUNK):
            yield from reversed(self.rows(range(max(0, stop - self.CHUNK), stop)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))  # as the list of its entries would print


class EntryRows(_MadeFromRows):
    """A rank's entries, made from its columns when asked for and held by no one here: a job of millions
    of entries holds their columns (about 150 bytes an entry), not the entries (about 400). A column that
    holds one value in every row is held as that value (``_constants``): a rank's timeout, its thread, its
    peers where it sends nothing, a third of an entry's bytes in a large job's dumps.

    Each access makes new ``Entry`` objects, equal to those made before but not the same objects:
    compare entries with ``==``, never ``is``. Iterating makes them a chunk of rows at a time.
    """

    __slots__ = ("_constant", "_count", "_sources", "tables")

    def __init__(self, count: int, sources: list[Source], tables: Tables | None = None) -> None:
        self._count = count
        self._sources, self._constant = _constants(count, sources)
        self.tables = tables  # those the sources' ids index, where they are a set of tables (``fill``)

    def with_tables(self, tables: Tables) -> EntryRows:
        """These rows, their ids read into ``tables`` instead of ``self.tables``: tables of the same names and
        lengths, whose values stand for these one for one (redaction's placeholders). No column is copied."""
        if self.tables is None:
            raise ValueError("with_tables: rows whose ids index no set of tables")
        swap = {id(old): tables[name] for name, old in self.tables.items()}
        sources = [(kind, data, swap.get(id(extra), extra)) for kind, data, extra in self._sources]
        for index, (kind, one, extra) in self._constant.items():  # held as its value: made again from its id
            sources[index] = (kind, one * self._count, swap.get(id(extra), extra))
        return EntryRows(self._count, sources, tables)

    def kept_columns(self) -> dict[str, bytes] | None:
        """The columns the matcher reads (``KEPT_COLUMNS``) as the bytes the entries are made from (ids into
        ``tables``); None without tables."""
        if self.tables is None:
            return None
        kept = {}
        for name, field in _KEPT_FIELDS.items():
            column = self.column(field)
            if column is None:
                return None
            kept[name] = column
        return kept

    def __len__(self) -> int:
        return self._count

    def column(self, field: str) -> bytes | None:
        """The bytes of the column that one of ``Entry``'s fields is read from (ids, where it is read from a
        table), or None where it is not read from a column; a column held as its one value is made again."""
        index = Entry._fields.index(field)
        constant = self._constant.get(index)
        if constant is not None:
            one: bytes = constant[1]
            return one * self._count
        kind, data, _ = self._sources[index]
        return data if kind in _WIDTHS and type(data) is bytes else None

    def rows(self, rows: Sequence[int]) -> list[Entry]:
        """The entries at ``rows``, in their order."""
        return make_entries(Entry, self._count, self._sources, array("I", rows).tobytes())

    def raw_at(self, field: str, rows: Sequence[int]) -> list[int] | None:
        """What the column of one of ``Entry``'s fields holds at ``rows``, as it holds it (a table's id, an index
        into ``STATES``, ``NONE`` for None), with no entry made; None where the field is not read from an
        integer column. Ids index ``tables``."""
        index = Entry._fields.index(field)
        if field == "duration_ms":  # the one float column
            return None
        if rows and max(rows) >= self._count:
            raise IndexError("entry index out of range")
        constant = self._constant.get(index)
        if constant is not None:
            one = constant[1]
            return memoryview(one).cast(_INTS[len(one)]).tolist() * len(rows)
        kind, data, _ = self._sources[index]
        if kind not in _WIDTHS or type(data) is not bytes:
            return None
        return list(map(memoryview(data).cast(_INTS[_WIDTHS[kind]]).__getitem__, rows))

    def values(self, field: str, rows: Sequence[int]) -> list[Any]:
        """One of ``Entry``'s fields at ``rows``, as the entries there hold it: read from its column, with no
        entry made."""
        if rows and max(rows) >= self._count:
            raise IndexError("entry index out of range")
        return list(source_values(self._sources[Entry._fields.index(field)], rows))

    def distinct(self, field: str) -> set[Any]:
        """The values that one of ``Entry``'s fields takes, from its column where it can (a table's ids, an
        integer column), else from the entries."""
        kind, data, extra = self._sources[Entry._fields.index(field)]
        if not self._count:
            return set()
        if kind == "c":
            return {extra}
        if kind == "v":
            return set(data)
        if kind in ("I", "0", "1"):
            ids = first_uses(data)
            return set(map(extra.__getitem__, ids)) if kind == "I" else {extra[i][int(kind)] for i in ids}
        if kind == "B":
            return set(map(extra.__getitem__, set(data)))
        if kind in ("q", "Q"):
            values: set[int | None] = set(array("q", data))
            if kind == "Q" and NONE in values:  # None, in this column
                values.discard(NONE)
                values.add(None)
            return values
        return {getattr(entry, field) for entry in self}

    def rows_with(self, field: str, value: int) -> list[int]:
        """The rows whose integer field ``field`` (a seq, an id, a time) holds ``value``, ascending: found in
        the column's bytes, with no entry made."""
        kind, data, extra = self._sources[Entry._fields.index(field)]
        if kind == "c":  # one value in every row
            return list(range(self._count)) if extra == value else []
        if kind != "q" or not -(2**63) <= value < 2**63:  # a column with None in it, or no such value
            return [row for row, entry in enumerate(self) if getattr(entry, field) == value]
        needle = array("q", [value]).tobytes()
        rows: list[int] = []
        at = data.find(needle)
        while at >= 0:
            if at % 8 == 0:  # a whole value, not the end of one and the start of the next
                rows.append(at // 8)
            at = data.find(needle, at + 1)
        return rows


class LinkedRows(_MadeFromRows):
    """A rank's entries once its coalesced groups are linked (``match.coalesce``): made from its columns when
    asked for, as ``EntryRows``' are, but for the fields the linking changed (``fields``: each op's
    ``closed_by``; where it changed them, a batch's closing entry made p2p, collective seqs renumbered, an op
    set aside). Each op's ``closed_by`` is held as the row of its closing entry, which is made with the ops
    that point at it; any other changed field, one value a row. A rank whose pipeline batches its sends and
    recvs links a third of its entries: it holds 4 bytes a row for its closing entries and 8 for each other
    such field, not the entries (about 400 bytes each), nor each batch's closing entry (about 520 with its
    numbers: 1.4 GB for a pipeline job of 16,384 ranks).

    The entries made by one call share one closing entry per group; calls made apart give equal ones, not
    the same objects: what keys a batch by its closing entry keys it by value. Not an ``EntryRows``: its
    columns no longer tell all that its entries hold, so what reads a rank's columns for speed reads these
    entries instead, as it would a list's.
    """

    __slots__ = ("_closing", "_linked", "_rows", "base")

    def __init__(self, base: EntryRows, closing: array[int] | None, linked: dict[str, list[Any]]) -> None:
        """``closing``: the row of each row's closing entry (-1: none), None where no row has one or they are
        held as values; ``linked``: the values of each other field that linking changed, one a row."""
        self.base = base  # the rows as read, which a later linking starts from again
        self._closing = closing
        self._linked = linked  # field -> its values, where linking changed some
        sources = list(base._sources)
        for field, values in linked.items():
            sources[Entry._fields.index(field)] = ("v", values, None)
        self._rows = EntryRows(len(base), sources)

    @classmethod
    def from_entries(
        cls, base: EntryRows, made: list[Entry], linked: Sequence[Entry], fields: Sequence[str]
    ) -> LinkedRows:
        """``made``: ``base``'s entries as it makes them; ``linked``: the same once linked, whose ``fields``
        linking may have changed."""
        if not len(made) == len(linked) == len(base):
            raise ValueError("linked entries: as many as the rows they are made from")
        closing: array[int] | None = None
        changed: dict[str, list[Any]] = {}
        for field in fields:
            index = Entry._fields.index(field)
            values: list[Any] = [entry[index] for entry in linked]
            if values == [entry[index] for entry in made]:
                continue
            if field == "closed_by":
                closing = _closing_rows(linked, values)
                if closing is not None:
                    continue  # made with the entries that point at them (``rows``)
            changed[field] = values
        return cls(base, closing, changed)

    def kept_columns(self) -> dict[str, bytes] | None:
        """``EntryRows.kept_columns`` of these entries: the base's, with the columns of the fields linking
        changed made from their values (ids into the base's ``tables``); None where the base has none."""
        kept = self.base.kept_columns()
        if kept is not None:
            for column, field in _KEPT_FIELDS.items():
                if field in self._linked:
                    try:
                        kept[column] = array(TYPES[column], self._linked[field]).tobytes()
                    except (OverflowError, TypeError):  # a value its column cannot hold: read the entries
                        return None
        return kept

    def closed(self) -> bytes:
        """1 for each row whose op is closed by another entry (in a coalesced group), else 0."""
        if self._closing is not None:
            return bytes(row >= 0 for row in self._closing)
        return bytes(by is not None for by in self.values("closed_by", range(len(self))))

    def state_rows(self, rows: Sequence[int]) -> list[int] | None:
        """The row of the entry that carries each of ``rows``' state (``base.model.state_entry``): its
        closing entry's where it has one, else its own; None where ``closed_by`` is held as values."""
        closing = self._closing
        if closing is None:
            return None if "closed_by" in self._linked else list(rows)
        return [row if closing[row] < 0 else closing[row] for row in rows]

    def raw_at(self, field: str, rows: Sequence[int]) -> list[int] | None:
        """``EntryRows.raw_at`` of a field linking left as read; None for one it changed. A state read so is the
        entry's own: ``state_rows`` says which entry carries it."""
        return None if field in self._linked or field == "closed_by" else self.base.raw_at(field, rows)

    def values(self, field: str, rows: Sequence[int]) -> list[Any]:
        """One of ``Entry``'s fields at ``rows``, as the entries there hold it (``EntryRows.values``)."""
        if field == "closed_by" and self._closing is not None:
            return [entry.closed_by for entry in self.rows(rows)]
        linked = self._linked.get(field)
        return self.base.values(field, rows) if linked is None else [linked[row] for row in rows]

    def distinct(self, field: str) -> set[Any]:
        """The values that one of ``Entry``'s fields takes (``EntryRows.distinct``)."""
        if field == "closed_by" and self._closing is not None:
            return {entry.closed_by for entry in self}
        linked = self._linked.get(field)
        return self.base.distinct(field) if linked is None else set(linked)

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self, rows: Sequence[int]) -> list[Entry]:
        """The entries at ``rows``, in their order; those of one group share its closing entry, made once."""
        closing = self._closing
        if closing is None:
            return self._rows.rows(rows)
        wanted = array("I", rows)
        closing_of = [closing[row] for row in wanted]
        needed = sorted(set(closing_of) - {-1})
        if not needed:
            return self._rows.rows(wanted)
        closings = dict(zip(needed, self._rows.rows(needed), strict=True))  # each closed by none
        closed_by: list[Entry | None] = [None] * len(self._rows)
        for row, at in zip(wanted, closing_of, strict=True):
            if at >= 0:
                closed_by[row] = closings[at]
        sources = list(self._rows._sources)
        sources[_CLOSED_BY] = ("v", closed_by, None)
        return make_entries(Entry, len(self._rows), sources, wanted.tobytes())


_CLOSED_BY = Entry._fields.index("closed_by")


def _closing_rows(linked: Sequence[Entry], closed_by: list[Entry | None]) -> array[int] | None:
    """The row of each entry's closing entry (-1: none), where every closing entry is one of ``linked`` and
    closed by none itself; else None (its ``closed_by`` is then held as the values)."""
    row_of = {id(entry): row for row, entry in enumerate(linked)}
    rows = array("i", [-1]) * len(linked)
    for row, closing in enumerate(closed_by):
        if closing is not None:
            at = row_of.get(id(closing))
            if at is None or closed_by[at] is not None:
                return None
            rows[row] = at
    return rows


_WIDTHS = {"q": 8, "Q": 8, "d": 8, "I": 4, "B": 1, "0": 4, "1": 4}  # bytes per row of a source's column
_INTS: dict[int, Literal["q", "I", "B"]] = {8: "q", 4: "I", 1: "B"}  # an integer column's format, by its width


def _constants(count: int, sources: list[Source]) -> tuple[list[Source], dict[int, Source]]:
    """``sources`` where each column that holds one value in every row is that value, as an entry made from
    it holds it (a ``"c"`` source); and, by field index, those columns' sources as they were but for their
    data, one row's bytes."""
    made, constant = list(sources), {}
    first: Entry | None = None
    for index, (kind, data, _) in enumerate(sources):
        width = _WIDTHS.get(kind)
        if width is None or type(data) is not bytes or count < 2 or data != data[:width] * count:
            continue
        if first is None:
            first = make_entries(Entry, count, sources, bytes(4))[0]  # row 0, made as any other row
        made[index] = ("c", None, first[index])
        constant[index] = (kind, data[:width], sources[index][2])
    return made, constant


def column_bytes(rank: RankColumns) -> ColumnBytes:
    """``rank``'s columns as their bytes."""
    return {name: column.tobytes() for name, column in rank.columns.items()}


def to_entries(
    rank: RankColumns,
    make: MakeEntries = make_entries,
    canonical: dict[Any, Any] | None = None,
    ints: dict[int, int] | None = None,
) -> list[Entry]:
    """``rank``'s entries, made by ``make``; each pair of peers ``canonical``'s (value -> itself), as every
    other tuple in them is the tables', and each id, seq and timeout ``ints``' (value -> itself)."""
    count = len(rank)
    sources = entry_sources(rank.rank, column_bytes(rank), rank.tables, canonical, {} if ints is None else ints)
    return make(Entry, count, sources) if count else []


def entry_sources(
    rank: int,
    c: ColumnBytes,
    t: Tables,
    canonical: dict[Any, Any] | None = None,
    ints: dict[int, int] | None = None,
) -> list[Source]:
    """Where each of ``rank``'s entries' fields comes from (``Source``): its columns' bytes ``c`` (each
    column's once, whichever fields read it) and the tables ``t`` its ids index (``to_entries`` says what
    ``canonical`` and ``ints`` are for; without ``ints``, each entry made has ints of its own: entries made
    when asked for are let go)."""
    groups, ops, threads = t["groups"], t["ops"], t["threads"]
    canonical = {} if canonical is None else canonical
    peers: Source = ("c", None, None)  # no send or recv: no peers
    # every one NONE (the common case, compared as bytes), else as max() says
    sources_of_peers = array("i", c["p2p_src"])
    if c["p2p_src"] != _NONE_I32 * len(sources_of_peers) and max(sources_of_peers, default=NONE) != NONE:
        pairs = [
            None if src == NONE else canonical.setdefault((src, dst), (src, dst))
            for src, dst in zip(sources_of_peers, array("i", c["p2p_dst"]), strict=True)
        ]
        peers = ("v", pairs, None)

    def shared(name: str) -> Source:
        return ("q", c[name], ints)

    def looked_up(name: str, table: Sequence[Any], part: str = "I") -> Source:
        return (part, c[name], table)

    sources: list[Source] = [
        ("c", None, rank),
        looked_up("group", groups, "0"),
        looked_up("group", groups, "1"),
        shared("pg_id"), shared("record_id"), shared("collective_seq"), shared("p2p_seq"), shared("op_id"),
        looked_up("op", ops, "0"),
        looked_up("op", ops, "1"),
        peers,
        ("B", c["is_p2p"], _BOOLS),
        looked_up("input_sizes", t["sizes"]),
        looked_up("output_sizes", t["sizes"]),
        looked_up("input_dtypes", t["dtypes"]),
        looked_up("output_dtypes", t["dtypes"]),
        ("B", c["state"], STATES),
        ("B", c["retired"], _BOOLS),
        ("q", c["created"], None),
        ("Q", c["started"], None),
        ("Q", c["completed"], None),
        ("d", c["duration"], None),
        ("Q", c["timeout"], ints),
        looked_up("thread", threads, "0"),
        looked_up("thread", threads, "1"),
        looked_up("frames", t["stacks"]),
        ("c", None, None),
    ]  # fmt: skip
    return sources


def group_counts(rank: RankColumns) -> dict[tuple[str, str], int]:
    """``base.model.group_counts`` of the entries: how many name each (group name, desc)."""
    counts = Counter(rank.columns["group"])
    groups = rank.tables["groups"]
    return {groups[group]: count for group, count in counts.items()}
