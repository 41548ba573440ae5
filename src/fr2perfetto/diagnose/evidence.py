"""Who waits for whom: each rank's blocking op, what it waits for there, and the ops queued behind it.

Streams decide what can block (``ProcessGroupNCCL.cpp``): kernels of one stream run in order, so only
the first op of a stream that did not complete can be waiting for another rank; the ops queued behind
it wait for it, and are victims. With timing on, a kernel that began is ``started``, and the first op of
a blocked stream is the one that started: a rank's part that is still ``scheduled`` while its peers'
are ``started`` is queued behind something of its own. Without timing (or on gloo) every pending part
looks alike, and a rank's earliest op that waits for another rank stands for its blocking op.

A rank's blocking op waits:
- for the members that never issued it (``MISSING``), or left no dump (``NO_DUMP``);
- for the members whose kernel has not started while its own has (``NOT_STARTED``), or, where states
  cannot tell, who are blocked in an earlier op of their own (``HELD``): their stream is held by an op
  of their own, which the wait-for graph follows;
- for nobody, when the members disagree on its arguments (``MISMATCH``) or every member is in it and
  none completed (``STUCK``): the op itself is the cause.

``blame`` follows these waits to where they end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.model import COMPLETED, MISMATCH, MISSING, OK, SCHEDULED, STARTED, STUCK, MatchedOp, state_entry
from ..match.clocks import Clocks, estimate_clocks
from ..match.ops import tracks_completion
from ..read.job import Job

WAIT_MISSING, WAIT_NO_DUMP, WAIT_NOT_STARTED, WAIT_HELD, WAIT_MISMATCH, WAIT_STUCK = (
    "never issued", "no dump", "not started", "held elsewhere", "mismatch", "stuck",
)  # fmt: skip
_ENTRIES_CHECKED_FOR_TIMING = 2000  # start events are on for every op or none: the newest entries tell


@dataclass(slots=True)
class Wait:
    """A rank's blocking op and what it waits for there."""

    op: MatchedOp
    on: tuple[int, ...]  # the ranks it waits for (none: the op itself is the cause)
    reason: str  # WAIT_*


@dataclass(slots=True)
class Evidence:
    """What the rules look at: the job, its matched ops, its clocks, and who waits for whom."""

    job: Job
    ops: list[MatchedOp]
    # the ops that are not ``OK``, in the order of ``ops``: what the rules that look for a cause read. The
    # others (at thousands of ranks, all but a handful) completed alike on every member, or nothing says
    # otherwise; only what measures time (clocks, stragglers, late comers) reads them.
    unsettled: list[MatchedOp] = field(default_factory=list)
    waits: dict[int, Wait] = field(default_factory=dict)  # rank -> its blocking op
    queued: dict[int, list[MatchedOp]] = field(default_factory=dict)  # rank -> pending ops behind it
    timed: bool = False  # start events were recorded (TORCH_NCCL_ENABLE_TIMING)
    clocks: Clocks = field(default_factory=Clocks)
    # collective's op key -> when its members enqueued it, the (upper) median on its group's clock
    # (``stragglers.group_offsets``); filled as stragglers are looked for, read by the lateness counters
    enqueue_medians: dict[int, int] = field(default_factory=dict)

    def blocked_on(self, rank: int) -> MatchedOp | None:
        """``rank``'s blocking op, if it has one."""
        wait = self.waits.get(rank)
        return wait.op if wait is not None else None


def gather_evidence(job: Job, ops: list[MatchedOp]) -> Evidence:
    """Find every rank's blocking op and what it waits for, the ops queued behind them, and the clocks."""
    unsettled = [op for op in ops if op.status != OK]
    evidence = Evidence(job, ops, unsettled, timed=_start_events_recorded(job), clocks=estimate_clocks(ops))
    no_dump = set(job.missing_ranks)
    listed = _groups_listed(job) if no_dump else set()
    # rank -> unit -> (when the rank issued it, its waits); a unit is one op, or one batch of sends and
    # recvs, which completes only once all of them do: it waits for what any of them waits for
    units: dict[int, dict[object, tuple[int, list[Wait]]]] = {}
    for op in ops if no_dump else unsettled:  # an OK op is waited in only where a member left no dump
        why = _why_pending(op, no_dump, evidence.timed) or _waits_on_lost_dump(job, op, no_dump, listed)
        if why is None:
            continue
        reason, on, blocked = why
        wait = Wait(op, on, reason)
        created = dict(zip(op.entries, op.enqueued_ns(), strict=True))
        for rank in blocked:
            closing = op.entries[rank][-1].closed_by if op.kind == "p2p" else None
            unit = closing if closing is not None else id(op)  # a batch by value: made apart, equal
            issued, waits = units.setdefault(rank, {}).setdefault(unit, (created[rank], []))
            waits.append(wait)
            if created[rank] < issued:
                units[rank][unit] = (created[rank], waits)
    blocked_since = {}
    unit_waits: dict[int, list[Wait]] = {}
    for rank, by_unit in units.items():
        issued, waits = min(by_unit.values(), key=lambda item: item[0])
        evidence.waits[rank] = _strongest(waits)
        blocked_since[rank] = issued
        unit_waits[rank] = waits
    _held_elsewhere(evidence, unit_waits)
    _find_queued(evidence, blocked_since)
    return evidence


_STRENGTH = (WAIT_MISSING, WAIT_NO_DUMP, WAIT_NOT_STARTED, WAIT_MISMATCH, WAIT_STUCK)


def _strongest(waits: list[Wait]) -> Wait:
    """One wait for a unit: the strongest reason among its ops', waiting for every rank any of them
    waits for for that reason."""
    if len(waits) == 1:
        return waits[0]
    reason = min((w.reason for w in waits), key=_STRENGTH.index)
    if reason == WAIT_MISSING:
        # A rank whose kernel of one op never started and that never issued another of the batch: its
        # GPU is held (and its CPU waits for it at its next sync, so it issues nothing more): that says why.
        missing = {r for w in waits if w.reason == WAIT_MISSING for r in w.on}
        not_started = {r for w in waits if w.reason == WAIT_NOT_STARTED for r in w.on}
        if missing <= not_started:
            reason = WAIT_NOT_STARTED
    chosen = [w for w in waits if w.reason == reason]
    on = tuple(dict.fromkeys(r for w in chosen for r in w.on))
    return Wait(chosen[0].op, on, reason)


def _held_elsewhere(evidence: Evidence, unit_waits: dict[int, list[Wait]]) -> None:
    """An op every member issued and none completed is a hang inside it only if every member is stuck
    in it: a member blocked in a unit of its own without it, or whose unit waits for something else
    (a rank that never issued its part, a member held elsewhere in turn), holds it (its kernel waits
    behind theirs, whatever its state says without timing): the others wait for that member.

    ``unit_waits`` holds each rank's waits in its blocking unit (one op, or a whole batch): a batch is
    held by any of its transfers, and a rank whose part is in a held batch holds its peers in turn
    (rank 0's recv waits for rank 2's batch, which waits for rank 4, blocked in an op rank 5 never
    issued). A hold never closes a loop of holds alone: two ranks stuck in one batch do not hold each
    other through a third."""
    waits = evidence.waits
    in_unit = {rank: {id(w.op) for w in unit} for rank, unit in unit_waits.items()}

    def stuck_ops(rank: int) -> list[MatchedOp]:
        return [w.op for w in unit_waits[rank] if w.reason == WAIT_STUCK]

    def holds_back(start: int, target: int) -> bool:
        """Whether holds alone lead from ``start`` to ``target``."""
        seen, todo = {start}, [start]
        while todo:
            rank = todo.pop()
            if rank == target:
                return True
            if waits[rank].reason == WAIT_HELD:
                fresh = [r for r in waits[rank].on if r not in seen]
                seen.update(fresh)
                todo += fresh
        return False

    todo = sorted(rank for rank, wait in waits.items() if wait.reason == WAIT_STUCK)
    while todo:
        rank = todo.pop()
        if waits[rank].reason != WAIT_STUCK:
            continue
        for op in stuck_ops(rank):
            others = [r for r in op.entries if r != rank and r in waits]
            held = [
                r for r in others
                if id(op) not in in_unit[r]  # blocked in a unit of its own
                or (waits[r].reason != WAIT_STUCK and (waits[r].reason != WAIT_HELD or not holds_back(r, rank)))
            ]  # fmt: skip
            if held:
                waits[rank] = Wait(op, tuple(held), WAIT_HELD)
                # the ranks stuck with it in its unit may now be held through it
                todo += [r for o in stuck_ops(rank) for r in o.entries if r != rank and r in waits
                         and waits[r].reason == WAIT_STUCK]  # fmt: skip
                break


def _start_events_recorded(job: Job) -> bool:
    """Whether start events were on (for every op or none): a ``started`` state says so, and a completed
    op tells either way by whether it has a start time."""
    for dump in job.dumps.values():
        for entry in reversed(dump.entries[-_ENTRIES_CHECKED_FOR_TIMING:]):
            last = state_entry([entry])
            if last.state == STARTED:
                return True
            if last.state == COMPLETED and last.time_completed_ns is not None:
                if last.time_started_ns is not None:
                    return True
                break  # this rank's completed op says timing was off; another rank may say otherwise
    return False


def _why_pending(op: MatchedOp, no_dump: set[int], timed: bool) -> tuple[str, tuple[int, ...], list[int]] | None:
    """(reason, ranks waited for, ranks blocked in it) for an op some rank is stuck in; None otherwise."""
    if op.status == OK:
        return None  # completed everywhere, or nothing says otherwise (the matcher's scan counted)
    ranks = list(op.entries)
    pending = [
        rank for rank, state in zip(ranks, op.states, strict=True)
        if state != COMPLETED and tracks_completion(state_entry(op.entries[rank]))
    ]  # fmt: skip
    # With timing, only a rank whose kernel started is blocked in an op; one still scheduled is queued.
    started = [r for r, s in zip(ranks, op.states, strict=True) if s == STARTED]
    if op.status == MISSING:
        # gloo records no completion: every rank in an op someone never issued is taken to wait in it
        waiting = started if timed else [r for r, s in zip(ranks, op.states, strict=True) if s != COMPLETED]
        return WAIT_MISSING, op.missing, waiting
    if not pending:
        return None
    blocked = started if timed else pending
    dumpless = tuple(r for r in op.unknown if r in no_dump)
    if dumpless:
        return WAIT_NO_DUMP, dumpless, blocked
    if op.status == MISMATCH:
        return WAIT_MISMATCH, (), blocked
    if timed:
        scheduled = tuple(r for r, s in zip(ranks, op.states, strict=True) if s == SCHEDULED)
        if started and scheduled:
            return WAIT_NOT_STARTED, scheduled, started
        if op.status == STUCK and started:
            return WAIT_STUCK, (), started
        return None  # no kernel of it started anywhere: it is queued behind something on every rank
    if op.status == STUCK:
        return WAIT_STUCK, (), pending
    return None


def _waits_on_lost_dump(
    job: Job, op: MatchedOp, no_dump: set[int], listed: set[str]
) -> tuple[str, tuple[int, ...], list[int]] | None:
    """(``WAIT_NO_DUMP``, the members without a dump, the ranks still in it) for an op whose entries
    cannot say whether it completed (gloo's stay ``scheduled``), where a member left no dump and the
    ranks' own ``pg_status`` says they had not completed it when they dumped; None otherwise.

    ``pg_status`` holds, per process group (keyed by the rank's own pg_id), the last op enqueued,
    started and completed: ``FlightRecorder::getPgStatus`` writes ``pgStatus_`` as
    ``last_enqueued_collective`` / ``last_started_collective`` / ``last_completed_collective``. gloo
    sets them from the op's ``seq_`` (``ProcessGroupGloo::enqueue`` at enqueue, the work's completion
    callback at the end), which the entry's ``op_id`` is too: an entry whose ``op_id`` is past the
    last completed and not past the last enqueued was still in flight on that rank. A failed op
    counts as completed there, so a rank that is still in it was still waiting."""
    if not no_dump or op.status != OK:
        return None  # checked first: it settles nearly every op of a job
    dumpless = tuple(r for r in op.unknown if r in no_dump)
    if not dumpless and op.group.name in listed:
        return None
    # A group known only from the entries under its name (gloo's pg_config lists no ranks) lacks the
    # members that left no dump: any of them may be the one it waits for.
    dumpless = dumpless or tuple(sorted(no_dump))
    waiting = []
    for rank, entries in op.entries.items():
        entry = state_entry(entries)
        dump = job.dumps.get(rank)
        if dump is None or tracks_completion(entry):
            continue  # its own state says it: ``_why_pending`` had its say
        status = dump.pg_status.get(str(entry.pg_id))
        if status is not None and status[2] < entry.op_id <= status[0]:
            waiting.append(rank)
    return (WAIT_NO_DUMP, dumpless, waiting) if waiting else None


def _groups_listed(job: Job) -> set[str]:
    """The groups some dump's ``pg_config`` lists the members of; any other is known only from the
    entries recorded under its name (gloo's lists none once subgroups exist)."""
    return {name for dump in job.dumps.values() for name, config in dump.pg_config.items() if config.ranks}


def _find_queued(evidence: Evidence, blocked_since: dict[int, int]) -> None:
    """Each blocked rank's later pending ops whose kernel did not start: queued behind its blocking op
    (``blocked_since``: when each rank issued its blocking op)."""
    if not blocked_since:
        return
    for op in evidence.unsettled:
        for rank, state, created in zip(op.entries, op.states, op.enqueued_ns(), strict=True):
            since = blocked_since.get(rank)
            if since is None or state == COMPLETED or created <= since or evidence.waits[rank].op is op:
                continue
            if state == STARTED or not tracks_completion(state_entry(op.entries[rank])):
                continue  # its kernel runs (another stream), or gloo: nothing is known to be queued
            evidence.queued.setdefault(rank, []).append(op)
