"""Lay a matched job out on a timeline: tracks, slices, instants, counters and flows, for any trace format.

Pure functions from (job, matched ops, findings) to ``scene`` objects; ``render`` only writes them
out. One rank at a time (``rank_timelines``) so that a writer can stream a large job. Each rank is a
process with, in this order: what lies beside its dump (``stack & logs``), a track per thread that
enqueued ops, and a track per process group with what ran on the group's stream; under it, how late
the rank enqueued the group's collectives (``enqueue lateness · tp (pg 3) · rank 5``, a counter) and
the streams of its single sends and recvs, one per peer (``streams``).
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence, Set

from ..base.model import EntriesByRank, Entry, Finding, Group, MatchedOp, ranks_label, time_range
from ..base.text import shown
from ..base.words import UNNAMED, group_called, lateness_track
from ..read.columns import EntryRows
from ..read.job import Job
from .fold import View, full_view
from .looks import Highlights, Looks, stack_strings
from .rows import JobRows
from .scene import ArgValue, RankTimeline, Slice, SliceLook, TimeSpan, Track
from .streams import lay_out, lay_out_rows, start_on_rank

FINDINGS_UUID = 1
FINDING_FLOW_BASE = 1 << 48  # flow ids of findings, far above those of ops (their op keys)
PID_BASE = 100_000  # pid 0 means the idle process to trace tools, so ranks get pids from here
LATENESS_AXIS = "fr2perfetto.lateness"  # every rank's lateness counters share one y axis


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


def ops_by_rank(ops: list[MatchedOp], ranks: Set[int] | None = None) -> dict[int, list[tuple[MatchedOp, list[Entry]]]]:
    """Index ops by the ranks that hold entries for them (or should have: missing ranks), of ``ranks`` only
    if given. Where ops hold rows of entries made when asked for, each rank's entries are made at once, all
    of them (the layout reads nearly every one)."""
    made: dict[int, list[Entry]] = {}  # rank -> its entries, where ops hold rows of them
    sources: dict[int, Mapping[int, Sequence[Entry]]] = {}  # id -> every rank's entries, as ops hold them
    index: dict[int, list[tuple[MatchedOp, list[Entry]]]] = {}
    for op in ops:
        entries_by_rank = op.entries
        if isinstance(entries_by_rank, EntriesByRank):
            source = entries_by_rank.sources
            if id(source) not in sources:
                sources[id(source)] = source
                for rank in source if ranks is None else ranks & source.keys():
                    if rank not in made:
                        made[rank] = list(source[rank])
            packed_ranks, packed_rows = entries_by_rank.packed()
            parts: dict[int, list[Entry]] = {}
            for rank, row in zip(array("i", packed_ranks), array("I", packed_rows), strict=True):
                if ranks is None or rank in ranks:
                    parts.setdefault(rank, []).append(made[rank][row])
            entries_by_rank = parts
        for rank, entries in entries_by_rank.items():
            if ranks is None or rank in ranks:
                index.setdefault(rank, []).append((op, entries))
        for rank in op.missing:
            if ranks is None or rank in ranks:
                index.setdefault(rank, []).append((op, []))
    return index


def items_per_rank(ops: list[MatchedOp]) -> Counter[int]:
    """How many items ``ops_by_rank`` of ``ops`` holds for each rank, without making any."""
    counts: Counter[int] = Counter()
    for op in ops:
        counts.update(iter(op.entries))  # its ranks (a mapping would add its values)
        counts.update(op.missing)
    return counts


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
    rows: JobRows | None = None,
) -> Iterator[RankTimeline]:
    """Yield each shown rank's timeline in rank order, built only when asked for.

    ``index`` is ``ops_by_rank`` of the job's ops, for the shown ranks at least but those laid out from
    ``rows`` (the ranks it holds items of: ``rows.job_rows``, for a view that shows every group unfolded).
    """
    view = view or full_view(job)
    highlights = highlights or Highlights()
    for rank, stands_for in view.processes:
        from_rows = rows if rows is not None and rank in rows.items else None
        yield rank_timeline(job, rank, index.get(rank, []), span, highlights, stands_for, view, from_rows)


def rank_timeline(
    job: Job,
    rank: int,
    rank_ops: list[tuple[MatchedOp, list[Entry]]],
    span: TimeSpan,
    highlights: Highlights,
    stands_for: tuple[int, ...] = (),
    view: View | None = None,
    rows: JobRows | None = None,
) -> RankTimeline:
    """The tracks of one rank: its process, what lies beside its dump, its lateness, its threads, its
    groups' streams, on the job's common clock (``clocks``: the args keep the times the rank recorded).
    A folded process stands for several ranks with the same ops; history before a group's cutoff is
    one summary slice. With ``rows``, the rank's ops are its items there (and ``rank_ops`` is not read)."""
    dump = job.dumps.get(rank)
    process_uuid = rank_uuid(rank)
    process = _process_track(job, rank, highlights, stands_for)
    offset = highlights.clock_offsets.get(rank, 0)
    shown_groups = view.groups if view is not None else None
    cutoffs = view.cutoffs if view is not None else {}
    items = rank_ops
    folded: dict[Group, list[int]] = {}
    if shown_groups is not None or cutoffs:
        items = []
        for item in rank_ops:
            op = item[0]
            if shown_groups is not None and op.group not in shown_groups:
                continue
            start = start_on_rank(item)
            if start < cutoffs.get(op.group, -1):
                folded.setdefault(op.group, []).append(start)
                continue
            items.append(item)
    free_from = {group: max(cutoffs[group], min(starts) + 1) for group, starts in folded.items()}
    looks = Looks(highlights, rank)
    if rows is not None and dump is not None and isinstance(dump.entries, EntryRows):
        assert shown_groups is None and not cutoffs, "a view that leaves out or folds ops is laid out from items"
        items_by_group = rows.rank_groups(rank, dump.entries)
        context = rows.context(looks, dump.entries)
        layout = lay_out_rows(rank, items_by_group, span.end, looks, context, dump.entries, offset)
    else:
        layout = lay_out(rank, items, span.end, looks, free_from, offset)
    tracks = [process]

    def child(name: str, order: int, parent: int = process_uuid, **more: object) -> Track:
        track = Track(process_uuid + len(tracks), name, parent=parent, order=order, **more)  # type: ignore[arg-type]
        tracks.append(track)
        return track

    if dump is None:  # the UI shows only tracks with events: a rank without a dump shows through this one
        start, what = highlights.no_dump_waits.get(rank, (span.start, ""))
        title = shown(f"no dump: the others wait for it in {what}") if what else "no dump from this rank"
        look = SliceLook(title, (("status", "this rank left no dump"),))
        child("no dump", -4, slices=[Slice(start, max(span.end, start + 1), look)])
    notes = highlights.rank_notes.get(rank)
    if notes:  # shared with other writers of this trace: shifted as copies
        shifted = [note._replace(start=note.start - offset) for note in notes] if offset else list(notes)
        child("stack & logs", -3, slices=shifted, description="where the rank's threads were (stack snapshots) "
              "and what its log says", nested=True)  # fmt: skip
    for number, ((thread_id, thread_name), instants) in enumerate(layout.enqueues.items()):
        name = f"thread {thread_name} ({thread_id})" if thread_name or thread_id else "enqueued (thread not recorded)"
        child(shown(name), -1 - len(layout.enqueues) + number, slices=instants, enqueues=True,
              description="the ops this thread enqueued, each joined by a flow to where it ran")  # fmt: skip
    groups = [g for g in job.groups_of_rank(rank) if shown_groups is None or g in shown_groups]
    peers: dict[Group, list[int]] = {}
    for group, peer in layout.streams:
        if peer is not None:
            peers.setdefault(group, []).append(peer)
    for group in groups:
        stream = layout.streams.get((group, None))
        slices = stream.slices if stream is not None else []
        if group in folded:
            starts = folded[group]
            summary = SliceLook(
                f"… {len(starts)} earlier ops (folded)",
                (("folded_ops", len(starts)), ("how_to_see_them", "convert again with --full, or a larger --window")),
            )
            slices = [Slice(min(starts) - offset, free_from[group] - offset, summary), *slices]
        called = "unnamed" if group.desc == UNNAMED else group.desc or "no description"
        description = shown(f"process group {group.name} ({called}), members "
                            f"{group.members_label}: the ops that ran on its stream")  # fmt: skip
        group_track = child(group.label, group.order, slices=slices, description=description,
                            nested=stream is not None and stream.nested)  # fmt: skip
        points = layout.lateness.get(group)
        if points:
            child(lateness_track(group, rank), -1, parent=group_track.uuid, counter_unit="ms",
                  counter_share=LATENESS_AXIS, points=points, description="how late this rank enqueued each "
                  "collective of the group: ms after the median of its members, on the group's clock")  # fmt: skip
        for peer in sorted(peers.get(group, ())):
            pair = layout.streams[(group, peer)]
            child(f"send/recv with rank {peer}", peer, parent=group_track.uuid, slices=pair.slices, nested=pair.nested,
                  description=f"the single sends and recvs between rank {rank} and rank {peer} in this group, on "
                  "the stream of their pair")  # fmt: skip
    return RankTimeline(rank, tracks)


def _process_track(job: Job, rank: int, highlights: Highlights, stands_for: tuple[int, ...]) -> Track:
    """A rank's process: named so that what must be seen is seen (the UI shows no labels)."""
    dump = job.dumps.get(rank)
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
    name = f"rank {rank}" if len(stands_for) <= 1 else f"ranks {ranks_label(stands_for)} ({len(stands_for)})"
    if culprit:
        name += " · CULPRIT"
    elif dump is None:
        name += " · no dump"
    description = (
        shown(f"dump {dump.path} (version {dump.version}, {dump.file_format})") if dump else "this rank left no dump"
    )
    return Track(rank_uuid(rank), name, pid=PID_BASE + rank, order=rank, labels=labels, description=description)


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
            what = f"{finding.op} #{finding.seq} of {group_called(finding.group)}"
            for rank in finding.ranks:
                highlights.no_dump_waits.setdefault(rank, (start, what))
    return tracks, highlights


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
    from ..read.stacks import communication_call, main_thread, where

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
            args: tuple[tuple[str, ArgValue], ...] = (
                ("thread", thread.name), ("source", snapshot.source), ("stack", stack_strings(thread.frames)), *timing,
            )  # fmt: skip
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
