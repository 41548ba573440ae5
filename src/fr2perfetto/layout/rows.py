"""A rank's ops and slices held as rows of arrays, where the speed-ups are built: no ``(op, entries)`` item
per op and rank, no ``Entry`` and no ``Slice`` for the common op (a completed collective, issued as one
entry, in which the rank has no role), read from the rank's columns and written from records.

``streams`` lays out a rank's items either way, and leaves each op the C layout does not take to the
same Python code, which makes its entries then; the Perfetto writer encodes records in C and every
``Slice`` added among them as it does any other. The trace is byte for byte the one the object path
(``timeline.ops_by_rank``, ``Slice`` lists) writes, which the tests check on every sample.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ..base.model import MAX_RANK, EntriesByRank, Entry, Group, MatchedOp
from ..base.speedups import SPEEDUPS as _speedups
from ..read.columns import EntryRows
from ..read.job import Job
from .looks import LOOK_HEAD_FIELDS, LOOK_LAST_FIELDS, Looks
from .scene import Slice, SliceLook

# A rank's part in an op (``RankItems``): the op's index in the job's ops and the row of the rank's one entry
# in it, or one of these
ITEM = struct.Struct("=ii")
MISSING_ROW = -1  # the rank never issued the op
HELD_ROW = -2  # the op gives the rank's entries (several, or held as a dict)
# A slice (``SliceRows``): start, end (``NO_END``: an instant), its own flow, the number of its look in the
# writer's ``LookTable`` (``EXTRA``: the slice is ``SliceRows.extras[row]``; from ``OWN_LOOK`` on: the look is
# ``SliceRows.own_looks[number - OWN_LOOK]``), the row of the rank's entry it stands for (-1: none)
RECORD = struct.Struct("=qqQii")
NO_END = -(2**63)
EXTRA = -1
OWN_LOOK = 1 << 30
_LOOK_AT = struct.calcsize("=qqQ") // 4  # a record read as int32s: where its look's number is
_INT64 = (-(2**63), 2**63 - 1)

# The columns of a rank's entries that decide the look of its slice (looks.look_key): by Entry field
_LOOK_COLUMN_OF = {
    "op": "op", "backend": "op", "collective_seq": "collective_seq", "p2p_seq": "p2p_seq",
    "input_sizes": "input_sizes", "output_sizes": "output_sizes", "input_dtypes": "input_dtypes",
    "output_dtypes": "output_dtypes", "frames": "frames", "state": "state", "retired": "retired",
    "timeout_ms": "timeout",
}  # fmt: skip
# a field added to the look's must be given its column here (a KeyError at import says so)
LOOK_COLUMNS = tuple(dict.fromkeys(_LOOK_COLUMN_OF[name] for name in LOOK_HEAD_FIELDS + LOOK_LAST_FIELDS))
_FIELD_OF = {"op": "op", "thread": "thread_id", "timeout": "timeout_ms", "created": "time_created_ns",
             "started": "time_started_ns", "completed": "time_completed_ns", "duration": "duration_ms"}  # fmt: skip
_LAYOUT_COLUMNS = ("created", "started", "completed", "thread")
_FACT_COLUMNS = ("op_id", "record_id", "created", "started", "completed", "duration", "thread")


class LookTable:
    """The looks a writing process has met, each with its number: what records name."""

    __slots__ = ("_numbers", "looks")

    def __init__(self) -> None:
        self.looks: list[SliceLook] = []
        self._numbers: dict[int, int] = {}  # id of a look (which ``looks`` holds) -> its number

    def number(self, look: SliceLook) -> int:
        number = self._numbers.get(id(look))
        if number is None:
            number = self._numbers[id(look)] = len(self.looks)
            self.looks.append(look)
        return number


class SliceRows(Sequence[Slice]):
    """A track's slices, in order: records (``RECORD``) that the C layout writes, and ``Slice`` objects added
    one at a time (``append``: a record where one can stand for the slice, else held in ``extras``, a record
    naming each). A record's ``Slice`` is made when asked for, its entry from the rank's entries."""

    __slots__ = ("clamped", "entries", "extras", "own_looks", "records", "table")

    def __init__(self, table: LookTable, entries: Sequence[Entry]) -> None:
        self.records = bytearray()
        self.extras: list[Slice] = []
        # the looks of records added by ``append``: a send's or recv's is its rank's alone, and goes with the track
        self.own_looks: list[SliceLook] = []
        self.table = table
        self.entries = entries
        self.clamped = False  # an extra starts beyond what a record holds (a stranger's times)

    def __len__(self) -> int:
        return len(self.records) // RECORD.size

    def append(self, item: Slice, row: int = -1) -> None:
        """Add a slice: as a record where it has one flow and is an instant that stands for no entry, or a
        slice that stands for the rank's one entry at ``row`` (its head and last), so that the writer encodes
        it in C; else as an extra."""
        start, end, look, head, last, flows = item
        if (
            len(flows) == 1 and head is last and (head is None if end is None else row >= 0 and head is not None)
            and _INT64[0] < start <= _INT64[1] and (end is None or _INT64[0] < end <= _INT64[1])
            and 0 <= flows[0] < 2**64 and len(self.own_looks) < OWN_LOOK
        ):  # fmt: skip
            self.own_looks.append(look)
            number = OWN_LOOK + len(self.own_looks) - 1
            if end is None:
                self.records += RECORD.pack(start, NO_END, flows[0], number, -1)
            else:
                self.records += RECORD.pack(start, end, flows[0], number, row)
            return
        self.extras.append(item)
        self.records += self._extra_record(item, len(self.extras) - 1)

    def _extra_record(self, item: Slice, number: int) -> bytes:
        """The record that names an extra: its start orders it (``sort_by_start``), its end says whether it is
        an instant."""
        start = min(max(item.start, _INT64[0] + 1), _INT64[1])
        self.clamped = self.clamped or start != item.start
        return RECORD.pack(start, NO_END if item.end is None else 0, 0, EXTRA, number)

    def _made(self, record: tuple[int, int, int, int, int]) -> Slice:
        start, end, flow, look, row = record
        if look == EXTRA:
            return self.extras[row]
        head = self.entries[row] if row >= 0 else None
        made = self.own_looks[look - OWN_LOOK] if look >= OWN_LOOK else self.table.looks[look]
        return Slice(start, None if end == NO_END else end, made, head, head, (flow,))

    def __getitem__(self, index: int) -> Slice:  # type: ignore[override]
        at = index + len(self) if index < 0 else index
        if not 0 <= at < len(self):
            raise IndexError("slice index out of range")
        return self._made(RECORD.unpack_from(self.records, at * RECORD.size))

    def __setitem__(self, index: int, item: Slice) -> None:
        at = index + len(self) if index < 0 else index
        _, _, _, look, row = RECORD.unpack_from(self.records, at * RECORD.size)
        if look == EXTRA:
            self.extras[row] = item
            return
        self.extras.append(item)
        self.records[at * RECORD.size : (at + 1) * RECORD.size] = self._extra_record(item, len(self.extras) - 1)

    def __iter__(self) -> Iterator[Slice]:
        return map(self._made, RECORD.iter_unpack(bytes(self.records)))

    def sort_by_start(self) -> None:
        """Order the slices by start, as a stable sort does."""
        if self.clamped:
            starts = [item.start for item in self]
        else:
            with memoryview(self.records) as view, view.cast("q") as numbers:
                starts = numbers[0 :: RECORD.size // 8].tolist()
        if starts == sorted(starts):
            return
        order = sorted(range(len(starts)), key=starts.__getitem__)
        size = RECORD.size
        self.records = bytearray(b"".join(self.records[i * size : i * size + size] for i in order))

    def numbered(self) -> tuple[bytearray, list[SliceLook]]:
        """The records and the looks they number, for ``_speedups.encode_rows``: the track's own looks after the
        table's, each record that names one renumbered to match."""
        if not self.own_looks:
            return self.records, self.table.looks
        looks = self.table.looks + self.own_looks
        records = bytearray(self.records)
        shift = len(self.table.looks) - OWN_LOOK
        with memoryview(records) as view, view.cast("i") as numbers:
            column = numbers[_LOOK_AT :: RECORD.size // 4].tolist()
            numbers[_LOOK_AT :: RECORD.size // 4] = array("i", [n + shift if n >= OWN_LOOK else n for n in column])
        return records, looks

    def facts(self) -> tuple[object, ...]:
        """What ``_speedups.encode_rows`` reads of the rank's entries: their columns (``_FACT_COLUMNS``) and the
        threads table."""
        assert isinstance(self.entries, EntryRows)
        assert self.entries.tables is not None
        return (*(_column(self.entries, name) for name in _FACT_COLUMNS), self.entries.tables["threads"])


class RankItems(Sequence[tuple[MatchedOp, list[Entry]]]):
    """A rank's items of one group (what ``timeline.ops_by_rank`` gives), as ``ITEM`` pairs, each made into
    ``(op, entries)`` when asked for."""

    __slots__ = ("entries", "ops", "packed", "rank")

    def __init__(self, packed: bytes, ops: list[MatchedOp], entries: Sequence[Entry], rank: int) -> None:
        self.packed = packed
        self.ops = ops
        self.entries = entries
        self.rank = rank

    def __len__(self) -> int:
        return len(self.packed) // ITEM.size

    def row(self, index: int) -> int:
        """The row of the rank's one entry in the item at ``index``, or ``MISSING_ROW`` or ``HELD_ROW``."""
        return ITEM.unpack_from(self.packed, index * ITEM.size)[1]  # type: ignore[no-any-return]

    def __getitem__(self, index: int) -> tuple[MatchedOp, list[Entry]]:  # type: ignore[override]
        op_index, row = ITEM.unpack_from(self.packed, index * ITEM.size)
        op = self.ops[op_index]
        if row >= 0:
            return op, [self.entries[row]]
        return op, [] if row == MISSING_ROW else op.entries[self.rank]


@dataclass(slots=True)
class JobRows:
    """What laying out ranks from rows reads of the job's ops, made once by each writing process."""

    ops: list[MatchedOp]
    groups: list[Group]
    op_keys: bytes  # int64, one per op
    op_kinds: bytes  # uint8: 1 for a collective
    op_groups: bytes  # int32: the op's group's index in ``groups``
    first_times: bytes  # int64: op.first_time_ns
    items: dict[int, bytes]  # rank -> its items (``ITEM`` pairs) in the order of the ops
    table: LookTable = field(default_factory=LookTable)
    cache: bytearray = field(default_factory=bytearray)  # what ``_speedups.lay_out_rows`` remembers of each op

    def rank_groups(self, rank: int, entries: EntryRows) -> list[tuple[Group, RankItems]]:
        """``streams._by_group`` of the rank's items: each group's, in the order of its first, sorted by when the
        rank began each where that is not their order."""
        assert _speedups is not None

        def start_of(op_index: int) -> int:  # streams.start_on_rank, for an op that gives the rank's entries
            op = self.ops[op_index]
            entries = op.entries[rank]
            return entries[0].time_created_ns if entries else op.first_time_ns

        parts = _speedups.rank_groups(self.items.get(rank, b""), self.op_groups, _column(entries, "created"),
                                      self.first_times, start_of)  # fmt: skip
        return [(self.groups[group], RankItems(packed, self.ops, entries, rank)) for group, packed in parts]

    def context(self, looks: Looks, entries: EntryRows) -> RankRows:
        """What ``_speedups.lay_out_rows`` reads of one rank, but for what changes as it goes."""
        numbers = self.table.number

        def prepare(op_index: int, row: int) -> tuple[int, int, int | None] | None:
            op = self.ops[op_index]
            if not looks.prepare(op, [entries[row]]):
                return None
            key = op.op_key
            return numbers(looks.last_looks[key]), numbers(looks.enqueue_looks[key]), looks.references[key]

        columns = tuple(_column(entries, name) for name in _LAYOUT_COLUMNS)
        look_columns = tuple(_column(entries, name) for name in LOOK_COLUMNS)
        roles = array("q", sorted(looks.rank_roles)).tobytes()
        assert entries.tables is not None
        threads = {pair: number for number, pair in enumerate(entries.tables["threads"])}
        return RankRows(columns, look_columns, self, roles, prepare, threads)


@dataclass(slots=True)
class RankRows:
    """What ``_speedups.lay_out_rows`` reads of one rank (``context`` adds what changes as it goes)."""

    columns: tuple[bytes, ...]
    look_columns: tuple[bytes, ...]
    job: JobRows
    roles: bytes
    prepare: object
    threads: dict[tuple[object, object], int]  # (thread id, thread name) -> its id in the rank's thread column


def job_rows(job: Job, ops: list[MatchedOp], ranks: Sequence[int]) -> JobRows | None:
    """``JobRows`` for laying out those of ``ranks`` whose entries are columns, or None where none can be (the
    speed-ups not built, no such rank, a number past what the arrays hold)."""
    if _speedups is None:
        return None
    # below MAX_RANK, a rank's launch flows (streams.LAUNCH_FLOW_BASE + rank << 32 + op key) stay below 2**62
    wanted = sorted(rank for rank in ranks if 0 <= rank < MAX_RANK and _columnar(job, rank))
    if not wanted:
        return None
    groups: dict[Group, int] = {}
    held: list[tuple[bytes, bytes] | Mapping[int, list[Entry]]] = []
    checked: dict[int, bool] = {}  # id of an op's sources -> whether they are the dumps' entries
    for op in ops:
        entries = op.entries
        if isinstance(entries, EntriesByRank) and _sources_of(job, entries, checked):
            held.append(entries.packed())
        else:  # the op gives them: read where the layout takes this op (``RankItems``)
            held.append(entries)
        groups.setdefault(op.group, len(groups))
    try:
        op_keys = array("q", [op.op_key for op in ops]).tobytes()
        first_times = array("q", [op.first_time_ns for op in ops]).tobytes()
    except OverflowError:
        return None
    return JobRows(
        ops, list(groups), op_keys, bytes(op.kind == "collective" for op in ops),
        array("i", [groups[op.group] for op in ops]).tobytes(), first_times,
        _speedups.rank_items(ops, held, wanted),
    )  # fmt: skip


def _column(entries: EntryRows, name: str) -> bytes:
    """The bytes of one of the rank's columns (named as ``read.columns`` names them), which ``_columnar``
    found."""
    column = entries.column(_FIELD_OF.get(name, name))
    assert column is not None
    return column


def _columnar(job: Job, rank: int) -> bool:
    dump = job.dumps.get(rank)
    if dump is None or not isinstance(dump.entries, EntryRows) or dump.entries.tables is None:
        return False
    needed = {*_LAYOUT_COLUMNS, *LOOK_COLUMNS, *_FACT_COLUMNS}
    return all(dump.entries.column(_FIELD_OF.get(name, name)) is not None for name in needed)


def _sources_of(job: Job, entries: EntriesByRank, checked: dict[int, bool]) -> bool:
    """Whether an op's rows index its ranks' dumps' entries (the matcher's sources: checked once)."""
    sources = entries.sources
    known = checked.get(id(sources))
    if known is None:
        known = checked[id(sources)] = all(
            (dump := job.dumps.get(rank)) is not None and dump.entries is held for rank, held in sources.items()
        )
    return known
