"""Ranks' clock offsets, from the moments their collectives complete.

Ranks on different hosts stamp their entries with different clocks (NTP keeps them within 0.1-10 ms,
worse without), and an offset looks exactly like lateness. An NCCL collective completes on every member
at nearly the same moment (its kernels end once the last member's data has arrived); the watchdog
notices it up to its poll interval later (``time_discovered_completed_ns``), a delay that varies from op
to op. So within a group, a member's completion time minus the op's centre is its offset against the
group plus noise, and its offset is the (trimmed) mean of that over the group's newest ops. A mean, not
a median: a delay spread evenly over a poll interval averages out, while the median of two ranks'
delays sticks to whichever difference between their polls comes up more often.

Completions noticed on one poll share its delay, so a member's noise is judged over its distinct
completion times. Lateness within a group is judged on that group's own estimates (the members of a
group share many ops, so those are the precise ones), within their noise. The trace shows a group's
offsets only where one stands out of its noise; the job-wide offsets chain the groups' together,
largest group first.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field
from itertools import repeat
from operator import sub

from ..base.model import COMPLETED, EntriesByRank, Group, MatchedOp, state_entry
from ..read.columns import EntryRows, LinkedRows

SAMPLE_BUDGET = 200_000  # (rank, op) completion times used at most, over every group
MIN_OPS, MAX_OPS = 16, 64  # the newest completed collectives of each group that are used
ROUNDS = 3
MIN_TICKS = 8  # distinct completion times a member needs for its offset to be estimated at all
MIN_OFFSET_NS = 500_000  # offsets smaller than this are not worth applying
SAME_POLL_NS = 100_000  # times of one rank closer than this were noticed on one poll
SIGNIFICANCE = 4.0  # a group's offsets apply when one of them is this many of its standard errors from zero
DISPLAY_SIGNIFICANCE = 2.0  # the job's offsets are applied to the trace from this many standard errors


@dataclass(slots=True)
class GroupClock:
    """One group's members' offsets against its centre, and how far they may be off."""

    offsets: dict[int, int]  # member -> ns its clock runs ahead of the group's (empty: none stands out)
    uncertainty_ns: int  # the largest standard error among the members' offsets
    aligned: bool  # every member's offset could be estimated
    estimates: dict[int, int] = field(default_factory=dict)  # every member's offset, standing out or not
    poll_ns: int = 0  # the step at which the watchdogs seem to notice completions (0: no sign of one)


@dataclass(slots=True)
class Clocks:
    """What was estimated: per group, and job-wide (for the trace)."""

    groups: dict[Group, GroupClock] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)  # rank -> ns its clock runs ahead (job-wide)
    uncertainty_ns: int = 0  # the largest standard error among the groups' applied offsets

    def aligned(self, rank: int, time_ns: int) -> int:
        """A time of ``rank`` on the common clock."""
        return time_ns - self.offsets.get(rank, 0)


def estimate_clocks(ops: list[MatchedOp]) -> Clocks:
    """Estimate the groups' and the job's clock offsets from the newest completed collectives."""
    per_group, noticed = _completions(ops)
    clocks = Clocks()
    # The watchdog polls at one interval on every rank: the tightest gap any rank shows bounds it.
    poll = min((gap for times in noticed.values() if (gap := _poll(times)) > 0), default=0)
    for group, samples in per_group.items():
        clocks.groups[group] = _group_clock(samples, poll)
    clocks.offsets, clocks.uncertainty_ns = _job_offsets(clocks.groups)
    return clocks


def _usable(op: MatchedOp) -> bool:
    """Whether an op's ends complete together: a collective every member issued, or a single send and
    its recv (a batch completes once all of its transfers do, with whichever peers)."""
    if op.missing or len(op.entries) < 2:
        return False
    return op.kind == "collective" or not op.in_batch


def _completions(ops: list[MatchedOp]) -> tuple[dict[Group, list[list[tuple[int, int]]]], dict[int, list[int]]]:
    """Per group, (member, completion time) of every member of its newest ops completed everywhere
    (collectives, and single sends with their recvs: the two ends of a transfer complete together);
    and per rank, every time its watchdog noticed a start or a completion of those ops."""
    chosen: dict[Group, list[MatchedOp]] = {}
    sizes: dict[Group, int] = {}  # the groups with an op to use, and their sizes
    for op in ops:
        if op.group not in sizes and _usable(op):
            sizes[op.group] = len(op.group.members)
    wanted = max(MIN_OPS, min(MAX_OPS, SAMPLE_BUDGET // max(1, sum(sizes.values()))))
    full = 0  # groups with as many ops as wanted: once all are, older ops are not looked at
    for op in reversed(ops):
        picked = chosen.get(op.group)
        if (picked is not None and len(picked) == wanted) or op.group not in sizes or not _usable(op):
            continue
        if picked is None:
            picked = chosen[op.group] = []
        if op.states.count(COMPLETED) == len(op.states):
            picked.append(op)
            full += len(picked) == wanted
            if full == len(sizes):
                break
    per_group = {}
    noticed: dict[int, list[int]] = {}
    # every chosen op's times, read at once: thousands of ops, each of every member
    held = iter(_state_times([op for picked in chosen.values() for op in picked]))
    for group, picked in chosen.items():
        samples = []
        for _, parts in zip(picked, held, strict=False):  # held goes on with the next group
            times = [(rank, completed) for rank, _, completed in parts]
            if all(time for _, time in times):
                samples.append(times)
                for rank, started, completed in parts:
                    seen = noticed.get(rank)
                    if seen is None:
                        seen = noticed[rank] = []
                    if started is not None:
                        seen.append(started)
                    seen.append(completed)  # type: ignore[arg-type]  # each checked above
        if len(samples) >= 3:
            per_group[group] = samples
    return per_group, noticed  # type: ignore[return-value]


def _state_times(ops: list[MatchedOp]) -> list[list[tuple[int, int | None, int | None]]]:
    """Per op, (rank, started, completed) of each rank's part, as its state entry (``state_entry``) says,
    ranks in the order of ``op.entries``. A rank whose entries are made from columns (``EntryRows``, or
    ``LinkedRows`` where its coalesced groups were linked) has the times of its last entry in each op read
    from its columns, in one call for all of ``ops``, with no entry made; where that entry's group is
    closed by another (a linked rank's), the closing entry's times (``LinkedRows.state_rows``). An op whose
    entries are not the ranks' rows, from its entries."""
    columns_of: dict[int, EntryRows | LinkedRows | None] = {}  # rank -> its entries, where made from columns
    readable: dict[int, bool] = {}  # rank -> whether they are
    rows_of: dict[int, list[int]] = {}  # rank -> the row of its last entry, op after op
    plan: list[list[int] | MatchedOp] = []  # per op: the ranks whose times are read, in order; or the op
    for op in ops:
        parts = op.entries
        if isinstance(parts, EntriesByRank):
            last_rows = dict(parts.rows())  # rank -> its last row in the op
            if not columns_of.keys() >= last_rows.keys():  # a rank met for the first time
                for rank in last_rows.keys() - columns_of.keys():
                    source = parts.entries_source(rank)
                    if isinstance(source, EntryRows) or (
                        isinstance(source, LinkedRows) and source.state_rows(()) is not None
                    ):
                        columns_of[rank] = source
                    else:
                        columns_of[rank] = None
                    readable[rank] = columns_of[rank] is not None
            if all(map(readable.__getitem__, last_rows)):
                for rank, row in last_rows.items():
                    rows_of.setdefault(rank, []).append(row)
                plan.append(list(last_rows))
                continue
        plan.append(op)
    read = {}
    for rank, rows in rows_of.items():
        columns = columns_of[rank]
        assert columns is not None
        state = columns.state_rows(rows) if isinstance(columns, LinkedRows) else rows
        assert state is not None  # readable
        started, completed = columns.values("time_started_ns", state), columns.values("time_completed_ns", state)
        read[rank] = zip(started, completed, strict=True)
    times = []
    for ranks in plan:
        if isinstance(ranks, MatchedOp):
            states = [(rank, state_entry(entries)) for rank, entries in ranks.entries.items()]
            times.append([(rank, entry.time_started_ns, entry.time_completed_ns) for rank, entry in states])
        else:
            times.append([(rank, *next(read[rank])) for rank in ranks])
    return times


def _group_clock(samples: list[list[tuple[int, int]]], poll: int) -> GroupClock:
    """One group's clock: each member's offset against the others, from the completions of its ops
    (``samples``: per op, (member, completion time)), and how sure that is."""
    offsets: dict[int, float] = {}
    residuals: dict[int, list[float]] = {}
    times: dict[int, list[int]] = {}  # member -> its completion times, op after op, as its residuals go
    for op in samples:
        for rank, time in op:
            times.setdefault(rank, []).append(time)
    # each op's members and times apart, which the rounds map over in C (a group of thousands of ranks)
    apart = [tuple(zip(*op, strict=True)) for op in samples]
    # Where ops join some members only (sends and recvs of a pipeline), an offset travels one hop
    # per round: as many rounds as the chain may be long.
    partial = any(len(op) < len(times) for op in samples)
    for _ in range(ROUNDS * len(times) if partial else ROUNDS):
        residuals = {rank: [] for rank in times}  # in the order members first come, as ``times``
        for ranks, completed in apart:
            centre = _trimmed_mean(list(map(sub, completed, map(offsets.get, ranks, repeat(0.0)))))
            for rank, residual in zip(ranks, map(sub, completed, repeat(centre)), strict=True):
                residuals[rank].append(residual)
        offsets = {rank: _trimmed_mean(values) for rank, values in residuals.items()}
        middle = statistics.median(offsets.values())
        offsets = {rank: value - middle for rank, value in offsets.items()}
    errors = {rank: _standard_error(_per_tick(times[rank], residuals[rank]), poll) for rank in offsets}
    uncertainty = max(errors.values())
    if math.isinf(uncertainty):
        return GroupClock({}, 0, False)
    estimates = {rank: round(value) for rank, value in offsets.items()}
    stands_out = any(abs(o) >= MIN_OFFSET_NS and abs(o) > SIGNIFICANCE * errors[r] for r, o in offsets.items())
    return GroupClock(estimates if stands_out else {}, round(uncertainty), True, estimates, poll)


def _job_offsets(groups: dict[Group, GroupClock]) -> tuple[dict[int, int], int]:
    """The job-wide offsets (rank -> ns) and how far they may be off: the groups' estimates chained
    into one clock, the largest group first, then each group that shares members with what is placed
    already, shifted to agree with it on those members (a group that shares none starts anew).

    They are applied (to the trace) only where one stands out: by ``MIN_OFFSET_NS`` and by twice the
    largest standard error of the groups chained; otherwise there is no offset to apply."""
    placed: dict[int, float] = {}
    errors: list[int] = []
    pending = sorted((g for g, c in groups.items() if c.aligned), key=lambda g: (-len(g.members), g.order))
    while pending:
        index = next((i for i, g in enumerate(pending) if any(m in placed for m in g.members)), 0)
        clock = groups[pending.pop(index)]
        local = clock.estimates
        shared = [r for r in local if r in placed]
        shift = statistics.mean(placed[r] - local[r] for r in shared) if shared else 0.0
        for rank, offset in local.items():
            placed.setdefault(rank, offset + shift)
        errors.append(clock.uncertainty_ns)
    if not placed:
        return {}, 0
    middle = statistics.median(placed.values())
    offsets = {rank: round(offset - middle) for rank, offset in placed.items()}
    error = max(errors)
    if not any(abs(o) >= MIN_OFFSET_NS and abs(o) > DISPLAY_SIGNIFICANCE * error for o in offsets.values()):
        return {}, 0
    return {rank: offset for rank, offset in offsets.items() if offset}, error


def _per_tick(times: list[int], residuals: list[float]) -> list[float]:
    """One residual per distinct completion time: completions the watchdog noticed on one poll share
    its delay, so they count once."""
    by_time: dict[int, list[float]] = {}
    for time, residual in zip(times, residuals, strict=True):
        by_time.setdefault(time, []).append(residual)
    return [sum(values) / len(values) for values in by_time.values()]


def _trimmed_mean(values: list[float]) -> float:
    """The mean of ``values`` without the highest and lowest tenth."""
    ordered = sorted(values)
    cut = len(ordered) // 10
    kept = ordered[cut : len(ordered) - cut] or ordered
    return sum(kept) / len(kept)


def _poll(times: list[int]) -> int:
    """The smallest gap between a rank's polls: the step of its watchdog's polls when it notices
    starts and completions on polls (or a longer gap, when ops are sparse); 0: none.

    Times less than ``SAME_POLL_NS`` apart count as one poll (the watchdog stamps each work it looks at
    as it goes). Starts count as well as completions: a short op started and completed on two polls
    in a row shows the step even where ops are far apart."""
    ticks: list[int] = []
    for time in sorted(times):
        if not ticks or time - ticks[-1] >= SAME_POLL_NS:
            ticks.append(time)
    return min((b - a for a, b in itertools.pairwise(ticks)), default=0)


def _standard_error(residuals: list[float], poll_ns: int) -> float:
    """The standard error of the trimmed mean of ``residuals`` (inf with too few of them).

    Never below what the watchdog's polling alone allows: a rank's delays are spread over its poll
    interval, and a handful of samples can all fall alike by chance, with no spread to show for it."""
    if len(residuals) < MIN_TICKS:
        return math.inf
    ordered = sorted(residuals)
    cut = len(ordered) // 10
    kept = ordered[cut : len(ordered) - cut]
    floor = poll_ns / 2
    # the exact deviation (statistics works in fractions: slow) only where it may be above the floor
    spread = floor if floor > 0 and _clearly_below(kept, floor) else max(statistics.pstdev(kept), floor)
    return spread / math.sqrt(len(kept))


def _clearly_below(values: list[float], floor: float) -> bool:
    """Whether the population standard deviation of ``values`` is below ``floor`` by far more than floats
    can be off: under half of it, computed in floats from values below 10**12 (each deviation then off
    by under a thousandth of a nanosecond, where the floor is at least SAME_POLL_NS / 2)."""
    if not all(abs(value) < 1e12 for value in values):  # NaN too
        return False
    mean = math.fsum(values) / len(values)
    variance = math.fsum((value - mean) ** 2 for value in values) / len(values)
    return math.sqrt(variance) < floor / 2
