"""Lay a matched job out on a timeline: tracks, slices, markers and flows, for any trace format.

Pure functions from (job, matched ops, findings) to ``Timeline`` objects; the renderers only write
them out. One rank at a time (``rank_tracks``) so that a writer can stream a large job.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Union

from .fold import View, full_view
from .job import Job
from .match import tracks_completion
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
)


class ArgBlock:
    """Args that many slices share (most ranks of one op), built once and encoded once by a writer."""

    __slots__ = ("encoded", "items")

    def __init__(self, items: tuple[tuple[str, ArgValue], ...]) -> None:
        self.items = items
        self.encoded: tuple[object, bytes] | None = None  # (writer's token, bytes): set by the Perfetto writer


class RankFacts:
    """The facts of one rank's entry that no other slice shares (ids and times), in a fixed layout.

    A slice has one of these instead of seven named args, so that writers can encode them in one go.
    ``items`` lists them as named values.
    """

    __slots__ = ("completed", "created", "duration_ms", "op_id", "record_id", "started", "thread", "timed")

    def __init__(self, head: Entry, last: Entry, timed: bool) -> None:
        self.op_id = head.op_id
        self.record_id = head.record_id
        self.created = head.time_created_ns
        self.timed = timed  # False: the backend records no start or completion (gloo)
        self.started = last.time_started_ns
        self.completed = last.time_completed_ns
        self.duration_ms = last.duration_ms
        self.thread = f"{head.thread_name} ({head.thread_id})" if head.thread_name or head.thread_id else ""

    @property
    def items(self) -> list[tuple[str, ArgValue]]:
        out: list[tuple[str, ArgValue]] = [
            ("op_id", self.op_id),
            ("record_id", self.record_id),
            ("time_created_ns", self.created),
        ]
        if self.timed:
            out.append(("time_started_ns", self.started or "unknown"))
            out.append(("time_completed_ns", self.completed or "unknown"))
            out.append(("duration_ms", self.duration_ms if self.duration_ms is not None else "unknown"))
        if self.thread:
            out.append(("thread", self.thread))
        return out


ArgValue = Union[str, int, float, bool, tuple["ArgValue", ...], ArgBlock, RankFacts]  # noqa: UP007 - a recursive alias

# Name prefixes that make a problem stand out in the timeline (and in a search box).
PREFIX = {
    MISSING: "⚠ UNMATCHED ",
    MISMATCH: "⚠ MISMATCH ",
    STUCK: "⏳ STUCK ",
    INCOMPLETE: "⏳ NOT COMPLETED ",
}
NEVER_ISSUED = "✗ NEVER ISSUED "
GLOO_TIMING = "not recorded: this backend records enqueue time only; the slice spans to the next op on this group"
FINDINGS_UUID = 1
FINDING_FLOW_BASE = 1 << 48  # flow ids of findings, far above those of ops (their op keys)
PID_BASE = 100_000  # pid 0 means the idle process to trace tools, so ranks get pids from here


@dataclass(slots=True)
class Slice:
    """A slice (start < end) or, when ``end`` is None, an instant marker."""

    start: int
    end: int | None
    name: str
    args: list[tuple[str, ArgValue]]
    flow_ids: list[int] = field(default_factory=list)
    correlation_id: int | None = None


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
    """First and last timestamps of any entry, with a margin after the last one."""
    first, last = None, None
    for dump in job.dumps.values():
        for e in dump.entries:
            t0 = e.time_created_ns
            t1 = max(t0, e.time_started_ns or 0, e.time_completed_ns or 0)
            first = t0 if first is None or t0 < first else first
            last = t1 if last is None or t1 > last else last
    if first is None or last is None:
        return TimeSpan(0, 1_000_000)
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
    finding_flows: dict[int, list[int]] = field(default_factory=dict)  # op key -> flow ids of findings
    # op key -> (slices, markers) drawn for it, when a folded view draws fewer than the job has
    drawn: dict[int, tuple[int, int]] | None = None
    # arg blocks already built, by op and the facts of a rank's entry that go into them
    arg_blocks: dict[tuple[object, ...], ArgBlock] = field(default_factory=dict)
    titles: dict[int, str] = field(default_factory=dict)  # op key -> its title, made once


def drawn_counts(ops_index: dict[int, list[tuple[MatchedOp, list[Entry]]]], view: View) -> dict[int, tuple[int, int]]:
    """Per op key, the (slices, markers) a folded ``view`` draws: one per shown rank that has it."""
    counts: dict[int, tuple[int, int]] = {}
    for rank, _ in view.processes:
        for op, entries in ops_index.get(rank, ()):
            if view.groups is not None and op.group not in view.groups:
                continue
            start = entries[0].time_created_ns if entries else op.first_time_ns
            if start >= view.cutoffs.get(op.group, -1):
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
    if dump is None:
        labels.append("no dump")
    else:
        if dump.host:
            labels.append(dump.host)
        labels.append(os.path.basename(dump.path))
    process = Track(
        uuid=process_uuid,
        name=f"rank {rank}" if len(stands_for) <= 1 else f"ranks {ranks_label(stands_for)} ({len(stands_for)})",
        pid=PID_BASE + rank,
        labels=labels,
        description=f"dump {dump.path} (version {dump.version}, {dump.file_format})"
        if dump
        else "this rank left no dump",
    )
    shown = view.groups if view is not None else None
    cutoffs = view.cutoffs if view is not None else {}
    by_group: dict[Group, list[Slice]] = {g: [] for g in job.groups_of_rank(rank) if shown is None or g in shown}
    per_group_ops: dict[Group, list[tuple[MatchedOp, list[Entry]]]] = {}
    folded: dict[Group, list[int]] = {}
    for op, entries in rank_ops:
        if shown is not None and op.group not in shown:
            continue
        start = entries[0].time_created_ns if entries else op.first_time_ns
        if start < cutoffs.get(op.group, -1):
            folded.setdefault(op.group, []).append(start)
            continue
        per_group_ops.setdefault(op.group, []).append((op, entries))
        by_group.setdefault(op.group, [])
    for group, items in per_group_ops.items():
        by_group[group] = _group_slices(rank, items, span, highlights)
    for group, starts in folded.items():
        summary = Slice(
            min(starts),
            max(cutoffs[group], min(starts) + 1),
            f"… {len(starts)} earlier ops (folded)",
            [("folded_ops", len(starts)), ("how_to_see_them", "convert again with --full, or a larger --window")],
        )
        by_group.setdefault(group, []).insert(0, summary)
    tracks = [process]
    for group, slices in sorted(by_group.items(), key=lambda kv: kv[0].order):
        group_uuid = process_uuid + len(tracks)
        lanes = assign_lanes(slices)
        members = group.members_label
        description = f"process group {group.name} ({group.desc or 'no description'}), members {members}"
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
    rank: int, items: list[tuple[MatchedOp, list[Entry]]], span: TimeSpan, highlights: Highlights
) -> list[Slice]:
    """Slices (and markers) of one rank on one group track, in time order."""
    items.sort(key=lambda item: item[1][0].time_created_ns if item[1] else item[0].first_time_ns)
    starts = [entries[0].time_created_ns for _, entries in items if entries]
    slices: list[Slice] = []
    finding_flows = highlights.finding_flows
    drawn = highlights.drawn
    next_index = 0
    for op, entries in items:
        if not entries:
            slices.append(_never_issued_marker(op, rank))
            slices[-1].flow_ids.extend(finding_flows.get(op.op_key, ()))
            continue
        next_index += 1
        next_start = starts[next_index] if next_index < len(starts) else None
        # An op's flow needs two drawn slices.
        shared = len(op.entries) > 1 if drawn is None else drawn.get(op.op_key, (0, 0))[0] > 1
        item = _op_slice(op, rank, entries, span, next_start, shared, highlights)
        if finding_flows:
            item.flow_ids.extend(finding_flows.get(op.op_key, ()))
        slices.append(item)
    return slices


def _op_slice(
    op: MatchedOp,
    rank: int,
    entries: list[Entry],
    span: TimeSpan,
    next_start: int | None,
    shared: bool,
    highlights: Highlights,
) -> Slice:
    head, last = head_entry(entries), state_entry(entries)
    start = entries[0].time_created_ns
    status = op.status
    done = last.state == COMPLETED
    waited = status in (MISSING, STUCK) or (status == INCOMPLETE and not done)
    if last.time_completed_ns:
        end = last.time_completed_ns
    elif waited or tracks_completion(last) or (next_start is None and not last.retired):
        end = span.end  # it never completed: draw it to the end of the trace
    else:
        # No completion time is recorded (gloo); the rank went on to its next op on this group.
        end = next_start if next_start is not None and next_start > start else start + 1_000
    if end <= start:
        end = start + 1
    if op.kind == "p2p":
        name = op.title_as(head.op)
    else:
        name = highlights.titles.get(op.op_key)  # type: ignore[assignment]
        if name is None:
            name = highlights.titles[op.op_key] = op.title
    if status != OK and (status != INCOMPLETE or not done):
        prefix = PREFIX.get(status, "")
        if status == MISMATCH:
            prefix = f"{prefix}({op.mismatch}) "
        name = prefix + name
    return Slice(
        start=start,
        end=end,
        name=name,
        args=op_args(op, rank, entries, head, last, highlights.arg_blocks),
        flow_ids=[op.op_key] if shared else [],
        correlation_id=op.op_key if shared else None,
    )


def findings_tracks(
    findings: list[Finding], span: TimeSpan, drawn: dict[int, tuple[int, int]] | None = None
) -> tuple[list[Track], Highlights]:
    """A ``Findings`` track above all ranks, a slice per finding, and the highlights they imply.

    Each finding gets its own child track (they all run to the end of the trace) and a flow to
    every op it is about.
    """
    parent = Track(FINDINGS_UUID, "Findings", order=-1, description="what fr2perfetto analyze found, strongest first")
    tracks = [parent]
    highlights = Highlights(drawn=drawn)
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
                ("group_ranks", ranks_label(finding.group.members)),
            ]
        if finding.op:
            args += [("op", finding.op), ("seq", finding.seq)]
        if finding.culprit_frames:
            args.append(("culprit_stack", stack_strings(finding.culprit_frames)))
        item = Slice(start, span.end, f"{finding.kind}: {finding.summary}", args)
        shown_keys = [k for k in finding.op_keys if drawn is None or drawn.get(k)]
        if shown_keys:
            item.flow_ids.append(flow)
            for key in shown_keys:
                highlights.finding_flows.setdefault(key, []).append(flow)
        tracks.append(
            Track(
                FINDINGS_UUID + number, f"{number}. {finding.kind}", parent=FINDINGS_UUID, order=number, slices=[item]
            )
        )
        for rank in finding.culprit_ranks:
            highlights.culprits.setdefault(rank, finding.kind)
    return tracks, highlights


def _never_issued_marker(op: MatchedOp, rank: int) -> Slice:
    others = ranks_label([r for r in op.entries])
    return Slice(
        start=op.first_time_ns,
        end=None,
        name=NEVER_ISSUED + op.title,
        args=[
            ("status", "this rank never issued the op that the others entered here"),
            ("group", op.group.label),
            ("collective_seq_id" if op.kind == "collective" else "p2p_seq_id", op.seq),
            ("issued_by_ranks", others),
        ],
        correlation_id=op.op_key,
    )


def op_args(
    op: MatchedOp,
    rank: int,
    entries: list[Entry],
    head: Entry,
    last: Entry,
    blocks: dict[tuple[object, ...], ArgBlock] | None = None,
) -> list[tuple[str, ArgValue]]:
    """Every fact the dump gives about this rank's part in the op, as named values.

    Two items: ("", block), the facts most ranks of the op share (status, group, op, sizes, dtypes,
    state, stack...) as one ``ArgBlock``, built once per distinct set of facts; and ("", facts),
    this rank's own ids and times as ``RankFacts``.
    """
    gloo = last.backend in ("gloo", "c10d") and last.time_started_ns is None and last.time_completed_ns is None
    key = (op.op_key, head.op, head.backend, head.collective_seq, head.p2p_seq, head.input_sizes, head.output_sizes,
           head.input_dtypes, head.output_dtypes, last.state, last.retired, last.timeout_ms, head.frames, gloo,
           tuple(e.op for e in entries) if len(entries) > 1 else None, head.closed_by is not None)  # fmt: skip
    block = blocks.get(key) if blocks is not None else None
    if block is None:
        block = ArgBlock(tuple(_shared_args(op, entries, head, last, gloo)))
        if blocks is not None:
            blocks[key] = block
    return [("", block), ("", RankFacts(head, last, not gloo))]


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
    """Split time-ordered slices into lanes in which no two slices overlap (first fit)."""
    lanes: list[list[Slice]] = []
    lane_ends: list[int] = []
    for s in sorted(slices, key=lambda s: (s.start, s.end if s.end is not None else s.start)):
        end = s.end if s.end is not None else s.start
        for number, lane_end in enumerate(lane_ends):
            if lane_end <= s.start:
                lanes[number].append(s)
                lane_ends[number] = end
                break
        else:
            lanes.append([s])
            lane_ends.append(end)
    return lanes


def flat_args(args: list[tuple[str, ArgValue]]) -> list[tuple[str, ArgValue]]:
    """Args with shared blocks (``("", block)``) expanded in place."""
    out: list[tuple[str, ArgValue]] = []
    for name, value in args:
        if isinstance(value, (ArgBlock, RankFacts)):
            out.extend(value.items)
        else:
            out.append((name, value))
    return out
