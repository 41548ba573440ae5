"""Lay a matched job out on a timeline: tracks, slices, markers and flows, for any trace format.

Pure functions from (job, matched ops, findings) to ``Timeline`` objects; the renderers only write
them out. One rank at a time (``rank_tracks``) so that a writer can stream a large job.
"""

from __future__ import annotations

import functools
import heapq
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Union

from .fold import View, full_view
from .job import Job
from .match import NO_COMPLETION_BACKENDS, tracks_completion
from .model import (
    COMPLETED,
    INCOMPLETE,
    MISMATCH,
    MISSING,
    OK,
    STUCK,
    Entry,
    Finding,
    Frame,
    Group,
    MatchedOp,
    head_entry,
    ranks_label,
    state_entry,
    time_range,
)
from .speedups import SPEEDUPS as _speedups
from .text import shown


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


ArgValue = Union[str, int, float, bool, tuple["ArgValue", ...]]  # noqa: UP007 - a recursive alias

# Name prefixes that make a problem stand out in the timeline (and in a search box).
PREFIX = {
    MISSING: "⚠ UNMATCHED ",
    MISMATCH: "⚠ MISMATCH ",
    STUCK: "⏳ STUCK ",
    INCOMPLETE: "⏳ NOT COMPLETED ",
}
NEVER_ISSUED = "✗ NEVER ISSUED "
VICTIM = "⛓ VICTIM "  # a rank blocked in the op by another, or queued behind its own blocked op
GLOO_TIMING = "not recorded: this backend records enqueue time only; the slice spans to the next op on this group"
FINDINGS_UUID = 1
FINDING_FLOW_BASE = 1 << 48  # flow ids of findings, far above those of ops (their op keys)
PID_BASE = 100_000  # pid 0 means the idle process to trace tools, so ranks get pids from here


@dataclass(slots=True)
class Slice:
    """A slice (start < end) or, when ``end`` is None, an instant marker.

    ``head`` and ``last``: the rank's entries whose ids and times the slice shows besides its
    look's args (the entry that names the op and the one that carries its state); None for
    slices that stand for no single entry (findings, markers, summaries).
    """

    start: int
    end: int | None
    look: SliceLook
    head: Entry | None = None
    last: Entry | None = None

    @property
    def name(self) -> str:
        return self.look.name

    @property
    def flow_ids(self) -> tuple[int, ...]:
        return self.look.flow_ids

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
    """A track: a rank's process track, a group track under it, or a lane under a group track."""

    uuid: int
    name: str
    parent: int | None = None
    order: int = 0
    pid: int | None = None  # set on process tracks only
    labels: list[str] = field(default_factory=list)
    description: str = ""
    slices: list[Slice] = field(default_factory=list)


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


def time_span(job: Job) -> TimeSpan:
    """First and last timestamps of any entry, with a margin after the last one; stack snapshots and log
    events taken after the dumps' last entry (within a day of it) stretch it, so that they are on the
    timeline and an op that never completed runs past them."""
    ranges = [dump.time_range or time_range(dump.entries) for dump in job.dumps.values()]
    known = [r for r in ranges if r is not None]
    if not known:
        return TimeSpan(0, 1_000_000)
    first, last = min(r[0] for r in known), max(r[1] for r in known)
    beside = [s.time_ns for taken in job.snapshots.values() for s in taken] + [e.time_ns for e in job.log_events]
    last = max([last, *(t for t in beside if t is not None and last < t < last + NOTE_WINDOW_NS)])
    margin = max((last - first) // 20, 1_000_000)
    return TimeSpan(first, last + margin)


def rank_uuid(rank: int) -> int:
    """A process track's uuid; its child tracks take the numbers just above it."""
    return (rank + 1) << 32


def ops_by_rank(ops: list[MatchedOp], ranks: set[int] | None = None) -> dict[int, list[tuple[MatchedOp, list[Entry]]]]:
    """Index ops by the ranks that hold entries for them (or should have: missing ranks)."""
    index: dict[int, list[tuple[MatchedOp, list[Entry]]]] = {}
    for op in ops:
        if ranks is not None and len(ranks) < len(op.entries):
            for rank in ranks:
                entries = op.entries.get(rank)
                if entries is not None:
                    index.setdefault(rank, []).append((op, entries))
        else:
            for rank, entries in op.entries.items():
                if ranks is None or rank in ranks:
                    index.setdefault(rank, []).append((op, entries))
        for rank in op.missing:
            if ranks is None or rank in ranks:
                index.setdefault(rank, []).append((op, []))
    return index


@dataclass(slots=True)
class Highlights:
    """What the diagnosis adds to the ranks' tracks: culprit labels and flows from findings to ops."""

    culprits: dict[int, str] = field(default_factory=dict)  # rank -> why it is to blame
    # (rank, op key) -> a rank's part in an op it is blocked in or queued in, not being its culprit
    roles: dict[tuple[int, int], str] = field(default_factory=dict)
    clock_offsets: dict[int, int] = field(default_factory=dict)  # rank -> ns its clock runs ahead (subtracted)
    # rank -> instants of what was found beside the dumps: its stack snapshot, its log events
    rank_notes: dict[int, list[Slice]] = field(default_factory=dict)
    # rank without a dump -> (when the others began to wait for it, in what)
    no_dump_waits: dict[int, tuple[int, str]] = field(default_factory=dict)
    finding_flows: dict[int, list[int]] = field(default_factory=dict)  # op key -> flow ids of findings
    # rank -> flow ids of the findings about it that no op stands for (its stack snapshots do)
    rank_flows: dict[int, list[int]] = field(default_factory=dict)
    # op key -> (slices, markers) drawn for it, when a folded view draws fewer than the job has
    drawn: dict[int, tuple[int, int]] | None = None
    # looks already built, by op and the facts of a rank's entries that go into them (see look_key)
    looks: dict[tuple[object, ...], SliceLook] = field(default_factory=dict)
    # op key -> the entry the C layout last gave a look from ``looks``, and that look: the next rank
    # whose entry agrees with it on every field of look_key needs no key made (see _speedups.c)
    last_looks: dict[int, tuple[Entry, SliceLook]] = field(default_factory=dict)


def start_on_rank(item: tuple[MatchedOp, list[Entry]]) -> int:
    """When a rank's part in an op (an ``ops_by_rank`` item) begins: its first entry's creation,
    or, for a rank that never issued it, when the first rank did."""
    op, entries = item
    return entries[0].time_created_ns if entries else op.first_time_ns


def drawn_counts(ops_index: dict[int, list[tuple[MatchedOp, list[Entry]]]], view: View) -> dict[int, tuple[int, int]]:
    """Per op key, the (slices, markers) a folded ``view`` draws: one per shown rank that has it."""
    counts: dict[int, tuple[int, int]] = {}
    for rank, _ in view.processes:
        for item in ops_index.get(rank, ()):
            op, entries = item
            if view.groups is not None and op.group not in view.groups:
                continue
            if start_on_rank(item) >= view.cutoffs.get(op.group, -1):
                slices, markers = counts.get(op.op_key, (0, 0))
                counts[op.op_key] = (slices + 1, markers) if entries else (slices, markers + 1)
    return counts


def rank_timelines(
    job: Job,
    index: dict[int, list[tuple[MatchedOp, list[Entry]]]],
    span: TimeSpan,
    highlights: Highlights | None = None,
    view: View | None = None,
) -> Iterator[RankTimeline]:
    """Yield each shown rank's timeline in rank order, built only when asked for.

    ``index`` is ``ops_by_rank`` of the job's ops (for the shown ranks at least).
    """
    view = view or full_view(job)
    highlights = highlights or Highlights()
    for rank, stands_for in view.processes:
        yield rank_timeline(job, rank, index.get(rank, []), span, highlights, stands_for, view)


def rank_timeline(
    job: Job,
    rank: int,
    rank_ops: list[tuple[MatchedOp, list[Entry]]],
    span: TimeSpan,
    highlights: Highlights,
    stands_for: tuple[int, ...] = (),
    view: View | None = None,
) -> RankTimeline:
    """The tracks of one rank: its process, one track per group it belongs to, lanes as needed.

    A folded process stands for several ranks with the same ops; history before a group's cutoff
    is one summary slice.
    """
    dump = job.dumps.get(rank)
    process_uuid = rank_uuid(rank)
    labels = []
    if len(stands_for) > 1:
        labels.append(f"stands for {len(stands_for)} ranks: {ranks_label(stands_for)}")
    culprit = highlights.culprits.get(rank)
    if culprit:
        labels.append(f"CULPRIT: {culprit}")
    offset = highlights.clock_offsets.get(rank, 0)
    if offset:
        labels.append(f"clock {offset / 1e6:+.1f} ms: shown aligned (raw times in args)")
    if dump is None:
        labels.append("no dump")
    else:
        if dump.host:
            labels.append(shown(dump.host))
        labels.append(shown(os.path.basename(dump.path)))
    # The UI shows a process's name (and pid), never its labels: what must be seen goes in the name.
    name = f"rank {rank}" if len(stands_for) <= 1 else f"ranks {ranks_label(stands_for)} ({len(stands_for)})"
    if culprit:
        name += " · CULPRIT"
    elif dump is None:
        name += " · no dump"
    process = Track(
        uuid=process_uuid,
        name=name,
        pid=PID_BASE + rank,
        order=rank,  # processes in rank order (a folded one by its first rank)
        labels=labels,
        description=shown(f"dump {dump.path} (version {dump.version}, {dump.file_format})")
        if dump
        else "this rank left no dump",
    )
    shown_groups = view.groups if view is not None else None
    cutoffs = view.cutoffs if view is not None else {}
    by_group: dict[Group, list[Slice]] = {
        g: [] for g in job.groups_of_rank(rank) if shown_groups is None or g in shown_groups
    }
    per_group_ops: dict[Group, list[tuple[MatchedOp, list[Entry]]]] = {}
    folded: dict[Group, list[int]] = {}
    if shown_groups is None and not cutoffs:  # the whole history of every group: nothing to leave out
        for item in rank_ops:
            group = item[0].group
            ops_of_group = per_group_ops.get(group)
            if ops_of_group is None:
                per_group_ops[group] = [item]
            else:
                ops_of_group.append(item)
    else:
        for item in rank_ops:
            op = item[0]
            if shown_groups is not None and op.group not in shown_groups:
                continue
            start = start_on_rank(item)
            if start < cutoffs.get(op.group, -1):
                folded.setdefault(op.group, []).append(start)
                continue
            per_group_ops.setdefault(op.group, []).append(item)
    for group, items in per_group_ops.items():
        by_group[group] = _group_slices(items, span, highlights, rank)
    for group, starts in folded.items():
        summary = Slice(
            min(starts),
            max(cutoffs[group], min(starts) + 1),
            SliceLook(
                f"… {len(starts)} earlier ops (folded)",
                (("folded_ops", len(starts)), ("how_to_see_them", "convert again with --full, or a larger --window")),
            ),
        )
        by_group.setdefault(group, []).insert(0, summary)
    if offset:
        # On the job's common clock (``clocks``); the args keep the times this rank recorded.
        for slices in by_group.values():
            for item in slices:
                item.start -= offset
                if item.end is not None:
                    item.end -= offset
    notes = [replace(n, start=n.start - offset) for n in highlights.rank_notes.get(rank, ())]
    tracks = [process]
    if dump is None:  # the UI shows only tracks with events: a rank without a dump shows through this one
        start, what = highlights.no_dump_waits.get(rank, (span.start, ""))
        title = shown(f"no dump: the others wait for it in {what}") if what else "no dump from this rank"
        look = SliceLook(title, (("status", "this rank left no dump"),))
        tracks.append(Track(process_uuid + len(tracks), "no dump", parent=process_uuid, order=-2,
                            slices=[Slice(start, max(span.end, start + 1), look)]))  # fmt: skip
    if notes:
        what = "where the rank's threads were (stack snapshot) and what its log says"
        tracks.append(Track(process_uuid + len(tracks), "stack & logs", parent=process_uuid, order=-1, slices=notes,
                            description=what))  # fmt: skip
    for group, slices in sorted(by_group.items(), key=lambda kv: kv[0].order):
        group_uuid = process_uuid + len(tracks)
        lanes = assign_lanes(slices)
        members = group.members_label
        description = shown(f"process group {group.name} ({group.desc or 'no description'}), members {members}")
        tracks.append(
            Track(
                group_uuid,
                group.label,
                parent=process_uuid,
                order=group.order,
                description=description,
                slices=lanes[0] if lanes else [],
            )
        )
        for number, lane in enumerate(lanes[1:], start=2):
            tracks.append(
                Track(process_uuid + len(tracks), f"lane {number}", parent=group_uuid, order=number, slices=lane)
            )
    return RankTimeline(rank, tracks)


def _group_slices(
    items: list[tuple[MatchedOp, list[Entry]]], span: TimeSpan, highlights: Highlights, rank: int
) -> list[Slice]:
    """Slices (and markers) of one rank on one group track, in time order."""
    items.sort(key=start_on_rank)
    starts = [entries[0].time_created_ns for _, entries in items if entries]
    slices: list[Slice] = []
    position, count = 0, len(items)
    issued = 0  # items with entries laid out so far
    while position < count:
        if _speedups is not None:
            # C lays out the common items (one entry, completed, look known) as _op_slice would
            done = _speedups.group_slices(
                items, position, highlights.looks, highlights.last_looks, Slice, slices, *_C_LOOK_FIELDS
            )
            issued += done - position  # every item it laid out had an entry
            position = done
            if position == count:
                break
        op, entries = items[position]
        position += 1
        if not entries:
            slices.append(_never_issued_marker(op, highlights))
            continue
        issued += 1
        next_start = starts[issued] if issued < len(starts) else None
        role = highlights.roles.get((rank, op.op_key)) if highlights.roles else None
        slices.append(_op_slice(op, entries, next_start, span.end, highlights, role))
    return slices


def _op_slice(
    op: MatchedOp,
    entries: list[Entry],
    next_start: int | None,
    end_of_trace: int,
    highlights: Highlights,
    role: str | None = None,
) -> Slice:
    """A rank's slice for ``op``; ``next_start``: when its next op on the group began (None: last);
    ``role``: the rank's part in it where it is a victim (an op that never completed: never the C
    layout's, which takes completed ones only)."""
    start = entries[0].time_created_ns
    head, last = head_entry(entries), state_entry(entries)
    if last.time_completed_ns:
        end = last.time_completed_ns
    else:
        status = op.status
        if (
            status in (MISSING, STUCK) or (status == INCOMPLETE and last.state != COMPLETED)
            or tracks_completion(last) or (next_start is None and not last.retired)
        ):  # fmt: skip
            end = end_of_trace  # it never completed: draw it to the end of the trace
        else:
            # No completion time is recorded (gloo); the rank went on to its next op on this group.
            end = next_start if next_start is not None and next_start > start else start + 1_000
    if end <= start:
        end = start + 1
    key: tuple[object, ...] = look_key(op, entries, head, last)
    if role is not None:
        key = (key, role)
    look = highlights.looks.get(key)
    if look is None:
        look = highlights.looks[key] = op_look(op, entries, head, last, highlights, role)
    return Slice(start, end, look, head, last)


# Every field of a rank's head and state entries that op_look and _shared_args read: ranks whose
# entries agree on these (and on the rest of look_key) share one look. A field they come to read
# must be added here.
LOOK_HEAD_FIELDS = (
    "op", "backend", "collective_seq", "p2p_seq", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes",
    "frames",
)  # fmt: skip
LOOK_LAST_FIELDS = ("state", "retired", "timeout_ms", "backend")
_look_head = attrgetter(*LOOK_HEAD_FIELDS)
_look_last = attrgetter(*LOOK_LAST_FIELDS)
# Where the C layout finds them, and the creation, start and completion times and closed_by.
_C_LOOK_FIELDS = tuple(
    tuple(map(Entry._fields.index, names))
    for names in (("time_created_ns", "time_started_ns", "time_completed_ns", "closed_by"), LOOK_HEAD_FIELDS,
                  LOOK_LAST_FIELDS)
)  # fmt: skip


def look_key(op: MatchedOp, entries: list[Entry], head: Entry, last: Entry) -> tuple[object, ...]:
    """What decides the look of a rank's slice for ``op`` (see LOOK_HEAD_FIELDS)."""
    return (
        op.op_key, _look_head(head), _look_last(last), last.time_started_ns is None,
        last.time_completed_ns is None, head.closed_by is not None,
        tuple(e.profiling_name for e in entries) if len(entries) > 1 else None,
    )  # fmt: skip


def op_look(
    op: MatchedOp, entries: list[Entry], head: Entry, last: Entry, highlights: Highlights, role: str | None = None
) -> SliceLook:
    """The look of a rank's slice for ``op``: its name, the facts the op's ranks share, its flows.

    The caller keys it by ``look_key``, so that the ranks that issued an op alike share one look.
    """
    gloo = last.backend in NO_COMPLETION_BACKENDS and last.time_started_ns is None and last.time_completed_ns is None
    status = op.status
    name = op.title_as(head.op) if op.kind == "p2p" else op.title
    if status != OK and (status != INCOMPLETE or last.state != COMPLETED):
        prefix = PREFIX.get(status, "")
        if status == MISMATCH:
            prefix = f"{prefix}({op.mismatch}) "
        name = prefix + name
    if role is not None:
        name = VICTIM + name
    name = shown(name)  # op names come from the dump; args keep them as they were
    drawn = highlights.drawn
    # An op's flow needs two drawn slices.
    shared = len(op.entries) > 1 if drawn is None else drawn.get(op.op_key, (0, 0))[0] > 1
    flows = ((op.op_key,) if shared else ()) + tuple(highlights.finding_flows.get(op.op_key, ()))
    args = tuple(_shared_args(op, entries, head, last, gloo)) + ((("role", role),) if role is not None else ())
    return SliceLook(name, args, flows, op.op_key if shared else None, timed=not gloo)


def findings_tracks(
    findings: list[Finding],
    span: TimeSpan,
    drawn: dict[int, tuple[int, int]] | None = None,
    roles: dict[tuple[int, int], str] | None = None,
    clock_offsets: dict[int, int] | None = None,
    snapshot_ranks: set[int] | frozenset[int] = frozenset(),
) -> tuple[list[Track], Highlights]:
    """A ``Findings`` track above all ranks, a slice per finding, and the highlights they imply.

    Each finding gets its own child track (they all run to the end of the trace) and a flow to
    every op it is about (a finding no op stands for: to its culprits' newest stack snapshots, of the
    drawn ranks with snapshots, ``snapshot_ranks``). ``roles`` marks victims' slices; ``clock_offsets``
    (rank -> ns its clock runs ahead) are subtracted from its slices' times, and said so on the tracks.
    """
    description = "what fr2perfetto analyze found, strongest first. Times: " + (
        f"each rank's wall clock, aligned across hosts by the offsets estimated from completion times "
        f"({len(clock_offsets)} ranks shifted, by {min(clock_offsets.values()) / 1e6:+.1f} to "
        f"{max(clock_offsets.values()) / 1e6:+.1f} ms; each slice's args keep the times the rank recorded)"
        if clock_offsets
        else "each rank's wall clock as recorded (no clock offset to apply)"
    )
    parent = Track(FINDINGS_UUID, "Findings", order=-1, description=description)
    tracks = [parent]
    highlights = Highlights(drawn=drawn, roles=roles or {}, clock_offsets=clock_offsets or {})
    for number, finding in enumerate(findings, start=1):
        flow = FINDING_FLOW_BASE + number
        start = max(span.start, (finding.time_ns or span.start) - 1)
        args: list[tuple[str, ArgValue]] = [
            ("kind", finding.kind),
            ("summary", finding.summary),
            ("culprit_ranks", ranks_label(finding.culprit_ranks) or "none"),
            ("ranks", ranks_label(finding.ranks)),
            ("evidence", tuple(finding.evidence)),
        ]
        if finding.group is not None:
            args += [
                ("group", finding.group.name),
                ("group_desc", finding.group.desc),
                ("group_ranks", finding.group.members_label or ranks_label(finding.group.members)),
            ]
        if finding.op:
            args += [("op", finding.op), ("seq", finding.seq)]
        if finding.culprit_frames:
            args.append(("culprit_stack", stack_strings(finding.culprit_frames)))
        shown_keys = [k for k in finding.op_keys if drawn is None or drawn.get(k)]
        for key in shown_keys:
            highlights.finding_flows.setdefault(key, []).append(flow)
        # a finding no op stands for points at where its culprits are: their newest stack snapshots
        by_stacks = [r for r in finding.culprit_ranks if r in snapshot_ranks] if not finding.op_keys else []
        for rank in by_stacks:
            highlights.rank_flows.setdefault(rank, []).append(flow)
        flows = (flow,) if shown_keys or by_stacks else ()
        look = SliceLook(shown(f"{finding.kind}: {finding.summary}"), tuple(args), flows)
        item = Slice(start, span.end, look)
        tracks.append(
            Track(
                FINDINGS_UUID + number, f"{number}. {finding.kind}", parent=FINDINGS_UUID, order=number, slices=[item]
            )
        )
        for rank in finding.culprit_ranks:
            highlights.culprits.setdefault(rank, finding.kind)
        if finding.kind == "no_dump" and finding.op and finding.group is not None:
            what = f"{finding.op} #{finding.seq} of {finding.group.desc or 'pg ' + finding.group.name}"
            for rank in finding.ranks:
                highlights.no_dump_waits.setdefault(rank, (start, what))
    return tracks, highlights


def _never_issued_marker(op: MatchedOp, highlights: Highlights) -> Slice:
    others = ranks_label([r for r in op.entries])
    args: tuple[tuple[str, ArgValue], ...] = (
        ("status", "this rank never issued the op that the others entered here"),
        ("group", op.group.label),
        ("collective_seq_id" if op.kind == "collective" else "p2p_seq_id", op.seq),
        ("issued_by_ranks", others),
    )
    flows = tuple(highlights.finding_flows.get(op.op_key, ()))
    return Slice(op.first_time_ns, None, SliceLook(shown(NEVER_ISSUED + op.title), args, flows, op.op_key))


def _shared_args(
    op: MatchedOp, entries: list[Entry], head: Entry, last: Entry, gloo: bool
) -> list[tuple[str, ArgValue]]:
    shared: list[tuple[str, ArgValue]] = [
        ("status", op.status),
        ("group", op.group.name),  # its members are in the track's description
        ("group_desc", op.group.desc),
        ("collective_seq_id", head.collective_seq),
        ("p2p_seq_id", head.p2p_seq),
        ("profiling_name", head.profiling_name),
        ("input_sizes", sizes_text(head.input_sizes)),
        ("output_sizes", sizes_text(head.output_sizes)),
        ("input_dtypes", ",".join(head.input_dtypes)),
        ("output_dtypes", ",".join(head.output_dtypes)),
        ("state", last.state),
        ("retired", last.retired),
        ("timeout_ms", last.timeout_ms if last.timeout_ms is not None else "unknown"),
    ]
    if gloo:
        shared.append(("timing", GLOO_TIMING))
    if op.peers:
        shared.append(("peers", f"{op.peers[0]}->{op.peers[1]}"))
    if len(entries) > 1 or head.closed_by is not None:
        inner = [e.profiling_name for e in entries if not e.is_coalesced_end]
        shared.append(("coalesced_ops", ", ".join(inner) or head.profiling_name))
    if op.missing:
        shared.append(("missing_ranks", ranks_label(op.missing)))
    if op.unknown:
        shared.append(("unknown_ranks", ranks_label(op.unknown)))
    if op.mismatch:
        shared.append(("mismatch", op.mismatch))
        shared.append(("mismatch_ranks", ranks_label(op.mismatch_ranks) or "undecided"))
    if head.frames:
        shared.append(("stack", stack_strings(head.frames)))
    return shared


@functools.lru_cache(maxsize=65536)
def sizes_text(sizes: tuple[tuple[int, ...], ...]) -> str:
    """``((4, 8),)`` as ``[[4, 8]]``, the way PyTorch prints sizes."""
    return str([list(s) for s in sizes])


@functools.lru_cache(maxsize=65536)
def stack_strings(frames: tuple[Frame, ...]) -> tuple[str, ...]:
    """Frames as ``name (file:line)`` strings, innermost first; ranks share stacks, so cached."""
    return tuple(f"{f.name} ({f.filename}:{f.line})" for f in frames)


def assign_lanes(slices: list[Slice]) -> list[list[Slice]]:
    """Split time-ordered slices into lanes in which no two slices overlap: each slice goes into the
    lowest-numbered lane free at its start (first fit), in n log n: lanes that came free wait in a heap
    by number, busy ones in a heap by when they end."""
    if _one_lane(slices):
        return [slices] if slices else []
    lanes: list[list[Slice]] = []
    busy: list[tuple[int, int]] = []  # (end, lane number)
    free: list[int] = []  # lane numbers
    for s in sorted(slices, key=lambda s: (s.start, s.end if s.end is not None else s.start)):
        while busy and busy[0][0] <= s.start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        number = heapq.heappop(free) if free else len(lanes)
        if number == len(lanes):
            lanes.append([])
        lanes[number].append(s)
        heapq.heappush(busy, (s.end if s.end is not None else s.start, number))
    return lanes


def _one_lane(slices: list[Slice]) -> bool:
    """Whether each slice ends before the next begins, in the order given: then that order is the
    time order, and one lane holds them all (the common case, checked in one pass)."""
    lane_end = None
    for item in slices:
        if lane_end is not None and item.start < lane_end:
            return False
        lane_end = item.end if item.end is not None else item.start
    return True


NOTE_WINDOW_NS = 86_400_000_000_000  # a log or snapshot time further than this from the dumps' is not trusted
LOG_LABELS = {
    "watchdog_timeout": "WATCHDOG TIMEOUT", "watchdog_stuck": "WATCHDOG STUCK", "nccl_error": "NCCL ERROR",
    "cuda_error": "CUDA ERROR", "exception": "EXCEPTION", "child_failed": "FAILED",
}  # fmt: skip


MAX_SNAPSHOTS_SHOWN = 64  # of one rank, the newest: a debug server left running writes one a minute


def rank_notes(job: Job, span: TimeSpan, highlights: Highlights | None = None) -> dict[int, list[Slice]]:
    """Per rank, an instant for each of its stack snapshots (where its main thread is: "waiting in
    _wait_batch_p2p (schedules.py:683)", "in forward (train.py:29)", and for a culprit "stuck in ...",
    with the whole stack as its callstack) and for each log event, at their times, or at the end of the
    timeline where the text gives no time (or one a day away from the dumps'), said so in the args.
    A culprit's newest snapshot carries the flows of the findings about it (``highlights.rank_flows``)."""
    from .stacks import communication_call, main_thread, where

    highlights = highlights or Highlights()
    notes: dict[int, list[Slice]] = {}

    def place(when: int | None) -> tuple[int, tuple[tuple[str, ArgValue], ...]]:
        if when is not None and span.start - NOTE_WINDOW_NS < when < span.end + NOTE_WINDOW_NS:
            return when, ()
        return span.end - 1, (("time", "not known from the text: placed at the end of the timeline"),)

    for rank, snapshots in job.snapshots.items():
        shown_ones = snapshots[-MAX_SNAPSHOTS_SHOWN:]
        for snapshot in shown_ones:
            thread = main_thread(snapshot)
            if thread is None:
                continue
            call = communication_call(thread)
            frame, _ = where(thread)
            if call is not None:
                what = f"waiting in {call.name} ({os.path.basename(call.filename)}:{call.line})"
            else:
                what = f"{'stuck in' if rank in highlights.culprits else 'in'} {frame.name} " \
                       f"({os.path.basename(frame.filename)}:{frame.line})"  # fmt: skip
            at, timing = place(snapshot.time_ns)
            args = (("thread", thread.name), ("source", snapshot.source), ("stack", stack_strings(thread.frames)),
                    *timing)  # fmt: skip
            flows = tuple(highlights.rank_flows.get(rank, ())) if snapshot is shown_ones[-1] else ()
            look = SliceLook(shown("⌖ " + what), args, flows, callstack=thread.frames)
            notes.setdefault(rank, []).append(Slice(at, None, look))
    for event in job.log_events:
        at, timing = place(event.time_ns)
        args = (("line", event.line), ("source", event.source), *sorted(event.details.items()), *timing)
        look = SliceLook(shown(f"✗ {LOG_LABELS.get(event.kind, event.kind)}: {event.line[:100]}"), args)
        notes.setdefault(event.rank, []).append(Slice(at, None, look))
    for items in notes.values():
        items.sort(key=lambda s: s.start)
    return notes
