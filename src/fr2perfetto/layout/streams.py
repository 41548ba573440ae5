"""Lay one rank's ops onto the streams that ran them, the way GPU profilers show work (Nsight Systems,
the PyTorch profiler's Kineto traces): the CPU thread that enqueued on one row, each stream's work on its
own row, in order, never overlapping, and an arrow from each enqueue to what ran.

NCCL runs a group's collectives and its batched sends and recvs on the group's stream
(``getKeyFromDevice``), and each single send or recv on a stream of its pair (``getKeySendRecv``, keyed
by the two ranks), each stream's kernels one after another (``ProcessGroupNCCL.cpp``). So:

- an op's slice on its stream spans what ran: from its start (``time_discovered_started_ns``; where start
  events are off, from when its stream was free, or its enqueue if later) to its completion; slices of
  one stream never overlap;
- the first op of a stream that did not complete holds it: its slice runs to the end of the trace, and
  the ops enqueued behind it, which never started, are instants (``⏸ QUEUED ... (behind ...)``);
- a batch (``batch_isend_irecv``) ran as one NCCL group call: one slice for all its sends and recvs;
- gloo records neither start nor completion: an op spans from its enqueue to the next op's enqueue on
  its group (a group's ops run in order), the last one to the end of the trace unless it retired;
- each enqueue is an instant on the track of the thread that enqueued it, joined by a flow to what ran;
- how late the rank enqueued each collective, against the median of its members on the common clock,
  is a counter: a straggler's line stands above the others'.

Times are shifted onto the common clock here (``offset``: how far the rank's clock runs ahead). Where the
speed-ups are built and a rank's entries are columns (``rows``), the common case (a completed collective
whose look is made, on a stream nothing holds) is laid out by ``_speedups.lay_out_rows``, exactly as
``_group`` here would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from ..base.model import COMPLETED, INCOMPLETE, MISSING, STUCK, Entry, Group, MatchedOp, head_entry
from ..base.speedups import SPEEDUPS as _speedups
from ..match.ops import NO_COMPLETION_BACKENDS
from .looks import LATENESS_STEP_MS, Looks
from .rows import RankItems, RankRows, SliceRows
from .scene import Slice

# An op's cross-rank flow is its op key (below 2**32), a finding's timeline.FINDING_FLOW_BASE + its
# number, a launch's this plus the rank and the op key.
LAUNCH_FLOW_BASE = 1 << 60
GLOO_MIN_NS = 1_000  # a gloo op that retired with nothing after it: drawn this long
_new_slice = tuple.__new__  # Slice is a tuple: made in one C call
_start = itemgetter(0)  # a slice's start

StreamKey = tuple[Group, int | None]  # (group, peer): peer None for the group's own stream


@dataclass(slots=True)
class Stream:
    """What ran on one stream of a rank, as it is laid out."""

    slices: list[Slice] | SliceRows = field(default_factory=list)  # in start order
    free: int = 0  # when what ran last on it completed
    holder: MatchedOp | None = None  # the first op on it that did not complete
    holder_start: int = 0
    inner_free: int = 0  # within the holder: when the last op drawn inside it completed
    nested: bool = False  # slices nest, or instants fall inside them


@dataclass(slots=True)
class RankLayout:
    """One rank's ops, laid out: what ran on each stream, its enqueues per thread, its lateness."""

    streams: dict[StreamKey, Stream] = field(default_factory=dict)
    # (thread id, name) -> its instants
    enqueues: dict[tuple[str, str], list[Slice] | SliceRows] = field(default_factory=dict)
    # group -> (time, ms late) of its collectives, where the lateness changed
    lateness: dict[Group, list[tuple[int, float]]] = field(default_factory=dict)


@dataclass(slots=True)
class _Rank:
    """What laying out one rank's ops carries from op to op."""

    rank: int
    looks: Looks
    end: int  # the end of the trace, on this rank's clock as drawn
    offset: int
    launch_base: int  # launch flows of this rank: this plus the op key
    layout: RankLayout
    thread: tuple[object, object] = (None, None)  # the thread of the last enqueue (none yet), and its instants
    instants: list[Slice] | SliceRows = field(default_factory=list)
    rows: RankRows | None = None  # laid out from rows: what the C layout reads of the rank
    entries: Sequence[Entry] = ()  # the rank's entries, which rows index
    row: int = -1  # laid out from rows: the row of the rank's one entry in the op laid out (-1: none)

    def new_slices(self) -> list[Slice] | SliceRows:
        """An empty track's slices: records where the rank is laid out from rows."""
        return [] if self.rows is None else SliceRows(self.rows.job.table, self.entries)


def lay_out(
    rank: int,
    items: list[tuple[MatchedOp, list[Entry]]],
    end_of_trace: int,
    looks: Looks,
    free_from: dict[Group, int] | None = None,
    offset: int = 0,
) -> RankLayout:
    """Lay ``items`` (a rank's ops with its entries for them; none: it never issued the op the others
    entered) onto streams and threads, shifted by ``offset``. ``free_from``: per group, before when
    nothing is drawn (where older history is folded into a summary)."""
    layout = RankLayout()
    state = _Rank(rank, looks, end_of_trace - offset, offset, LAUNCH_FLOW_BASE + (rank << 32), layout)
    by_group, unordered = _by_group(items)
    for group, group_items in by_group.items():
        if group in unordered:
            group_items.sort(key=start_on_rank)
        free = (free_from or {}).get(group, 0) - offset
        _group(state, group, group_items, free)
    _sort_enqueues(layout)
    return layout


def lay_out_rows(
    rank: int,
    groups: list[tuple[Group, RankItems]],
    end_of_trace: int,
    looks: Looks,
    rows: RankRows,
    entries: Sequence[Entry],
    offset: int = 0,
) -> RankLayout:
    """``lay_out`` of a rank's items held as rows (``rows.JobRows.rank_groups``: every group shown, nothing
    folded), its slices as records (``SliceRows``), the common op laid out by ``_speedups.lay_out_rows``."""
    layout = RankLayout()
    state = _Rank(rank, looks, end_of_trace - offset, offset, LAUNCH_FLOW_BASE + (rank << 32), layout, rows=rows,
                  entries=entries)  # fmt: skip
    state.instants = state.new_slices()
    for group, items in groups:
        _group(state, group, items, -offset)
    _sort_enqueues(layout)
    return layout


def _sort_enqueues(layout: RankLayout) -> None:
    for instants in layout.enqueues.values():  # laid out group by group: each group's in order
        if isinstance(instants, SliceRows):
            instants.sort_by_start()
        else:
            instants.sort(key=_start)


def _by_group(
    items: list[tuple[MatchedOp, list[Entry]]],
) -> tuple[dict[Group, list[tuple[MatchedOp, list[Entry]]]], set[Group]]:
    """A rank's ops by group, in the order given, and the groups whose ops are not in the order the rank
    enqueued them. The job's order (by when the first rank enqueued each op) is that order already,
    but for sends and recvs, whose first enqueue may be the peer's."""
    by_group: dict[Group, list[tuple[MatchedOp, list[Entry]]]] = {}
    last: dict[Group, int] = {}
    unordered: set[Group] = set()
    for item in items:
        op, entries = item
        group = op.group
        created = entries[0].time_created_ns if entries else op.first_time_ns
        found = by_group.get(group)
        if found is None:
            by_group[group] = [item]
        else:
            found.append(item)
            if created < last[group]:
                unordered.add(group)
        last[group] = created
    return by_group, unordered


def start_on_rank(item: tuple[MatchedOp, list[Entry]]) -> int:
    """When a rank's part in an op (an ``ops_by_rank`` item) begins: its first entry's creation,
    or, for a rank that never issued it, when the first rank did."""
    op, entries = item
    return entries[0].time_created_ns if entries else op.first_time_ns


def _group(state: _Rank, group: Group, items: Sequence[tuple[MatchedOp, list[Entry]]], free: int) -> None:
    """One group's ops, in the order the rank enqueued them."""
    streams = state.layout.streams
    main = streams[(group, None)] = Stream(slices=state.new_slices(), free=free)
    points = state.layout.lateness[group] = []  # the counter's value, where it changes
    late = -1.0
    batches: dict[Entry, tuple[int, Stream, list[tuple[MatchedOp, str]]]] = {}  # closing entry -> (slice, stream, ops)
    gloo: list[object] = []  # the gloo slice still open to the next op's enqueue: its stream and its parts
    position, count = 0, len(items)
    while position < count:
        if state.rows is not None and _speedups is not None and main.holder is None and not gloo:
            assert isinstance(items, RankItems) and isinstance(main.slices, SliceRows)
            position, main.free, late = _speedups.lay_out_rows(
                items.packed, position, main.free, late, main.slices.records, _rows_context(state, group, points)
            )
            if position == count:
                break
        op, entries = items[position]
        if state.rows is not None:
            assert isinstance(items, RankItems)
            state.row = items.row(position)
        position += 1
        if not entries:  # never issued: a marker where the others entered it
            marker = state.looks.never_issued(op)
            main.slices.append(marker._replace(start=marker.start - state.offset))
            main.nested = True
            continue
        head = entries[0] if len(entries) == 1 else head_entry(entries)
        last = entries[-1].closed_by or entries[-1]
        created = entries[0].time_created_ns - state.offset
        batch = head.closed_by if op.kind == "p2p" else None
        stream = main
        if op.kind == "p2p" and batch is None and op.peers:
            key = (group, _peer(op, state.rank))
            stream = streams.get(key) or streams.setdefault(key, Stream(slices=state.new_slices(), free=free))
        joined = batches.get(batch) if batch is not None else None
        flow = state.launch_base + (op.op_key if joined is None else joined[2][0][0].op_key)
        _enqueued(state, op, head, created, flow)
        if joined is not None:  # another send or recv of a batch already laid out: it ran with it
            joined[2].append((op, head.op))
            continue
        if op.kind == "collective":
            value = state.looks.lateness(op, created + state.offset)
            if value is not None and value != late:
                points.append((created, value))
                late = value
        if last.backend in NO_COMPLETION_BACKENDS and last.time_started_ns is None and last.time_completed_ns is None:
            _gloo(state, stream, op, entries, head, last, created, flow, gloo)
        else:
            if gloo:
                _close_gloo(gloo, created)
            _ran(state, stream, op, entries, head, last, created, flow)
        if batch is not None:
            batches[batch] = (len(stream.slices) - 1, stream, [(op, head.op)])
    if gloo:
        _close_gloo(gloo, None)
    for index, stream, ops in batches.values():
        if len(ops) > 1:
            item = stream.slices[index]
            stream.slices[index] = item._replace(look=state.looks.batch(ops, item.look))


def _rows_context(state: _Rank, group: Group, points: list[tuple[int, float]]) -> tuple[object, ...]:
    """What ``_speedups.lay_out_rows`` reads (its docstring says the order), as the rank's layout stands."""
    rows, looks = state.rows, state.looks
    assert rows is not None and isinstance(state.instants, SliceRows)
    thread = rows.threads.get(state.thread, -1)
    return (rows.columns, rows.look_columns, rows.job.op_keys, rows.job.op_kinds, rows.job.cache, state.offset,
            state.launch_base, points, thread, state.instants.records, rows.roles, LATENESS_STEP_MS, rows.prepare,
            looks.lateness_offset(group))  # fmt: skip


def _peer(op: MatchedOp, rank: int) -> int:
    """The other end of a send or recv (global rank)."""
    source, destination = op.peers  # type: ignore[misc]
    return destination if source == rank else source


def _enqueued(state: _Rank, op: MatchedOp, head: Entry, created: int, flow: int) -> None:
    thread = (head.thread_id, head.thread_name)
    if thread != state.thread:
        state.thread = thread
        instants = state.layout.enqueues.get(thread)
        if instants is None:
            instants = state.layout.enqueues[thread] = state.new_slices()
        state.instants = instants
    state.instants.append(_new_slice(Slice, (created, None, state.looks.enqueue(op, head), None, None, (flow,))))


def _ran(
    state: _Rank, stream: Stream, op: MatchedOp, entries: list[Entry], head: Entry, last: Entry, created: int,
    flow: int,
) -> None:  # fmt: skip
    """What ran of ``op`` on a stream that records completion (NCCL), or, behind the op that holds the
    stream, the instant of an op that never started."""
    looks, offset = state.looks, state.offset
    completed = last.time_completed_ns - offset if last.time_completed_ns else None
    start = last.time_started_ns - offset if last.time_started_ns else created
    if stream.holder is None:
        if start < stream.free:
            start = stream.free
        if completed is not None:
            end = completed if completed > start else start + 1
            stream.free = end
            _add(state, stream, _new_slice(Slice, (start, end, looks.ran(op, entries, head, last), head, last,
                                                   (flow,))))  # fmt: skip
        else:  # the first op of the stream that did not complete: it holds the stream
            _add(state, stream, _new_slice(Slice, (start, state.end, looks.holds(op, entries, head, last), head, last,
                                                   (flow,))))  # fmt: skip
            stream.holder, stream.holder_start, stream.inner_free = op, start, start
        return
    stream.nested = True
    if completed is not None:  # completed behind one that did not: not on the stream assumed; drawn inside
        start = max(start, stream.inner_free, stream.holder_start)
        end = min(max(completed, start + 1), state.end)
        stream.inner_free = end
        _add(state, stream, _new_slice(Slice, (start, end, looks.ran(op, entries, head, last), head, last, (flow,))))
    else:
        look = looks.queued(op, head, stream.holder)
        stream.slices.append(_new_slice(Slice, (created, None, look, head, last, (flow,))))


def _add(state: _Rank, stream: Stream, item: Slice) -> None:
    """Add a slice of the op laid out to its stream: as a record, where the rank is laid out from rows and one
    can stand for it (``SliceRows.append``)."""
    if isinstance(stream.slices, SliceRows):
        stream.slices.append(item, state.row)
    else:
        stream.slices.append(item)


def _gloo(
    state: _Rank, stream: Stream, op: MatchedOp, entries: list[Entry], head: Entry, last: Entry, created: int,
    flow: int, gloo: list[object],
) -> None:  # fmt: skip
    """gloo: from the op's enqueue to the next op's on its group; the last one to the end of the trace
    unless it retired (or its status says it completed everywhere)."""
    if gloo:
        _close_gloo(gloo, created)
    start = created if created > stream.free else stream.free
    status = op.status
    never_ends = status in (MISSING, STUCK) or (status == INCOMPLETE and last.state != COMPLETED) or not last.retired
    gloo[:] = [stream, start, state.end if never_ends else start + GLOO_MIN_NS, state.looks.ran(op, entries, head,
               last), head, last, (flow,)]  # fmt: skip


def _close_gloo(gloo: list[object], next_start: int | None) -> None:
    """Draw the open gloo slice: to the next op's enqueue on its group (``next_start``), else as planned."""
    stream, start, end, look, head, last, flows = gloo
    if next_start is not None:
        end = next_start if next_start > start else start + GLOO_MIN_NS  # type: ignore[operator]
    stream.slices.append(_new_slice(Slice, (start, end, look, head, last, flows)))  # type: ignore[attr-defined]
    stream.free = end  # type: ignore[attr-defined]
    gloo.clear()
