"""Ranks that came to a collective after their peers had given up on it.

Every entry carries the timeout its op runs under (``timeout_ms``: the work's timeout, from the process
group's options, ``ProcessGroupNCCL::initWork`` and ``ProcessGroupGloo``'s ``opts.timeout``). A member
that enqueued an op more than that timeout after the first member did came after that member had timed
out: whatever its dump holds afterwards (a job that catches the error and goes on, as a checkpoint save
does when it gathers every rank's result, records the same collectives on every rank), that rank held
the others past their timeout, and is the cause. Times are compared on the clocks aligned from
completion times (``match.clocks``); a margin beyond the timeout covers what the alignment cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.model import MatchedOp
from .evidence import Evidence

MIN_MARGIN_NS = 100_000_000  # beyond the timeout, whatever the clocks: more than any skew NTP leaves
MARGIN_SHARE = 0.1  # ... and a tenth of the timeout itself


@dataclass(slots=True)
class CameLate:
    """An op some members enqueued after the first member's timeout had run out."""

    op: MatchedOp
    first_rank: int  # the member that enqueued it first
    timeout_ns: int  # the timeout it ran under there
    late: dict[int, int]  # late member -> how long after the first member it enqueued (ns), earliest first
    arrived_ns: int  # when the first late member enqueued it (on the common clock): the finding's moment
    stalled_ns: int  # that member's last sign of progress before it came: its op before, issued or completed


def find_late_entries(evidence: Evidence) -> list[CameLate]:
    """Per group, the first collective that some members enqueued more than the first member's timeout
    (plus a margin) after it; the late members in the order they came, and the ops in the order their
    first late member had last made progress, then came. That order, not the ops' own, puts the cause
    first: the ranks a stuck rank held come late to every op they share with others after it, but only
    once it is free, and the op they waited in ended just before (a stuck rank's ended long before)."""
    found: dict[object, CameLate] = {}
    clocks = evidence.clocks
    offsets = [0, *clocks.offsets.values()]
    # no two members of an op enqueued further apart than this can be late (the timeout, at least 1 ms,
    # comes on top of the margin): that settles nearly every op on its raw times, unaligned
    never_late_ns = MIN_MARGIN_NS - (max(offsets) - min(offsets))
    for op in evidence.ops:
        enqueued = op.created_ns  # a collective's: one per rank with a part, as ``len(op.entries)`` counts, but in C
        if len(enqueued) < 2 or op.kind != "collective" or op.group in found:
            continue
        if max(enqueued) - op.first_time_ns <= never_late_ns:  # the matcher's first_time_ns: min(enqueued)
            continue
        created = {rank: clocks.aligned(rank, when) for rank, when in zip(op.entries, op.created_ns, strict=True)}
        first_rank = min(created, key=created.__getitem__)
        timeout_ms = op.entries[first_rank][0].timeout_ms
        if not timeout_ms or timeout_ms <= 0:
            continue  # the dump does not say what the timeout was
        timeout_ns = timeout_ms * 1_000_000
        margin = max(MIN_MARGIN_NS, int(timeout_ns * MARGIN_SHARE), 3 * clocks.uncertainty_ns)
        start = created[first_rank]
        late = {rank: when - start for rank, when in created.items() if when - start > timeout_ns + margin}
        if late:
            ordered = dict(sorted(late.items(), key=lambda item: item[1]))
            late_rank, gap = next(iter(ordered.items()))
            stalled = _last_progress(evidence, op, late_rank)
            found[op.group] = CameLate(op, first_rank, timeout_ns, ordered, start + gap, stalled)
    return sorted(found.values(), key=lambda c: (c.stalled_ns, c.arrived_ns))


def _last_progress(evidence: Evidence, op: MatchedOp, rank: int) -> int:
    """When ``rank`` last moved before it issued ``op`` (on the common clock): the completion of the entry
    it issued before, where known, else its issue; for a rank blocked in that entry, the moment it was
    let go, and for a rank stuck in its own code, long before."""
    entries = evidence.job.dumps[rank].entries
    mine = op.entries[rank][0]
    for index in range(len(entries) - 1, 0, -1):
        if entries[index] == mine:  # entries made anew from columns are equal, not the same
            before = entries[index - 1]
            # a completion noticed after it issued this op (the watchdog polls) says nothing of before
            moved = max(before.time_created_ns, min(before.time_completed_ns or 0, mine.time_created_ns))
            return evidence.clocks.aligned(rank, moved)
    return evidence.clocks.aligned(rank, mine.time_created_ns)
