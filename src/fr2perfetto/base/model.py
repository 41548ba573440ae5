"""The data model every stage shares: what a dump holds, once normalised.

Plain dataclasses with slots, and named tuples for what a job holds by the million (entries, frames).
A reader turns each file into a ``RankDump``; the matcher groups ``Entry`` objects of many ranks
into ``MatchedOp``s; the diagnosis turns those into ``Finding``s.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, getitem, itemgetter
from typing import Any, NamedTuple

from .text import path_text, shown

# States as PyTorch's writer spells them.
SCHEDULED = "scheduled"
STARTED = "started"
COMPLETED = "completed"


class Frame(NamedTuple):
    """One Python stack frame of the code that issued an op (a tuple: stacks are hashed often)."""

    name: str
    filename: str
    line: int


class Entry(NamedTuple):
    """One Flight Recorder entry (one op on one rank), whatever the dump's version or format.

    A named tuple, not a dataclass: a job has millions, made from rows of values that reading
    processes send, and a tuple is made from a row in one C call. Immutable: ``link_coalesced``
    replaces an entry to set ``closed_by``.
    """

    rank: int
    group_name: str
    group_desc: str
    pg_id: int
    record_id: int
    collective_seq: int
    p2p_seq: int
    op_id: int
    backend: str
    op: str
    # For send/recv: (source, destination) as group-local ranks, as PyTorch writes them.
    p2p_local: tuple[int, int] | None
    is_p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    state: str
    retired: bool
    time_created_ns: int
    time_started_ns: int | None
    time_completed_ns: int | None
    duration_ms: float | None
    timeout_ms: int | None
    thread_id: str
    thread_name: str
    frames: tuple[Frame, ...]
    # For an op inside a coalesced group: the entry that closes the group and carries its state.
    closed_by: Entry | None = None

    @property
    def profiling_name(self) -> str:
        return f"{self.backend}:{self.op}" if self.backend else self.op

    @property
    def is_coalesced_end(self) -> bool:
        """True for the entry that closes a coalesced group (``nccl:coalesced``, ``*_coalesced``)."""
        return closes_coalesced_group(self.op)


def closes_coalesced_group(op: str) -> bool:
    """Whether an op of this name closes a coalesced group (``coalesced``, ``allreduce_coalesced``...)."""
    return op == "coalesced" or op.endswith("_coalesced")


@dataclass(slots=True)
class GroupConfig:
    """What one rank's ``pg_config`` says of one process group."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None  # None when the dump does not say (gloo, or a broken entry)
    # members claimed where there were too many to read (``MAX_GROUP_CLAIM``): ``ranks`` is then None
    claimed: int = 0


_created = itemgetter(Entry._fields.index("time_created_ns"))
_later_times = tuple(itemgetter(Entry._fields.index(name)) for name in ("time_started_ns", "time_completed_ns"))


_group_names = itemgetter(Entry._fields.index("group_name"), Entry._fields.index("group_desc"))


def group_counts(entries: Sequence[tuple[Any, ...]]) -> dict[tuple[str, str], int]:
    """How many of ``entries`` (entries, or rows of Entry's fields) name each (group name, desc)."""
    return dict(Counter(map(_group_names, entries)))


def time_range(entries: Sequence[tuple[Any, ...]]) -> tuple[int, int] | None:
    """The first creation time and the last time of any kind (creation, start, completion) among
    ``entries`` (entries, or rows of Entry's fields); None when there are none."""
    if not entries:
        return None
    # One pass per field, in C: this visits every entry.
    created = list(map(_created, entries))
    last = max(created)
    for getter in _later_times:
        last = max(last, max(filter(None, map(getter, entries)), default=0))
    return min(created), last


@dataclass(slots=True)
class RankColumns:
    """One rank's entries as columns (``read.columns`` says which, and how they are made): each an
    ``array`` of one value per entry, in the order the reader writes them, and the tables (name -> list of
    values) that its id columns index."""

    rank: int
    columns: dict[str, array[Any]]
    tables: dict[str, list[Any]]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()), ()))

    def to_bytes(self) -> bytes:
        """Every column's bytes, then the tables' repr: equal for equal columns (what the tests compare)."""
        return b"".join(column.tobytes() for column in self.columns.values()) + repr(self.tables).encode()


@dataclass(slots=True)
class RankDump:
    """One rank's dump, read and normalised."""

    rank: int
    path: str
    host: str | None
    version: str
    file_format: str  # "pickle" or "json"
    comm_lib_version: str
    # a list, or made from the reader's columns when asked for (``read.columns.EntryRows``): then each
    # access makes new objects, equal to the last ones but not the same
    entries: Sequence[Entry]
    pg_config: dict[str, GroupConfig]
    # pg_status by pg_id: last enqueued, started and completed collective (-1: never).
    pg_status: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    skipped_entries: int = 0
    skipped_reason: str = ""
    # What the reader counted of the entries it read, in the process that read them (None: unknown):
    # the first creation time and the last time of any kind, and group_counts. Whoever changes the
    # entries' times or groups must reset them.
    time_range: tuple[int, int] | None = None
    group_counts: dict[tuple[str, str], int] | None = None
    # groups whose collectives' seqs were renumbered (batches of older PyTorch consumed seqs): there a
    # send's or recv's collective seq is still on the old count
    renumbered_groups: list[str] = field(default_factory=list)

    @property
    def has_timing(self) -> bool:
        """Whether any entry carries start or completion times (NCCL does, gloo never)."""
        if hasattr(self.entries, "distinct"):  # made from columns: read them, make no entry
            times = ("time_started_ns", "time_completed_ns")
            return any(distinct_values(self.entries, name) - {None} for name in times)
        return any(e.time_started_ns is not None or e.time_completed_ns is not None for e in self.entries)

    @property
    def may_have_wrapped(self) -> bool:
        """Whether older history may have been dropped by the ring buffer."""
        return bool(self.entries) and self.entries[0].record_id > 0


@dataclass(frozen=True, slots=True, eq=False)
class Group:
    """A process group of the job, identified by its name plus its member ranks (never by pg_id).

    One object per group of a job, compared by identity: hashing 4096 members per lookup is not free.
    """

    name: str
    desc: str
    members: tuple[int, ...]  # sorted global ranks
    order: int  # position in a stable order shared by every rank
    members_label: str = ""  # the members as ranges, e.g. ``0-7,16``

    @property
    def label(self) -> str:
        """Track name, e.g. ``tp · pg 3 · 8 ranks``."""
        name = self.name if len(self.name) <= 12 else self.name[:10] + "…"
        size = f"{len(self.members)} rank" + ("" if len(self.members) == 1 else "s")
        parts = [self.desc] if self.desc and self.desc != "undefined" else []
        return shown(" · ".join([*parts, f"pg {name}", size]))

    def global_rank(self, local_rank: int) -> int | None:
        """Map a group-local rank (as in ``send 1->0``) to a global rank."""
        if 0 <= local_rank < len(self.members):
            return self.members[local_rank]
        return None


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread of a stack snapshot: its name, its frames innermost first."""

    name: str
    frames: tuple[Frame, ...]
    current: bool = False  # the thread that took the snapshot (faulthandler's "Current thread")


@dataclass(slots=True)
class StackSnapshot:
    """Where each thread of one rank was, at ``time_ns`` (None: unknown), from the file ``source``."""

    rank: int
    time_ns: int | None
    source: str
    threads: list[ThreadStack]


# Kinds of log events.
LOG_WATCHDOG_TIMEOUT, LOG_WATCHDOG_STUCK, LOG_NCCL_ERROR, LOG_CUDA_ERROR, LOG_EXCEPTION, LOG_CHILD_FAILED = (
    "watchdog_timeout", "watchdog_stuck", "nccl_error", "cuda_error", "exception", "child_failed",
)  # fmt: skip
LOG_COMM_FAILURE = "comm_failure"  # a collective or transfer failed because of another rank (a timeout...)
CRASHES = (LOG_NCCL_ERROR, LOG_CUDA_ERROR, LOG_EXCEPTION, LOG_CHILD_FAILED)  # the rank died of it
OWN_ERRORS = (LOG_NCCL_ERROR, LOG_CUDA_ERROR, LOG_EXCEPTION)  # an error of the rank's own, not another's


@dataclass(slots=True)
class LogEvent:
    """A line of a job's log that says what went wrong on a rank."""

    rank: int
    time_ns: int | None  # None: the line has no time
    kind: str  # LOG_*
    line: str  # the line itself (for an exception: the exception line)
    source: str  # file:line number
    details: dict[str, str] = field(default_factory=dict)  # e.g. seq, op, where (the innermost frame)


@dataclass(frozen=True, slots=True)
class LoadProblem:
    """A file that could not be read, or was read only in part."""

    path: str
    reason: str
    fatal: bool = True  # False: the file was read, with this warning

    def __post_init__(self) -> None:
        # a name the OS gave as bytes that are not UTF-8 must still go into every output
        object.__setattr__(self, "path", path_text(self.path))
        object.__setattr__(self, "reason", path_text(self.reason))

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


# Op status, from worst to best for display purposes.
MISSING = "missing"  # some members never issued it
MISMATCH = "mismatch"  # members disagree on op, sizes or dtypes
STUCK = "stuck"  # every member issued it, none completed, some started
INCOMPLETE = "incomplete"  # issued, not completed on some rank (and not the cases above)
OK = "ok"


class EntriesByRank(Mapping[int, list[Entry]]):
    """Each rank's entries in one collective, held as rows: rank -> its entries in the op, made into a list
    when asked for. The matcher files millions of entries; a dict of one-entry lists per op would cost
    about 100 bytes an entry, two arrays of rows cost 8.

    ``ranks`` (ascending, a rank repeated for each of its rows) and ``rows`` (the row of each in that
    rank's entries) are parallel; ``entries`` is every rank's list of entries that the rows index.
    Iterating yields the ranks, each once, in ascending order, as a dict of them would.
    """

    __slots__ = ("_count", "_entries", "_ranks", "_rows", "_several")

    def __init__(
        self, entries: Mapping[int, Sequence[Entry]], ranks: array[int], rows: array[int], distinct: bool = False
    ) -> None:
        self._entries = entries
        self._ranks = ranks
        self._rows = rows
        # some rank holds several rows (a coalesced group): then a rank is found by its first and last row;
        # ``distinct``: the caller knows each rank holds one (every member once, say)
        self._count = len(ranks) if distinct or len(ranks) < 2 else len(set(ranks))  # of ranks, each once
        self._several = self._count < len(ranks)

    def __getitem__(self, rank: int) -> list[Entry]:
        at = bisect_left(self._ranks, rank)
        if at == len(self._ranks) or self._ranks[at] != rank:
            raise KeyError(rank)
        entries = self._entries[rank]
        if not self._several:
            return [entries[self._rows[at]]]
        return [entries[row] for row in self._rows[at : bisect_right(self._ranks, rank, at)]]

    def __contains__(self, rank: object) -> bool:
        if not isinstance(rank, int):
            return False
        at = bisect_left(self._ranks, rank)
        return at < len(self._ranks) and self._ranks[at] == rank

    def __iter__(self) -> Iterator[int]:
        return iter(dict.fromkeys(self._ranks) if self._several else self._ranks)

    def __len__(self) -> int:
        return self._count

    def covers(self, ranks: Sequence[int]) -> bool:
        """Whether every one of ``ranks`` (ascending, each once, as a group's members) holds a part."""
        if not self._several and len(self._ranks) == len(ranks):
            return self._ranks.tolist() == list(ranks)  # both ascending: equal lists, equal sets
        return all(map(self.__contains__, ranks))

    def rows(self) -> Iterator[tuple[int, int]]:
        """(rank, row) of each part's entries, in order: where each is in ``entries_source(rank)``."""
        return zip(self._ranks, self._rows, strict=True)

    def packed(self) -> tuple[bytes, bytes]:
        """The ranks and the rows, as int32 and uint32 bytes (what C reads)."""
        return self._ranks.tobytes(), self._rows.tobytes()

    def entries_source(self, rank: int) -> Sequence[Entry]:
        """The entries of ``rank`` that the rows index."""
        return self._entries[rank]

    @property
    def sources(self) -> Mapping[int, Sequence[Entry]]:
        """Every rank's entries that rows index (the job's: shared by every op)."""
        return self._entries

    def items(self) -> list[tuple[int, list[Entry]]]:  # type: ignore[override]
        """(rank, its entries) in the order of the ranks, as a list (every op's are read by the layout)."""
        if self._several:
            return [(rank, self[rank]) for rank in self]
        # every part one row: made by C-level maps, with no Python call per entry
        heads = map(getitem, map(self._entries.__getitem__, self._ranks), self._rows)
        return list(zip(self._ranks, map(list, zip(heads)), strict=True))

    def values(self) -> list[list[Entry]]:  # type: ignore[override]
        return [entries for _, entries in self.items()]

    def __repr__(self) -> str:
        return repr(dict(self.items()))


@dataclass(slots=True)
class MatchedOp:
    """One logical op of a group: a collective (by seq) or a send/recv pair, across its ranks."""

    group: Group
    kind: str  # "collective" or "p2p"
    seq: int
    # rank -> its entries (several for a coalesced group): a dict, or for a collective ``EntriesByRank``
    entries: Mapping[int, list[Entry]]
    missing: tuple[int, ...] = ()  # members that never issued it
    unknown: tuple[int, ...] = ()  # members with no dump, or whose buffer no longer covers it
    status: str = OK
    mismatch: str = ""  # "op", "size" or "dtype" when status is MISMATCH
    mismatch_ranks: tuple[int, ...] = ()  # the minority that disagrees
    peers: tuple[int, int] | None = None  # p2p: (source, destination) global ranks
    op_key: int = 0  # a number unique to this op in the job, used for flow ids
    name: str = "?"  # the op most of its ranks issued, e.g. ``all_reduce`` (set by the matcher)
    first_time_ns: int = 0  # when the first rank enqueued it, the least of ``enqueued_ns()`` (set by the matcher)
    # In the order of ``entries`` (set by the matcher): when each rank enqueued it (its first entry), for a
    # collective (a send's and recv's: ``enqueued_ns``), and the state of each rank's part (that of its state
    # entry).
    created_ns: Sequence[int] = field(default_factory=list)
    states: Sequence[str] = field(default_factory=list)  # the ops of n ranks that each completed share a tuple
    # a send or recv in a batch (or one a rank sent itself): its ends need not complete together (set by the matcher)
    in_batch: bool = False

    def enqueued_ns(self) -> Sequence[int]:
        """When each rank enqueued the op (its first entry), in the order of ``entries``. A send's and recv's
        times are read from its entries, for the few transfers that are asked: an array of them for each of
        the millions of transfers of a pipeline job would hold 90 bytes a transfer."""
        if self.kind == "p2p":
            return [entries[0].time_created_ns for entries in self.entries.values()]
        return self.created_ns

    @property
    def title(self) -> str:
        """``all_reduce #42`` or ``send 3->5 #7``."""
        return self.title_as(self.name)

    def title_as(self, op_name: str) -> str:
        """The title with another op name: a recv is ``recv 3->5 #7`` on the receiving rank."""
        if self.kind == "p2p" and self.peers:
            return f"{op_name} {self.peers[0]}->{self.peers[1]} #{self.seq}"
        return f"{op_name} #{self.seq}"


def ops_by_key(ops: Sequence[MatchedOp], keys: Iterable[int]) -> dict[int, MatchedOp]:
    """The ops among ``ops`` whose ``op_key`` is one of ``keys``, by key. A map of every op would hold an item
    per op (millions in a pipeline job of thousands of ranks) for the few that findings name."""
    wanted = set(keys)
    return {op.op_key: op for op in ops if op.op_key in wanted}


def entries_at(entries: Sequence[Entry], rows: Sequence[int]) -> list[Entry]:
    """The entries at ``rows`` of a rank's entries: where they are made when asked for
    (``read.columns.EntryRows``), in one call."""
    take = getattr(entries, "rows", None)
    return take(rows) if take is not None else [entries[row] for row in rows]


def distinct_values(entries: Sequence[Entry], field: str) -> set[Any]:
    """The values that one of ``Entry``'s fields takes in ``entries``: from its column, without making the
    entries, where they are made when asked for (``read.columns.EntryRows``)."""
    distinct = getattr(entries, "distinct", None)
    if distinct is not None:
        return distinct(field)  # type: ignore[no-any-return]
    return set(map(attrgetter(field), entries))


def majority_op(entries_by_rank: Mapping[int, list[Entry]]) -> str:
    """The op name most ranks issued (ties: the alphabetically last, so that it is stable)."""
    counts: dict[str, int] = {}
    for entries in entries_by_rank.values():
        op = head_entry(entries).op
        counts[op] = counts.get(op, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return max(counts, key=lambda k: (counts[k], k)) if counts else "?"


def head_entry(entries: list[Entry]) -> Entry:
    """The entry that names a rank's part in an op: the first op of a coalesced group."""
    if len(entries) == 1:
        return entries[0]  # the common case, asked for once per entry of a job
    for entry in entries:
        if not entry.is_coalesced_end:
            return entry
    return entries[0]


def inner_entries(entries: list[Entry]) -> list[Entry]:
    """The ops a rank issued as its part: a coalesced group's ops without its closing entry."""
    return [e for e in entries if not e.is_coalesced_end] or entries


def state_entry(entries: list[Entry]) -> Entry:
    """The entry that carries a rank's state: the closing entry of a coalesced group, if any."""
    last = entries[-1]
    return last.closed_by or last


@dataclass(slots=True)
class Finding:
    """One thing wrong with the job, with the ranks involved and those to blame."""

    kind: str
    group: Group | None
    seq: int
    op: str
    ranks: tuple[int, ...]
    culprit_ranks: tuple[int, ...]
    evidence: list[str]
    summary: str
    time_ns: int
    culprit_frames: tuple[Frame, ...] = ()
    op_keys: tuple[int, ...] = ()  # the matched ops it is about
    # the culprits' stacks where the finding is about them (``diagnose.culprit_stacks``): (ranks, their
    # stack), ranks that share one stack together, in the order of ``culprit_ranks``
    stacks: tuple[tuple[tuple[int, ...], tuple[Frame, ...]], ...] = ()
    window: tuple[int, int] | None = None  # the time it is about, where no op says (stack snapshots)
    lag_ns: int = 0  # a straggler's: how late it enqueues, the median over its ops, behind the median member


# A pg_config claiming more members than this is not read (more ranks than any job runs today): its
# rank list costs the reader only a count of its separators.
MAX_GROUP_CLAIM = 1 << 17
MAX_RANK = 1 << 24  # ranks at or beyond this are refused: no job has them, and they would size tables
# Times read from text (logs, stack snapshots, file times) outside these years are not believed: a
# wrong date in a log must not move the timeline, nor overflow the 64-bit times of the report.
PLAUSIBLE_NS = (631_152_000 * 10**9, 7_258_118_400 * 10**9)  # 1990-01-01 to 2200-01-01, UTC


def plausible_time(ns: int | None) -> int | None:
    """``ns`` if it is a plausible wall-clock time (``PLAUSIBLE_NS``), else None."""
    return ns if ns is not None and PLAUSIBLE_NS[0] <= ns < PLAUSIBLE_NS[1] else None


def ranks_label(ranks: tuple[int, ...] | list[int]) -> str:
    """``[0, 1, 2, 5]`` to ``0-2,5``."""
    parts: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
