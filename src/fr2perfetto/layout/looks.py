"""The looks of a rank's slices (name, args, flows), made once per op and variant and shared by every rank
that issued the op alike, and the highlights the diagnosis adds to them (culprits, victims, findings).

An op's name says what matters first: ``⚠ UNMATCHED``, ``⚠ MISMATCH (size)``, ``⏳ STUCK``,
``⏳ NOT COMPLETED`` for its status, ``⛓ VICTIM`` where the rank is blocked in it by another, ``⏸ QUEUED``
for an op that never started behind the one that holds its stream, ``✗ NEVER ISSUED`` where a rank never
issued what the others entered.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, sub

from ..base.model import (
    COMPLETED,
    INCOMPLETE,
    MISMATCH,
    MISSING,
    OK,
    STUCK,
    Entry,
    Frame,
    Group,
    MatchedOp,
    ranks_label,
)
from ..base.text import shown
from ..match.ops import NO_COMPLETION_BACKENDS
from .scene import ArgValue, Slice, SliceLook

# Name prefixes that make a problem stand out in the timeline (and in a search box).
PREFIX = {
    MISSING: "⚠ UNMATCHED ",
    MISMATCH: "⚠ MISMATCH ",
    STUCK: "⏳ STUCK ",
    INCOMPLETE: "⏳ NOT COMPLETED ",
}
NEVER_ISSUED = "✗ NEVER ISSUED "
VICTIM = "⛓ VICTIM "  # a rank blocked in the op by another, or queued behind its own blocked op
QUEUED = "⏸ QUEUED "  # enqueued behind the op that holds its stream, and never started
GLOO_TIMING = "not recorded: this backend records enqueue time only; the slice spans to the next op on this group"
NO_START = "start events off (TORCH_NCCL_ENABLE_TIMING): drawn from when its stream was free to its completion"
HOLDS = "the first op on its stream that did not complete: the ops enqueued after it on the stream never started"
LATENESS_STEP_MS = 0.01  # the lateness counter moves in steps of this much: smaller changes are not written


@dataclass(slots=True)
class Highlights:
    """What the diagnosis adds to the ranks' tracks, and the looks made so far (shared by all ranks)."""

    culprits: dict[int, str] = field(default_factory=dict)  # rank -> why it is to blame
    # (rank, op key) -> a rank's part in an op it is blocked in or queued in, not being its culprit
    roles: dict[tuple[int, int], str] = field(default_factory=dict)
    clock_offsets: dict[int, int] = field(default_factory=dict)  # rank -> ns its clock runs ahead (subtracted)
    # rank -> instants of what was found beside the dumps: its stack snapshots, its log events
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
    # collective's op key -> when its members enqueued it, median, on its group's clock (for the lateness
    # counter; ``Evidence.enqueue_medians``); None where it has one member
    enqueued: dict[int, int | None] = field(default_factory=dict)
    group_offsets: dict[Group, dict[int, int]] = field(default_factory=dict)  # ``stragglers.group_offsets``
    # op key -> the look made last of what ran of it, issued as one entry: what ``_speedups.lay_out_rows``
    # draws a collective issued as one entry with (``Looks.prepare``)
    last_looks: dict[int, SliceLook] = field(default_factory=dict)
    enqueue_looks: dict[int, SliceLook] = field(default_factory=dict)  # collective's op key -> its enqueue's look
    _roles_by_rank: dict[int, frozenset[int]] | None = None

    def roles_by_rank(self) -> dict[int, frozenset[int]]:
        """rank -> the op keys where it has a role (``roles``), made once."""
        if self._roles_by_rank is None:
            by_rank: dict[int, set[int]] = {}
            for rank, key in self.roles:
                by_rank.setdefault(rank, set()).add(key)
            self._roles_by_rank = {rank: frozenset(keys) for rank, keys in by_rank.items()}
        return self._roles_by_rank


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


def look_key(op: MatchedOp, entries: list[Entry], head: Entry, last: Entry) -> tuple[object, ...]:
    """What decides the look of a rank's slice for ``op`` (see LOOK_HEAD_FIELDS)."""
    return (
        op.op_key, _look_head(head), _look_last(last), last.time_started_ns is None,
        last.time_completed_ns is None, head.closed_by is not None,
        tuple(e.profiling_name for e in entries) if len(entries) > 1 else None,
    )  # fmt: skip


def op_look(
    op: MatchedOp,
    entries: list[Entry],
    head: Entry,
    last: Entry,
    highlights: Highlights,
    role: str | None = None,
    holds: bool = False,
) -> SliceLook:
    """The look of a rank's slice for ``op``: its name, the facts the op's ranks share, its flows
    (``holds``: the op holds its stream). The caller keys it by ``look_key``, so that the ranks that
    issued an op alike share one look."""
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
    args = tuple(_shared_args(op, entries, head, last, gloo))
    if role is not None:
        args += (("role", role),)
    if holds:
        args += (("stream", HOLDS),)
    elif not gloo and last.time_started_ns is None and last.time_completed_ns is not None:
        args += (("timing", NO_START),)
    return SliceLook(name, args, flows, op.op_key if shared else None, timed=not gloo)


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


class Looks:
    """The looks of one rank's slices, from the caches every rank shares (``Highlights.looks``)."""

    __slots__ = (
        "enqueue_looks", "highlights", "last_looks", "looks", "rank", "rank_roles", "references", "roles",
    )  # fmt: skip

    def __init__(self, highlights: Highlights, rank: int) -> None:
        self.highlights = highlights
        self.looks = highlights.looks
        self.roles = highlights.roles
        self.last_looks = highlights.last_looks
        self.enqueue_looks = highlights.enqueue_looks
        self.references = highlights.enqueued
        self.rank_roles = highlights.roles_by_rank().get(rank, frozenset())
        self.rank = rank

    def ran(self, op: MatchedOp, entries: list[Entry], head: Entry, last: Entry) -> SliceLook:
        """The look of what ran of ``op`` on this rank."""
        role = self.roles.get((self.rank, op.op_key)) if self.roles else None
        if op.kind == "p2p":  # one rank's alone (its side: send or recv): not kept for the others
            return op_look(op, entries, head, last, self.highlights, role)
        key: tuple[object, ...] = look_key(op, entries, head, last)
        if role is not None:
            key = (key, role)
        look = self.looks.get(key)
        if look is None:
            look = self.looks[key] = op_look(op, entries, head, last, self.highlights, role)
        if role is None and head is last:  # a collective: what the C layout takes
            self.last_looks[op.op_key] = look
        return look

    def lateness_offset(self, group: Group) -> int:
        """How far this rank's clock runs ahead of ``group``'s, on which its lateness there is measured."""
        offsets = self.highlights.group_offsets.get(group)
        return offsets.get(self.rank, 0) if offsets else 0

    def prepare(self, op: MatchedOp, entries: list[Entry]) -> bool:
        """Make the looks ``_speedups.lay_out_rows`` reads for a collective this rank issued as one
        entry (what ran, its enqueue, its lateness's reference); False where it is not a collective."""
        if op.kind != "collective":
            return False
        head = entries[0]
        look = self.ran(op, entries, head, head)
        if op.op_key not in self.enqueue_looks:  # named as what ran, where that has no mark added
            title = op.title
            self.enqueue_looks[op.op_key] = SliceLook(look.name if look.name == title else shown(title), ())
        if op.op_key not in self.references:
            self.lateness(op, 0)
        return True

    def holds(self, op: MatchedOp, entries: list[Entry], head: Entry, last: Entry) -> SliceLook:
        """The look of the op that holds its stream (the first on it that did not complete)."""
        role = self.roles.get((self.rank, op.op_key))
        key = (look_key(op, entries, head, last), role, "holds")
        look = self.looks.get(key)
        if look is None:
            look = self.looks[key] = op_look(op, entries, head, last, self.highlights, role, holds=True)
        return look

    def queued(self, op: MatchedOp, head: Entry, holder: MatchedOp) -> SliceLook:
        """The look of an op enqueued behind the one that holds its stream: it never started."""
        role = self.roles.get((self.rank, op.op_key))
        key = ("queued", op.op_key, head.op, holder.op_key, role)
        look = self.looks.get(key)
        if look is None:
            title = op.title_as(head.op) if op.kind == "p2p" else op.title
            args: tuple[tuple[str, ArgValue], ...] = (
                ("status", f"enqueued behind {holder.title}, which holds its stream; never started"),
                ("group", op.group.name), ("group_desc", op.group.desc),
            )  # fmt: skip
            if role is not None:
                args += (("role", role),)
            # joined to the op on its other ranks, as what ran of it is: there it carries this flow too
            own = (op.op_key,) if self._shared(op) else ()
            flows = own + tuple(self.highlights.finding_flows.get(op.op_key, ()))
            look = self.looks[key] = SliceLook(shown(f"{QUEUED}{title} (behind {holder.title})"), args, flows)
        return look

    def never_issued(self, op: MatchedOp) -> Slice:
        """The marker where a rank never issued an op the others entered: when the first of them did."""
        key = ("never issued", op.op_key)
        look = self.looks.get(key)
        if look is None:
            args: tuple[tuple[str, ArgValue], ...] = (
                ("status", "this rank never issued the op that the others entered here"),
                ("group", op.group.label),
                ("collective_seq_id" if op.kind == "collective" else "p2p_seq_id", op.seq),
                ("issued_by_ranks", ranks_label(list(op.entries))),
            )
            flows = tuple(self.highlights.finding_flows.get(op.op_key, ()))
            look = self.looks[key] = SliceLook(shown(NEVER_ISSUED + op.title), args, flows, op.op_key)
        return Slice(op.first_time_ns, None, look)

    def enqueue(self, op: MatchedOp, head: Entry) -> SliceLook:
        """The look of a rank's enqueue of ``op``, on its thread's track: the op's name, nothing else."""
        if op.kind == "collective":
            look = self.enqueue_looks.get(op.op_key)
            if look is None:
                look = self.enqueue_looks[op.op_key] = SliceLook(shown(op.title), ())
            return look
        return SliceLook(shown(op.title_as(head.op)), ())  # a send's or recv's: its rank's alone

    def batch(self, ops: list[tuple[MatchedOp, str]], first: SliceLook) -> SliceLook:
        """The look of a batch of sends and recvs that ran as one group call (``ops``: each with what it
        was on this rank, send or recv): its first op's look, named after all of them, with every one's
        flows."""
        titles = tuple(op.title_as(name) for op, name in ops)
        flows = list(first.flow_ids)
        for op, _ in ops[1:]:
            if self._shared(op):
                flows.append(op.op_key)
            flows += self.highlights.finding_flows.get(op.op_key, ())
        name = shown(f"{first.name} + {', '.join(titles[1:])}")
        return SliceLook(name, (*first.args, ("batch", titles)), tuple(dict.fromkeys(flows)), first.correlation_id,
                         first.timed)  # fmt: skip

    def _shared(self, op: MatchedOp) -> bool:
        drawn = self.highlights.drawn
        return len(op.entries) > 1 if drawn is None else drawn.get(op.op_key, (0, 0))[0] > 1

    def lateness(self, op: MatchedOp, created: int) -> float | None:
        """How late this rank enqueued ``op``, a collective, in ms, against the median of its members on
        its group's clock, as stragglers are judged (never below 0), in steps of ``LATENESS_STEP_MS``;
        None: it has one member."""
        offsets = self.highlights.group_offsets.get(op.group)
        reference = self.references.get(op.op_key, False)
        if reference is False:
            if len(op.entries) < 2:
                reference = self.references[op.op_key] = None
            else:
                enqueued = op.created_ns  # in the order of op.entries
                aligned = sorted(map(sub, enqueued, map(offsets.get, op.entries, repeat(0))) if offsets else enqueued)
                reference = self.references[op.op_key] = aligned[len(aligned) // 2]  # the median (the upper)
        if reference is None:
            return None
        late = (created - (offsets.get(self.rank, 0) if offsets else 0) - reference) / 1e6
        return round(late / LATENESS_STEP_MS) * LATENESS_STEP_MS if late > 0 else 0.0
