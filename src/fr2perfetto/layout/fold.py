"""Decide what a trace shows, so that the trace of a huge job still opens in a browser.

Pure functions from a diagnosed job to a ``View``: which ranks get a process (and which ranks each
one stands for), and from when on each group's history is shown in full. Nothing is folded while
the whole trace fits under the size limit; beyond it, ranks with identical op sequences collapse
into one process and history older than a window before the first problem is summarised. The
ranks and groups the findings name are never folded.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field

from ..base.model import MAX_RANK, OK, Finding, Group, MatchedOp, ranks_label
from ..read.job import Job

# Measured on NCCL dumps with five-frame stacks: a slice costs about this much in a trace.
BYTES_PER_OP = 280
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_WINDOW = 100  # ops of each group kept before its first problem, when folding
MIN_WINDOW = 5


@dataclass(slots=True)
class View:
    """What to draw: processes (a representative rank and the ranks it stands for) and history."""

    processes: list[tuple[int, tuple[int, ...]]]
    # group -> ops that began before this time are summarised, not drawn (absent: all drawn)
    cutoffs: dict[Group, int] = field(default_factory=dict)
    groups: set[Group] | None = None  # None: every group
    notes: list[str] = field(default_factory=list)
    estimated_bytes: int = 0
    full_bytes: int = 0
    to_fit: bool = False  # folded to stay under the size limit (not only as the options chose)

    @property
    def folded(self) -> bool:
        return bool(self.notes)


def estimate_bytes(job: Job) -> int:
    """Size of the full trace, from the number of entries."""
    return sum(len(d.entries) for d in job.dumps.values()) * BYTES_PER_OP


def full_view(job: Job) -> View:
    """Everything: a process per rank, every op."""
    size = estimate_bytes(job)
    return View([(rank, (rank,)) for rank in job.ranks], estimated_bytes=size, full_bytes=size)


def parse_ranks(text: str) -> list[tuple[int, int]]:
    """``0-7,85`` to [(0, 7), (85, 85)]; raises ValueError saying what is wrong, in one line."""
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not re.fullmatch(r"\d{1,9}(-\d{1,9})?", part):
            raise ValueError(f"{part!r} is neither a rank nor a range of ranks (expected e.g. 0-7,85)")
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first:
            raise ValueError(f"{part!r} ends before it starts")
        if last >= MAX_RANK:
            raise ValueError(f"rank {last} is beyond any job's ranks (at most {MAX_RANK - 1})")
        ranges.append((first, last))
    if not ranges:
        raise ValueError("no rank given (expected e.g. 0-7,85)")
    return ranges


def choose_ranks(ranges: list[tuple[int, int]], ranks: list[int]) -> tuple[set[int], str | None]:
    """The ranks of a job (``ranks``, sorted) that ``ranges`` select, and why the choice is refused
    (None: it is not): every rank asked for must be one of the job's."""
    chosen: set[int] = set()
    absent: list[str] = []
    for first, last in sorted(ranges):
        inside = ranks[bisect.bisect_left(ranks, first) : bisect.bisect_right(ranks, last)]
        chosen.update(inside)
        expected = first
        for rank in [*inside, last + 1]:  # the gaps between the job's ranks in this range
            if rank > expected:
                absent.append(str(expected) if rank - 1 == expected else f"{expected}-{rank - 1}")
            expected = rank + 1
    if not absent:
        return chosen, None
    return chosen, f"no rank {','.join(absent[:8])}{'…' if len(absent) > 8 else ''} in this job (its ranks: " \
        f"{ranks_label(ranks) or 'none'})"  # fmt: skip


def plan_view(
    job: Job,
    ops: list[MatchedOp],
    findings: list[Finding],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    full: bool = False,
    ranks: set[int] | None = None,
    groups: set[str] | None = None,
    window: int | None = None,
) -> View:
    """Choose what the trace shows; see the module docstring for the rules."""
    whole = full_view(job)
    if full or (whole.estimated_bytes <= max_bytes and ranks is None and groups is None and window is None):
        return whole
    notes: list[str] = []
    shown_ranks = [r for r in job.ranks if ranks is None or r in ranks]
    if ranks is not None:
        notes.append(f"only ranks {ranks_label(shown_ranks) or 'none'} (--ranks)")
    shown_groups: set[Group] | None = None
    if groups is not None:
        shown_groups = {g for g in job.groups if g.name in groups or g.desc in groups}
        notes.append(f"only groups {', '.join(sorted(groups))} (--groups)")
    protected_ranks = {r for f in findings for r in f.culprit_ranks}
    # a straggler is seen in any window of its group's ops: its finding keeps no history whole
    protected_groups = {f.group for f in findings if f.group is not None and f.kind != "straggler"}
    by_group: dict[Group, list[MatchedOp]] = defaultdict(list)
    for op in ops:
        by_group[op.group].append(op)
    fold_needed = whole.estimated_bytes > max_bytes
    size = whole.estimated_bytes
    current = window if window is not None else (DEFAULT_WINDOW if fold_needed else None)
    while True:
        cutoffs = _cutoffs(by_group, current, protected_groups) if current is not None else {}
        processes: list[tuple[int, tuple[int, ...]]] = (
            _fold_ranks(job, ops, shown_ranks, protected_ranks, cutoffs, shown_groups)
            if fold_needed
            else [(r, (r,)) for r in shown_ranks]
        )
        size = _estimate(job, processes, cutoffs, by_group, shown_groups)
        if size <= max_bytes or current is None or current <= MIN_WINDOW:
            break
        current = max(MIN_WINDOW, current // 2)
    folded = sum(len(stands) - 1 for _, stands in processes)
    if folded:
        notes.append(f"{folded} ranks with identical op sequences folded into {len(processes)} processes")
    if cutoffs:
        hidden = sum(1 for g, cut in cutoffs.items() for op in by_group[g] if op.first_time_ns < cut)
        notes.append(
            f"{hidden} older ops summarised (the last {current} ops of each group before its first problem kept)"
        )
    return View(processes, cutoffs, shown_groups, notes, size, whole.estimated_bytes, fold_needed)


def _cutoffs(by_group: dict[Group, list[MatchedOp]], window: int, protected: set[Group]) -> dict[Group, int]:
    """Per group: the start time of the first op kept, ``window`` ops before its first problem."""
    cutoffs: dict[Group, int] = {}
    for group, group_ops in by_group.items():
        if group in protected:
            continue
        ordered = sorted(group_ops, key=lambda o: (o.kind, o.seq))
        first_problem = next((i for i, o in enumerate(ordered) if o.status != OK), len(ordered))
        keep_from = max(0, first_problem - window)
        if keep_from > 0:
            cutoffs[group] = min(o.first_time_ns for o in ordered[keep_from:]) if keep_from < len(ordered) else 2**63
    return cutoffs


def _fold_ranks(
    job: Job,
    ops: list[MatchedOp],
    shown: list[int],
    protected: set[int],
    cutoffs: dict[Group, int],
    groups: set[Group] | None,
) -> list[tuple[int, tuple[int, ...]]]:
    """Collapse ranks whose shown ops are the same sequence (by group kind, seq, op and outcome)."""
    shown_set = set(shown)
    # Each distinct (op shape, state) is a number; a rank's signature is its sequence of numbers.
    tokens: dict[tuple[object, ...], int] = {}
    signatures: dict[int, list[int]] = {r: [] for r in shown}
    for op in ops:
        if groups is not None and op.group not in groups:
            continue
        if op.first_time_ns < cutoffs.get(op.group, -1):
            continue
        shape = (op.group.desc, len(op.group.members), op.kind, op.seq, op.name, op.status)
        by_state: dict[str, int] = {}
        for rank, state in zip(op.entries, op.states, strict=True):
            if rank in shown_set:
                token = by_state.get(state)
                if token is None:
                    token = by_state[state] = tokens.setdefault((*shape, state), len(tokens))
                signatures[rank].append(token)
        for rank in op.missing:
            if rank in shown_set:
                signatures[rank].append(tokens.setdefault((*shape, "never issued"), len(tokens)))
    classes: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for rank in shown:
        key: tuple[object, ...] = (
            ("rank", rank) if rank in protected or rank not in job.dumps else tuple(signatures[rank])
        )
        classes[key].append(rank)
    return sorted((members[0], tuple(members)) for members in classes.values())


def _estimate(
    job: Job,
    processes: list[tuple[int, tuple[int, ...]]],
    cutoffs: dict[Group, int],
    by_group: dict[Group, list[MatchedOp]],
    groups: set[Group] | None,
) -> int:
    drawn = {rep for rep, _ in processes}
    count = 0
    for group, group_ops in by_group.items():
        if groups is not None and group not in groups:
            continue
        cut = cutoffs.get(group, -1)
        for op in group_ops:
            if op.first_time_ns >= cut:
                if len(drawn) < len(op.entries):
                    count += sum(1 for r in drawn if r in op.entries)
                else:
                    count += sum(1 for r in op.entries if r in drawn)
    return count * BYTES_PER_OP
