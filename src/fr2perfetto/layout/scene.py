"""What a trace draws, whatever its format: tracks of slices, instants and counter values, and the looks
that many slices share. Plain data; the layout (``timeline``, ``streams``, ``looks``) makes it, the
render package writes it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Union

from ..base.model import Entry, Frame

ArgValue = Union[str, int, float, bool, tuple["ArgValue", ...]]  # noqa: UP007 - a recursive alias


class SliceLook:
    """What the slices of one op share on every rank that issued it alike: name, args, flows.

    Built once per op (and per variant, when ranks differ in state or stack), so a writer encodes
    it once for thousands of slices; ``encoded`` is the writer's cache.
    """

    __slots__ = ("args", "callstack", "correlation_id", "encoded", "flow_ids", "name", "timed")

    def __init__(
        self,
        name: str,
        args: tuple[tuple[str, ArgValue], ...],
        flow_ids: tuple[int, ...] = (),
        correlation_id: int | None = None,
        timed: bool = True,
        callstack: tuple[Frame, ...] = (),
    ) -> None:
        self.callstack = callstack  # frames innermost first, shown as the event's callstack
        self.name = name
        self.args = args
        self.flow_ids = flow_ids
        self.correlation_id = correlation_id
        self.timed = timed  # False: the backend records no start or completion (gloo)
        self.encoded: tuple[object, bytes] | None = None  # (writer's token, bytes): set by the Perfetto writer


class Slice(NamedTuple):
    """A slice (start < end) or, when ``end`` is None, an instant.

    ``head`` and ``last``: the rank's entries whose ids and times the slice shows besides its look's
    args (the entry that names the op and the one that carries its state); None for slices that stand
    for no single entry (findings, markers, enqueues, summaries). ``flows``: flows of this slice alone
    besides its look's (the flow from a rank's enqueue of an op to where it ran).

    A tuple, not a dataclass: a conversion makes two per entry, in one C call each (``_speedups``).
    """

    start: int
    end: int | None
    look: SliceLook
    head: Entry | None = None
    last: Entry | None = None
    flows: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.look.name

    @property
    def flow_ids(self) -> tuple[int, ...]:
        return self.look.flow_ids + self.flows if self.flows else self.look.flow_ids

    @property
    def correlation_id(self) -> int | None:
        return self.look.correlation_id

    @property
    def args(self) -> list[tuple[str, ArgValue]]:
        """Every arg: the look's, then the rank's own ids and times."""
        args = list(self.look.args)
        if self.head is not None and self.last is not None:
            args += rank_facts(self.head, self.last, self.look.timed)
        return args


def rank_facts(head: Entry, last: Entry, timed: bool) -> list[tuple[str, ArgValue]]:
    """The facts of one rank's entry that no other slice shares: its ids and times."""
    out: list[tuple[str, ArgValue]] = [
        ("op_id", head.op_id),
        ("record_id", head.record_id),
        ("time_created_ns", head.time_created_ns),
    ]
    if timed:
        out.append(("time_started_ns", last.time_started_ns or "unknown"))
        out.append(("time_completed_ns", last.time_completed_ns or "unknown"))
        out.append(("duration_ms", last.duration_ms if last.duration_ms is not None else "unknown"))
    if head.thread_name or head.thread_id:
        out.append(("thread", thread_label(head)))
    return out


def thread_label(entry: Entry) -> str:
    """``name (id)`` of the thread that issued an entry."""
    return f"{entry.thread_name} ({entry.thread_id})"


@dataclass(slots=True)
class Track:
    """A track: a rank's process, a stream, a thread, a counter; or the Findings track and its children.

    A track's ``slices`` are in start order and either disjoint (written slice by slice) or, where
    ``nested``, nested or holding instants (written in order of time, ends interleaved)."""

    uuid: int
    name: str
    parent: int | None = None
    order: int = 0
    pid: int | None = None  # set on process tracks only
    labels: list[str] = field(default_factory=list)
    description: str = ""
    slices: Sequence[Slice] = field(default_factory=list)  # a list, or records (``rows.SliceRows``)
    nested: bool = False
    counter_unit: str | None = None  # a counter track: ``points`` are its (time, value), in this unit
    counter_share: str = ""  # counters of one key share a y axis across processes
    points: list[tuple[int, float]] = field(default_factory=list)
    enqueues: bool = False  # a thread's track: its instants are enqueues, not markers of a problem


@dataclass(slots=True)
class RankTimeline:
    """One rank's tracks, in the order they are to be written (parents first)."""

    rank: int
    tracks: list[Track]


@dataclass(slots=True)
class TimeSpan:
    """The job's time range: slices that never end are drawn to ``end``."""

    start: int
    end: int
