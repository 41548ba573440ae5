"""Stragglers, group by group: a member that enqueues last, by a clear margin, in most ops of one group.

Slowness shows in one group at a time (a slow NVLink peer in a 2-rank tp group, a slow host in one dp
ring), so each group is judged on its own ops: in each op every member issued, the last member to
enqueue it and its margin over the next one. Times are compared on the common clock (``clocks``);
where no offset could be estimated (gloo records no completion), ranks on different hosts are
compared only by a margin larger than any plausible clock skew.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import repeat
from operator import sub

from ..base.model import Group, MatchedOp
from .evidence import Evidence

MIN_OPS = 5  # a group is judged on at least this many ops
MIN_SHARE = 0.6  # last in at least this share of them
MIN_LAG_NS = 5_000_000  # by at least this much, once clocks are aligned
UNALIGNED_LAG_NS = 100_000_000  # by at least this much when clocks may differ and could not be aligned


@dataclass(slots=True)
class Straggler:
    """A member of ``group`` that was last in ``count`` of its ``considered`` ops."""

    rank: int
    group: Group
    count: int
    considered: int
    median_lag_ns: int  # behind the median of the other members
    p90_lag_ns: int
    threshold_ns: int
    aligned: bool  # times were compared on estimated common clocks


def find_stragglers(evidence: Evidence) -> list[Straggler]:
    """Every (group, member) that is a straggler of that group, the slowest first. Each op judged has
    its median enqueue time recorded in ``evidence.enqueue_medians``."""
    hosts = {dump.host for dump in evidence.job.dumps.values()}
    one_host = len(hosts) == 1 and None not in hosts
    considered: dict[Group, int] = defaultdict(int)
    lags: dict[tuple[Group, int], list[int]] = defaultdict(list)
    judged: dict[Group, tuple[dict[int, int], int, bool]] = {}  # group -> (offsets, threshold, aligned)
    for op in evidence.ops:
        parts = len(op.created_ns)  # a collective's: one per rank with a part, as ``len(op.entries)`` counts, but in C
        if parts < 2 or op.kind != "collective" or op.missing:
            continue
        group = op.group
        how = judged.get(group)
        if how is None:
            how = judged[group] = _how_to_judge(evidence, group, one_host)
        considered[group] += 1
        _judge(op, how, evidence, lags)
    found = []
    for (group, rank), values in lags.items():
        total = considered[group]
        if total < MIN_OPS or len(values) < MIN_SHARE * total:
            continue
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        _, threshold, aligned = judged[group]
        median = int(statistics.median(ordered))
        found.append(Straggler(rank, group, len(values), total, median, p90, threshold, aligned))
    # Lateness spreads to the ranks that wait for a straggler, and adds up: a rank late in its own tp
    # group delays its whole pipeline, whose members then come late to dp ops, later than it was. The
    # straggler itself is late in its own group as well as in theirs: ranks late in more groups first.
    groups_late = Counter(s.rank for s in found)
    return sorted(found, key=lambda s: (-groups_late[s.rank], -s.median_lag_ns, s.group.order, s.rank))


def _judge(
    op: MatchedOp, how: tuple[dict[int, int], int, bool], evidence: Evidence, lags: dict[tuple[Group, int], list[int]]
) -> None:
    """One op: its median enqueue time, and its latest member's lag where that member came last by
    ``how``'s margin."""
    offsets, threshold, _ = how
    created = op.created_ns  # in the order of op.entries
    if offsets:
        created = list(map(sub, created, map(offsets.get, op.entries, repeat(0))))
    ordered = sorted(created)
    evidence.enqueue_medians[op.op_key] = ordered[len(ordered) // 2]
    latest = ordered[-1]
    if latest - ordered[-2] < threshold:
        return
    rank = list(op.entries)[created.index(latest)]
    lags[(op.group, rank)].append(int(latest - _median(ordered, len(ordered) - 1)))


def _median(ordered: list[int], count: int) -> float:
    """The median of the first ``count`` values of a sorted list (``statistics.median`` of them)."""
    middle = count // 2
    return ordered[middle] if count % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def group_offsets(evidence: Evidence) -> dict[Group, dict[int, int]]:
    """Per group whose clocks could be aligned, each member's offset (rank -> ns its clock runs ahead of
    the group's): the clock on which its members' enqueue times are compared."""
    return {group: clock.estimates for group, clock in evidence.clocks.groups.items() if clock.aligned}


def _how_to_judge(evidence: Evidence, group: Group, one_host: bool) -> tuple[dict[int, int], int, bool]:
    """(offsets to subtract, the margin that counts, whether clocks are aligned) for one group."""
    clock = evidence.clocks.groups.get(group)
    if clock is not None and clock.aligned:
        # Two members' estimates may each be off by their error, their difference by 1.4 times it; and
        # where watchdogs notice completions on polls, every sample may share the gap between two polls.
        margin = max(MIN_LAG_NS, round(3 * 1.42 * clock.uncertainty_ns), clock.poll_ns)
        return clock.estimates, margin, True
    return {}, MIN_LAG_NS if one_host else UNALIGNED_LAG_NS, False
