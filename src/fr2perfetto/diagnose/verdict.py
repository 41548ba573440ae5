"""Turn matched ops into findings and one verdict: which rank, which group, which op, and why.

The diagnosis is a list of rules (``RULES``), each a small function from the ``Evidence`` of a job
(who waits for whom, ``evidence``) to its findings. ``diagnose`` runs them all, then ``verdict``
weighs the findings: those about a root cause (a rank nothing blocks, a deadlock, an op that is a
cause by itself) come first, earliest first; findings about victims follow.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..base.model import (
    INCOMPLETE,
    MISMATCH,
    MISSING,
    STUCK,
    Finding,
    Frame,
    Group,
    MatchedOp,
    head_entry,
    inner_entries,
    ops_by_key,
    state_entry,
)
from ..base.words import group_called, group_in_words, lateness_track, ranks_text, verb, where
from ..match.arguments import recorded_sizes
from ..match.ops import NO_COMPLETION_BACKENDS, tracks_completion
from ..read.job import Job
from .beside import (
    KIND_CRASH,
    KIND_STUCK_CPU,
    blind_spots,
    contradictions,
    ended_first,
    rule_crashed,
    rule_stuck_cpu,
    stopped_by_signal,
    unseen,
)
from .blame import Blame, assign_blame
from .corroborate import corroborate
from .evidence import WAIT_NOT_STARTED, Evidence, gather_evidence
from .frozen import Freeze, find_freeze
from .stragglers import find_stragglers
from .timeouts import find_late_entries

# Finding kinds, as the report names them.
KIND_MISSING = "missing"
KIND_DEADLOCK = "deadlock"
KIND_STUCK = "stuck"
KIND_P2P = "p2p"
KIND_NO_DUMP = "no_dump"
KIND_NOT_STARTED = "not_started"
KIND_STRAGGLER = "straggler"
KIND_AFTER_TIMEOUT = "after_timeout"
MISMATCH_KINDS = {"size": "size_mismatch", "dtype": "dtype_mismatch", "op": "type_mismatch"}

# Verdict statuses and root-cause categories, in the words people use.
HANG, MISMATCH_STATUS, HEALTHY, UNDECIDED, CRASH = "hang", "mismatch", "healthy", "undecided", "crash"
SLOW = "slow"  # nothing hung, but a rank holds the others up: never "healthy" with a culprit named
CATEGORY_NEVER_REACHED = "a rank never reached the collective (CPU-side divergence or a stuck rank)"
CATEGORY_P2P = "a send or recv was never matched (its peer never posted the other end)"
CATEGORY_DEADLOCK = "deadlock across process groups (ranks wait for each other in different groups)"
CATEGORY_ORDER = "ranks issued different collectives at the same point (their order or code path differs)"
CATEGORY_ARGUMENTS = "wrong collective arguments (ranks disagree on size or dtype)"
CATEGORY_GPU_HANG = "GPU/NCCL/network hang (every rank entered the op and none completed)"
CATEGORY_NOT_STARTED = "a rank's GPU never started the op (a kernel of its own holds its stream)"
CATEGORY_NO_DUMP = "missing dump (ranks the others wait for left no dump)"
CATEGORY_STRAGGLER = "slow rank (a straggler enqueues collectives late)"
CATEGORY_CRASH = "a rank crashed (its log or .ended file says why) and left no dump"
CATEGORY_OWN_ERROR = (
    "a rank failed of an error of its own (its log or .ended file says which); the others' failures followed"
)
CATEGORY_STUCK_CPU = "a rank stays in its own code (a loop, a data loader, I/O) while the others wait for it"
CATEGORY_CONTRADICTED = "the dumps show no problem, but what lies beside them says the job failed or stopped"
CRASH_SAYS = ("'s log says: ", "'s .ended file says: ")  # ``corroborate.says``
CATEGORY_AFTER_TIMEOUT = "a rank reached the collective only after its peers had timed out in it (a stuck rank)"
CATEGORY_UNSURE = "the dumps show no problem, but they cannot show everything a hang needs"
CATEGORY_NO_DUMP_UNKNOWN = "missing dump (nothing says whether the ranks without one were well)"
CATEGORY_NONE = "none"

# Exit codes of ``analyze``: a script acts on them, so each status that asks for something else has one.
EXIT_HEALTHY, EXIT_FINDINGS, EXIT_UNUSABLE, EXIT_UNDECIDED = 0, 1, 2, 3


def exit_code(status: str) -> int:
    """The exit code of a verdict's status: 0 only for ``healthy`` (nothing is wrong, and the evidence to say
    so is all there), 3 for ``undecided`` (something is missing to say either way), 1 for every problem
    found. (2 is for input that could not be used at all.)"""
    if status == HEALTHY:
        return EXIT_HEALTHY
    return EXIT_UNDECIDED if status == UNDECIDED else EXIT_FINDINGS


@dataclass(slots=True)
class Verdict:
    """The answer first: status, culprits in order of confidence, root cause and a one-liner."""

    status: str
    culprit_ranks: tuple[int, ...]
    category: str
    summary: str
    evidence: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Diagnosis:
    """The verdict and the findings behind it, strongest first in the verdict's evidence."""

    verdict: Verdict
    findings: list[Finding]
    evidence: Evidence | None = None
    roles: dict[tuple[int, int], str] = field(default_factory=dict)  # see ``victim_roles``
    notes: list[str] = field(default_factory=list)  # what the logs say, checked against the dumps
    caveats: list[str] = field(default_factory=list)  # what these dumps cannot show (``beside.blind_spots``)
    freeze: Freeze | None = None  # the window in which no rank moved, from the stack snapshots
    next_steps: list[str] = field(default_factory=list)  # what to do next (``next_steps``; set by the caller)


@dataclass(slots=True)
class _Context:
    """What every rule reads: the evidence and where each wait leads."""

    evidence: Evidence
    blame: Blame


def last_op_text(evidence: Evidence, rank: int) -> str:
    """What a rank did last, as evidence: ``its last op: all_reduce #3 of tp (...)``."""
    dump = evidence.job.dumps.get(rank)
    if dump is None:
        return f"rank {rank} left no dump"
    if not dump.entries:
        return f"rank {rank} recorded no op at all"
    last = dump.entries[-1]
    group = evidence.job.group_of[(rank, last.group_name)]
    seq = last.p2p_seq if last.is_p2p else last.collective_seq
    name = f"{last.op} #{seq} of {group_in_words(group)}"
    if last.backend in NO_COMPLETION_BACKENDS:  # its state never moves past scheduled: it says nothing
        return f"rank {rank}'s last op recorded: {name}, state unknown: {last.backend} records no completion"
    return f"rank {rank}'s last op: {name}, {state_entry([last]).state}"


def culprit_frames(evidence: Evidence, rank: int) -> tuple[Frame, ...]:
    """The culprit's stack: where it issued its last op (its best-known position)."""
    dump = evidence.job.dumps.get(rank)
    if dump is None or not dump.entries:
        return ()
    for entry in reversed(dump.entries):
        if entry.frames:
            return entry.frames
    return ()


def _op_finding(
    context: _Context,
    kind: str,
    op: MatchedOp,
    *,
    ranks: tuple[int, ...],
    culprits: tuple[int, ...],
    lines: list[str],
    summary: str,
    name: str = "",
) -> Finding:
    """A finding about one matched op (named ``name`` when not the op's own): where and when it is, and the
    first culprit's stack, if it has one."""
    return Finding(
        kind=kind,
        group=op.group,
        seq=op.seq,
        op=name or op.name,
        ranks=ranks,
        culprit_ranks=culprits,
        evidence=lines,
        summary=summary,
        time_ns=op.first_time_ns,
        culprit_frames=culprit_frames(context.evidence, culprits[0]) if culprits else (),
        op_keys=(op.op_key,),
    )


def culprit_stacks(
    evidence: Evidence, finding: Finding, ops_by_key: dict[int, MatchedOp]
) -> tuple[tuple[tuple[int, ...], tuple[Frame, ...]], ...]:
    """Each culprit's stack where the finding is about it: where it issued the finding's op (a mismatch:
    the op it got wrong), else where it issued its last op (a rank that never issued the op: as near to
    where it is as its dump says). Ranks whose stacks are the same share one item."""
    stacks: dict[tuple[Frame, ...], list[int]] = {}
    for rank in finding.culprit_ranks:
        frames: tuple[Frame, ...] = ()
        for key in finding.op_keys:
            op = ops_by_key.get(key)
            entries = op.entries.get(rank) if op is not None else None
            if entries:
                frames = head_entry(entries).frames or next((e.frames for e in entries if e.frames), ())
                if frames:
                    break
        frames = frames or culprit_frames(evidence, rank)
        if frames:
            stacks.setdefault(frames, []).append(rank)
    return tuple((tuple(ranks), frames) for frames, ranks in stacks.items())


def _victim_line(context: _Context, rank: int) -> str:
    """Why a rank that never issued an op is not to blame: where it is blocked, and on whom."""
    wait = context.evidence.waits[rank]
    if not wait.on:
        return f"rank {rank} is a victim, not a culprit: it is blocked in {where(wait.op)}."
    return (
        f"rank {rank} is a victim, not a culprit: it is blocked in {where(wait.op)}, waiting for {ranks_text(wait.on)}."
    )


def _queued_line(context: _Context, ranks: list[int] | tuple[int, ...]) -> list[str]:
    """How many of their later ops wait behind the op the ``ranks`` are blocked in (victims)."""
    queued = {r: len(context.evidence.queued.get(r, ())) for r in ranks}
    behind = [r for r, count in queued.items() if count]
    if not behind:
        return []
    total = sum(queued.values())
    return [f"{total} later ops of {ranks_text(behind)} are queued behind it and never started (victims)."]


def _culprits_among(context: _Context, op: MatchedOp, absent: tuple[int, ...]) -> tuple[int, ...]:
    """The ranks that never issued ``op`` and are to blame for it: culprits of the wait-for graph (one
    that skipped an op, only in the op it skipped) and ranks blocked nowhere."""
    blame, waits = context.blame, context.evidence.waits
    return tuple(
        r for r in absent
        if (r in blame.culprits and (r not in blame.skipped or blame.skipped[r][0] is op)) or r not in waits
    )  # fmt: skip


def _absent_line(context: _Context, rank: int, culprits: tuple[int, ...]) -> str:
    """Why a rank that never issued an op is, or is not, to blame for it."""
    skipped = context.blame.skipped.get(rank)
    if skipped is not None:
        op, line = skipped
        return line + "." if rank in culprits else f"rank {rank} skipped {where(op)} before (see there)."
    if rank in culprits:
        return last_op_text(context.evidence, rank) + "."
    return _victim_line(context, rank)


def rule_missing(context: _Context) -> list[Finding]:
    """Per group, the first collective some members never issued; suspects blocked elsewhere are victims."""
    evidence = context.evidence
    findings = []
    seen: set[Group] = set()
    missing_seqs: dict[Group, list[int]] = {}  # every op some members never issued, by group
    for op in evidence.unsettled:
        if op.status == MISSING:
            missing_seqs.setdefault(op.group, []).append(op.seq)
    for op in evidence.unsettled:
        if op.status != MISSING or op.kind != "collective" or op.group in seen:
            continue
        seen.add(op.group)
        issued = tuple(sorted(op.entries))
        culprits = _culprits_among(context, op, op.missing)
        lines = [f"{ranks_text(issued)} entered {where(op)}; {ranks_text(op.missing)} never did."]
        for rank in op.missing:
            lines.append(_absent_line(context, rank, culprits))
        lines += _queued_line(context, [r for r in issued if evidence.blocked_on(r) is op])
        later = sum(1 for seq in missing_seqs[op.group] if seq > op.seq)
        if later:
            lines.append(f"{later} later ops of this group are unmatched too (a consequence).")
        findings.append(
            _op_finding(
                context,
                KIND_MISSING,
                op,
                ranks=op.group.members,
                culprits=culprits,
                lines=lines,
                summary=f"{ranks_text(op.missing)} never issued {where(op)}; {verb(issued, 'waits', 'wait')} in it",
            )
        )
    return findings


def rule_deadlock(context: _Context) -> list[Finding]:
    """Ranks that wait for each other (A waits in group X for B while B waits in group Y for A); the
    rank whose order of ops differs from its peers' is named first."""
    evidence = context.evidence
    findings = []
    for cycle in context.blame.cycles:
        ordered, broke = cycle.ranks, cycle.why
        ops = [evidence.waits[r].op for r in ordered]
        lines = [
            f"rank {rank} waits in {where(op)} for {ranks_text(evidence.waits[rank].on)}."
            for rank, op in zip(ordered, ops, strict=True)
        ]
        lines += broke
        if not broke:
            lines.append(_undecided_cycle(sorted(ordered)))
        first = min(ops, key=lambda o: o.first_time_ns)
        names = " and ".join(dict.fromkeys(where(op) for op in ops))
        culprits = tuple(ordered)
        findings.append(
            Finding(
                kind=KIND_DEADLOCK,
                group=first.group,
                seq=first.seq,
                op=first.name,
                ranks=tuple(sorted(ordered)),
                culprit_ranks=culprits,
                evidence=lines,
                summary=f"deadlock: {ranks_text(sorted(ordered))} wait for each other in {names}",
                time_ns=first.first_time_ns,
                culprit_frames=culprit_frames(evidence, culprits[0]),
                op_keys=tuple(dict.fromkeys(op.op_key for op in ops)),
            )
        )
    return findings


def _undecided_cycle(ranks: list[int]) -> str:
    """Why a deadlock names every rank of its cycle as a culprit: each issued the other's op second, and
    nothing in the dumps says whose order is the program's. ("the dumps cannot say which side" is what
    ``tests/programs.py`` reads as undecided.)"""
    who = f"ranks {ranks[0]} and {ranks[1]}" if len(ranks) == 2 else ranks_text(ranks)
    return (
        f"{who} wait for each other, a cycle: either side's order of ops may be the bug, and no rank's order "
        f"differs from its peers', so the dumps cannot say which side to fix. {'Both' if len(ranks) == 2 else 'All'} "
        "are named: fix the one whose order differs from the program's."
    )


def rule_mismatch(context: _Context) -> list[Finding]:
    """Ops whose members disagree on op, size or dtype: the minority is to blame (if there is one)."""
    evidence = context.evidence
    findings = []
    for op in evidence.unsettled:
        if op.status != MISMATCH:
            continue
        kind = MISMATCH_KINDS[op.mismatch]
        values = {}
        for rank, entries in sorted(op.entries.items()):
            inner = inner_entries(entries)
            if op.mismatch == "op":
                values[rank] = ", ".join(e.op for e in inner)
            elif op.mismatch == "size":
                values[rank] = " ".join(str([list(s) for s in recorded_sizes(e)]) for e in inner)
            else:
                values[rank] = " ".join(",".join(sorted(set(e.input_dtypes) | set(e.output_dtypes))) for e in inner)
        by_value: dict[str, list[int]] = defaultdict(list)
        for rank, value in values.items():
            by_value[value].append(rank)
        lines = [
            f"{ranks_text(ranks)}: {value}" for value, ranks in sorted(by_value.items(), key=lambda kv: -len(kv[1]))
        ]
        decided = len(op.entries) > 2 and op.mismatch_ranks and len(op.mismatch_ranks) < len(op.entries)
        culprits = op.mismatch_ranks if decided else ()
        odd = None if decided else context.blame.odd_members.get(op.op_key)
        if odd is not None:  # no majority in the op, but its sibling groups agree on what it should be
            culprits = (odd[0],)
            lines.append(odd[1] + ".")
        elif not decided:
            lines.append("No majority among the members: which side is wrong cannot be decided from the dumps.")
        what = {"size": "sizes", "dtype": "dtypes", "op": "ops"}[op.mismatch]
        blame = (
            f"{verb(culprits, 'disagrees', 'disagree')} with the rest" if culprits else "undecided which side is wrong"
        )
        findings.append(
            _op_finding(
                context,
                kind,
                op,
                ranks=tuple(sorted(op.entries)),
                culprits=culprits,
                lines=lines,
                summary=f"{what} differ in {where(op)}: {blame}",
            )
        )
    return findings


def rule_stuck(context: _Context) -> list[Finding]:
    """Per group, the first op every member entered and none completed, where the waits end (no member
    is blocked in an earlier op of its own): nobody to blame in the dumps."""
    evidence = context.evidence
    findings = []
    seen: set[Group] = set()
    for op in context.blame.causes:
        if op.status != STUCK or op.group in seen:
            continue
        seen.add(op.group)
        states = sorted({state_entry(e).state for e in op.entries.values()})
        lines = [
            f"all {len(op.entries)} members issued {where(op)} ({'/'.join(states)}) and none completed it.",
            "No rank is missing and none disagrees: the dumps point at the GPU, NCCL or the network, not at a rank.",
        ]
        lines += _queued_line(context, [r for r in op.entries if evidence.blocked_on(r) is op])
        findings.append(
            _op_finding(
                context,
                KIND_STUCK,
                op,
                ranks=op.group.members,
                culprits=(),
                lines=lines,
                summary=f"{where(op)} is stuck on every rank (GPU/NCCL/network hang)",
            )
        )
    return findings


def rule_not_started(context: _Context) -> list[Finding]:
    """Ranks whose part of an op is ``scheduled`` while their peers' is ``started``: their kernel never
    began, because something of their own holds their stream; named with that op, or, where nothing
    in the dumps holds it, as the culprit (a compute kernel or a copy of theirs never finished)."""
    evidence, blame = context.evidence, context.blame
    findings = []
    named: set[int] = set()
    for wait in sorted(evidence.waits.values(), key=lambda w: w.op.first_time_ns):
        if wait.reason != WAIT_NOT_STARTED:
            continue
        op = wait.op
        late = tuple(r for r in wait.on if r not in named)
        if not late:
            continue
        named.update(late)
        started = tuple(sorted(r for r, w in evidence.waits.items() if w.op is op and w.reason == WAIT_NOT_STARTED))
        lines = [f"{ranks_text(started)} started {where(op)}; the kernel of {ranks_text(late)} never started."]
        culprits = []
        for rank in late:
            held = evidence.waits.get(rank)
            if held is not None and held.op is not op:
                lines.append(
                    f"rank {rank}'s stream is held by {where(held.op)}, issued before it and not completed"
                    + (f" (it waits there for {ranks_text(held.on)})." if held.on else ".")
                )
            elif rank in blame.culprits:
                culprits.append(rank)
                lines.append(
                    f"no op of rank {rank} in its dump holds its stream: a kernel of its own (compute, a copy) "
                    "never finished before this op could start."
                )
        summary = (
            f"{ranks_text(late)} never started {where(op)}: "
            + ("a kernel of its own holds its stream" if culprits else "its stream is held by an earlier op")
            + f"; {verb(started, 'waits', 'wait')} in it"
        )
        findings.append(
            _op_finding(
                context,
                KIND_NOT_STARTED,
                op,
                ranks=tuple(sorted(op.entries)),
                culprits=tuple(culprits),
                lines=lines,
                summary=summary,
            )
        )
    return findings


def rule_p2p(context: _Context) -> list[Finding]:
    """Per pair, the first send without its recv (or recv without its send), both ends in global ranks;
    the side that posted and waits is a victim."""
    evidence, blame = context.evidence, context.blame
    findings = []
    seen: set[tuple[Group, tuple[int, int] | None]] = set()
    for op in evidence.unsettled:
        if op.kind != "p2p" or op.status != MISSING or not op.peers or (op.group, op.peers) in seen:
            continue
        seen.add((op.group, op.peers))
        src, dst = op.peers
        ranks: list[int | None] = list(op.entries)  # the one end that issued it, if any
        (present,) = ranks or [None]
        mine = head_entry(op.entries[present]).op if present is not None else "?"
        other = "recv" if mine == "send" else "send"
        absent = op.missing
        culprits = _culprits_among(context, op, absent)
        lines = [
            f"rank {present} posted {op.title_as(mine)} (global ranks {src} -> {dst}, #{op.seq} in the pair's "
            f"order); rank {absent[0]} never posted the matching {other}."
        ]
        if present is not None and present not in blame.culprits:
            lines.append(f"rank {present} is a victim: its {mine} waits for rank {absent[0]}.")
        for rank in absent:
            lines.append(_absent_line(context, rank, culprits))
        findings.append(
            _op_finding(
                context,
                KIND_P2P,
                op,
                name=mine,
                ranks=(src, dst),
                culprits=culprits,
                lines=lines,
                summary=f"{mine} {src}->{dst} #{op.seq} has no matching {other} on rank {absent[0]}",
            )
        )
    return findings


def rule_no_dump(context: _Context) -> list[Finding]:
    """Members that left no file: those the others wait for, one finding per op they are waited for in
    (the culprits, when nothing else blocks the waiters); and one finding for all that nobody waits for,
    where those that ended first (``beside.ended_first``: the launcher or their log says they failed,
    or the others were stopped by a signal while they left a rank file and no dump) are the culprits.
    As many findings as ops, never one per rank: a group may list thousands of ranks."""
    evidence, blame = context.evidence, context.blame
    job = evidence.job
    waiting_for: dict[int, list[int]] = defaultdict(list)  # dumpless rank -> ranks waiting for it
    for rank, wait in evidence.waits.items():
        for other in wait.on:
            waiting_for[other].append(rank)
    by_op: dict[int, tuple[MatchedOp, list[int], set[int]]] = {}  # op key -> (op, dumpless, waiting)
    idle: list[int] = []
    for rank in job.missing_ranks:
        waiting = waiting_for.get(rank)
        if not waiting:
            idle.append(rank)
            continue
        first = min((evidence.waits[r].op for r in waiting), key=lambda o: o.first_time_ns)
        _, dumpless, waiters = by_op.setdefault(first.op_key, (first, [], set()))
        dumpless.append(rank)
        waiters.update(waiting)
    findings = []
    for op, dumpless, waiters in by_op.values():
        waiting = sorted(waiters)
        lines = [
            f"{ranks_text(dumpless)} {'is a member' if len(dumpless) == 1 else 'are members'} of {where(op)} "
            "but no dump of it was read.",
            f"{verb(waiting, 'has', 'have')} not completed {where(op)}, which "
            f"{'it is a member' if len(dumpless) == 1 else 'they are members'} of"
            + (" (their own pg_status says so: gloo's entries carry no state)." if _by_status(op) else "."),
        ]
        for rank in dumpless[:MAX_RANKS_QUOTED]:
            lines += ended_first(job, rank)
        culprits = tuple(r for r in dumpless if r in blame.culprits)
        findings.append(
            _op_finding(
                context,
                KIND_NO_DUMP,
                op,
                ranks=(*dumpless, *waiting),
                culprits=culprits,
                lines=lines,
                summary=f"{ranks_text(dumpless)} left no dump and {verb(waiting, 'waits', 'wait')} for "
                + ("it" if len(dumpless) == 1 else "them"),
            )
        )
    if idle:
        findings.append(_idle_no_dump(job, idle))
    if job.unfollowed:
        findings.append(_unfollowed_ranks(job))
    return findings


def _unfollowed_ranks(job: Job) -> Finding:
    """The ranks of a group whose ``pg_config`` claims far more of them than the dumps read (see
    ``read.job.resolve_groups``): not followed one by one, so nothing says they were well either."""
    name, claimed = max(job.unfollowed.items(), key=lambda item: item[1])
    dumps = f"{len(job.dumps)} dump{'s' if len(job.dumps) != 1 else ''}"
    summary = f"pg_config says group {name} has {claimed} ranks, and {dumps} were read"
    lines = [
        f"{summary}: the ranks without a dump were not followed one by one, and nothing says they were well.",
        "Their dumps would tell (or the pg_config is wrong: a rank's dump lists its groups' members there).",
    ]
    return Finding(kind=KIND_NO_DUMP, group=None, seq=0, op="", ranks=(), culprit_ranks=(), evidence=lines,
                   summary=summary, time_ns=0)  # fmt: skip


MAX_RANKS_QUOTED = 8  # ranks whose own lines a finding quotes


def _by_status(op: MatchedOp) -> bool:
    """Whether the waits in ``op`` were read from ``pg_status`` (its entries carry no state)."""
    return all(not tracks_completion(state_entry(entries)) for entries in op.entries.values())


def _idle_no_dump(job: Job, idle: list[int]) -> Finding:
    """The ranks without a dump that nobody is seen waiting for: those that ended first are the culprits
    (a rank that died took its dump with it, and the launcher stopped the others); of the rest the dumps
    cannot say whether the job needed them, so the verdict cannot be healthy either."""
    groups = [g for g in job.groups if any(r in g.members for r in idle[:1])]
    first = [rank for rank in idle if ended_first(job, rank)]
    member = "is a member" if len(idle) == 1 else "are members"
    lines = [f"{ranks_text(idle)} {member} of the job's groups but no dump of them was read."]
    for rank in first[:MAX_RANKS_QUOTED]:
        lines += ended_first(job, rank)
    if first:
        summary = f"{ranks_text(first)} left no dump and ended first"
        stopped = stopped_by_signal(job)
        if stopped:
            summary += f": the others were stopped by {stopped}"
    else:
        summary = f"{ranks_text(idle)} left no dump"
        lines.append(
            "No rank is seen waiting for them, but without their dumps nothing says they were well: their "
            "dumps, or their logs (torchrun --log-dir), would tell."
        )
    return Finding(
        kind=KIND_NO_DUMP,
        group=groups[0] if groups else None,
        seq=0,
        op="",
        ranks=tuple(idle),
        culprit_ranks=tuple(first),
        evidence=lines,
        summary=summary,
        time_ns=0,
    )


def rule_after_timeout(context: _Context) -> list[Finding]:
    """Members that enqueued a collective more than their peers' timeout after the first of them
    (``timeouts``): they held the others past it, whatever their dumps hold after."""
    findings = []
    for came in find_late_entries(context.evidence):
        op, late = came.op, came.late
        ranks = tuple(late)
        seconds = came.timeout_ns / 1e9
        lines = [
            f"rank {rank} enqueued {where(op)} {gap / 1e9:.1f} s after rank {came.first_rank} did, past the "
            f"{seconds:g} s timeout it runs under."
            for rank, gap in list(late.items())[:MAX_RANKS_QUOTED]
        ]
        on_time = tuple(sorted(r for r in op.entries if r not in late))
        lines.append(
            f"{verb(on_time, 'was', 'were')} in it from the start and timed out before "
            f"{'it' if len(ranks) == 1 else 'they'} came: what happened after (an error caught and passed on, "
            "the same ops on every rank) follows from it."
        )
        gap = next(iter(late.values()))
        finding = _op_finding(
            context,
            KIND_AFTER_TIMEOUT,
            op,
            ranks=tuple(sorted(op.entries)),
            culprits=ranks,
            lines=lines,
            summary=f"{ranks_text(ranks)} came to {where(op)} {gap / 1e9:.0f} s after "
            f"{'its' if len(ranks) == 1 else 'their'} peers, past their {seconds:g} s timeout",
        )
        finding.time_ns = came.stalled_ns  # when it stopped moving is when the fault began: what ranks causes
        findings.append(finding)
    return findings


def rule_straggler(context: _Context) -> list[Finding]:
    """Members that enqueue last, by a clear margin, in most ops of one group (``stragglers``)."""
    evidence = context.evidence
    findings = []
    for found in find_stragglers(evidence):
        group, rank = found.group, found.rank
        name = group_in_words(group, f"{len(group.members)} ranks")
        share = found.count / found.considered
        lines = [
            f"rank {rank} was the last member of {name} to enqueue in {found.count} of its {found.considered} "
            f"collectives ({share:.0%}), by at least {found.threshold_ns / 1e6:.0f} ms each time;",
            f"it enqueued at least {found.median_lag_ns / 1e6:.1f} ms after the median member in half of them, "
            f"and at most {found.p90_lag_ns / 1e6:.1f} ms after in nine of ten.",
        ]
        clock = evidence.clocks.groups.get(group)
        if found.aligned and clock is not None and any(clock.estimates.values()):
            lines.append(
                f"times compared on the members' clocks aligned from completion times (to within "
                f"{clock.uncertainty_ns / 1e6:.1f} ms)."
            )
        elif not found.aligned:
            lines.append(
                "no completion times to align the hosts' clocks: only a margin larger than any plausible "
                f"clock skew ({found.threshold_ns / 1e6:.0f} ms) counts."
            )
        lines.append(f"In the trace, the counter '{lateness_track(group, rank)}' shows it against the other members.")
        findings.append(
            Finding(
                kind=KIND_STRAGGLER,
                group=group,
                seq=0,
                op="",
                ranks=(rank,),
                culprit_ranks=(rank,),
                evidence=lines,
                summary=f"rank {rank} enqueues late in {group_called(group)}: "
                f"{found.median_lag_ns / 1e6:.1f} ms median, {found.p90_lag_ns / 1e6:.1f} ms p90, "
                f"in {share:.0%} of its collectives",
                time_ns=0,
                culprit_frames=culprit_frames(evidence, rank),
                lag_ns=found.median_lag_ns,
            )
        )
    return findings


RULES: list[Callable[[_Context], list[Finding]]] = [
    rule_deadlock,
    rule_missing,
    rule_p2p,
    rule_not_started,
    rule_no_dump,
    rule_mismatch,
    rule_stuck,
    rule_after_timeout,
    rule_straggler,
]

# What each kind of finding makes of the verdict.
_WEIGHT = {
    KIND_DEADLOCK: (HANG, CATEGORY_DEADLOCK),
    KIND_MISSING: (HANG, CATEGORY_NEVER_REACHED),
    KIND_P2P: (HANG, CATEGORY_P2P),
    KIND_NOT_STARTED: (HANG, CATEGORY_NOT_STARTED),
    KIND_NO_DUMP: (HANG, CATEGORY_NO_DUMP),
    "type_mismatch": (MISMATCH_STATUS, CATEGORY_ORDER),
    "size_mismatch": (MISMATCH_STATUS, CATEGORY_ARGUMENTS),
    "dtype_mismatch": (MISMATCH_STATUS, CATEGORY_ARGUMENTS),
    KIND_STUCK: (HANG, CATEGORY_GPU_HANG),
    KIND_STRAGGLER: (SLOW, CATEGORY_STRAGGLER),
    KIND_STUCK_CPU: (HANG, CATEGORY_STUCK_CPU),
    KIND_CRASH: (CRASH, CATEGORY_OWN_ERROR),
    KIND_AFTER_TIMEOUT: (HANG, CATEGORY_AFTER_TIMEOUT),
}
_CAUSES_BY_THEMSELVES = {KIND_DEADLOCK, KIND_STUCK, *MISMATCH_KINDS.values()}


def verdict(
    findings: list[Finding],
    ops: list[MatchedOp],
    timed: bool = True,
    contradicted: list[str] | None = None,
    unsure: list[str] | None = None,
) -> Verdict:
    """Weigh the findings: root causes first (findings that blame a rank, deadlocks, ops that are causes
    by themselves), earliest first; stragglers last. The first decides status and category.

    Without start events (``timed`` false) an op every member is in and none completed may be queued
    behind something on every rank: such a "stuck" op comes after every other root cause.

    ``contradicted``: signs beside the dumps that the job failed or stopped (``beside.contradictions``):
    with any of them, a job the dumps find nothing wrong with is never healthy, but undecided, and the
    first of them is said. ``unsure``: what the dumps cannot show of this job (``beside.unseen``), each
    with how to see it: healthy needs positive evidence, so with any of them it is undecided too."""
    informational = [f for f in findings if f.kind == KIND_STRAGGLER]
    blaming = [f for f in findings if _is_a_cause(f)]
    if not blaming:
        quiet = _without_a_cause(findings, ops, informational)
        if quiet.status == HEALTHY and contradicted:
            what = quiet.summary.removeprefix(f"{HEALTHY}: ")
            return Verdict(UNDECIDED, (), CATEGORY_CONTRADICTED, f"{UNDECIDED}: {what}, but {contradicted[0]}",
                           [*contradicted, *quiet.evidence])  # fmt: skip
        if quiet.status == HEALTHY and unsure:
            what = quiet.summary.removeprefix(f"{HEALTHY}: ")
            return Verdict(UNDECIDED, (), CATEGORY_UNSURE, f"{UNDECIDED}: {what}, but {unsure[0]}",
                           [*unsure, *quiet.evidence])  # fmt: skip
        return quiet
    ranked = _ranked(blaming, timed)
    top = ranked[0]
    status, category = _WEIGHT[top.kind]
    culprits: list[int] = []
    for finding in ranked:  # a straggler is no culprit of a hang
        for rank in finding.culprit_ranks:
            if rank not in culprits:
                culprits.append(rank)
    if not top.culprit_ranks and top.kind != KIND_STUCK:
        status = UNDECIDED
        culprits = []  # what follows the undecided first cause may well be its consequence
    summary = f"{status}: {top.summary}"
    return Verdict(status, tuple(culprits), category, summary, [f.summary for f in ranked + informational])


def _is_a_cause(finding: Finding) -> bool:
    """Whether a finding may be the verdict's root cause (a straggler never is)."""
    return finding.kind != KIND_STRAGGLER and bool(
        finding.culprit_ranks
        or finding.kind in _CAUSES_BY_THEMSELVES
        or finding.kind in (KIND_MISSING, KIND_P2P, KIND_NOT_STARTED)
    )


def _ranked(causes: list[Finding], timed: bool) -> list[Finding]:
    """Root causes first (findings that blame a rank, ops that are causes by themselves), then findings
    about victims; earliest first; an op none completed, without start events, after the others."""
    ranked = sorted(
        causes,
        key=lambda f: (
            not (f.culprit_ranks or f.kind in _CAUSES_BY_THEMSELVES),
            f.kind == KIND_STUCK and not timed,
            f.time_ns,
        ),
    )
    return _gpu_side_first(ranked)


def order_findings(findings: list[Finding], timed: bool = True) -> list[Finding]:
    """The findings in the order ``verdict`` weighs them, so that finding 1 is the verdict's headline:
    the possible causes, ranked; then stragglers; then the rest, as found."""
    causes = [f for f in findings if _is_a_cause(f)]
    slow = [f for f in findings if f.kind == KIND_STRAGGLER]
    rest = [f for f in findings if f.kind != KIND_STRAGGLER and not _is_a_cause(f)]
    return _ranked(causes, timed) + slow + rest


def _without_a_cause(findings: list[Finding], ops: list[MatchedOp], informational: list[Finding]) -> Verdict:
    """The verdict where no finding is a root cause: undecided where ops did not complete, slow where a
    straggler holds the others up, else healthy (the lost dumps nobody waits for said)."""
    unfinished = [op for op in ops if op.status == INCOMPLETE]
    if unfinished and not informational:
        op = unfinished[0]
        return Verdict(
            UNDECIDED,
            (),
            CATEGORY_NONE,
            f"undecided: {where(op)} did not complete on every rank, and the dumps do not say why",
            [f"{len(unfinished)} ops did not complete everywhere."],
        )
    if informational:
        top = informational[0]
        culprits = tuple(dict.fromkeys(r for f in informational for r in f.culprit_ranks))
        return Verdict(SLOW, culprits, CATEGORY_STRAGGLER, f"{SLOW}: {top.summary}",
                       [f.summary for f in informational])  # fmt: skip
    no_dump = [f for f in findings if f.kind == KIND_NO_DUMP]
    alone = _ranks_with_ops(ops, 2)
    if len(alone) == 1:  # one rank's ops: matched against nothing
        (rank,) = alone
        if no_dump:
            return Verdict(UNDECIDED, (), CATEGORY_NONE,
                           f"undecided: only rank {rank}'s dump holds ops, and a hang between ranks shows only "
                           f"against the others' ({no_dump[0].summary})", [no_dump[0].summary])  # fmt: skip
        return Verdict(HEALTHY, (), CATEGORY_NONE,
                       f"healthy: only rank {rank}'s dump was read, and nothing in it is wrong (no other rank's "
                       "ops to match its against)", [])  # fmt: skip
    if no_dump:  # healthy needs every rank's dump: one without may have failed where nobody saw
        return Verdict(UNDECIDED, (), CATEGORY_NO_DUMP_UNKNOWN,
                       f"undecided: {no_dump[0].summary}; every op matched on the ranks with a dump, but without "
                       "theirs nothing says they were well", [no_dump[0].summary])  # fmt: skip
    return Verdict(HEALTHY, (), CATEGORY_NONE, "healthy: every op matched on every rank", [])


def _ranks_with_ops(ops: list[MatchedOp], enough: int) -> set[int]:
    """The ranks that hold a part in ``ops``, found until there are ``enough`` of them (in a job of many
    ranks, its first op names that many: the millions of parts after it are not visited)."""
    ranks: set[int] = set()
    for op in ops:
        ranks.update(op.entries)
        if len(ranks) >= enough:
            break
    return ranks


def _gpu_side_first(ranked: list[Finding]) -> list[Finding]:
    """A culprit whose kernel never started also never issued later ops (its CPU waits for its GPU at
    the next sync): that it never started says why, so that finding leads."""
    if not ranked or not ranked[0].culprit_ranks:
        return ranked
    first = ranked[0].culprit_ranks[0]
    for index, finding in enumerate(ranked):
        if finding.kind == KIND_NOT_STARTED and finding.culprit_ranks[:1] == (first,):
            return [finding, *ranked[:index], *ranked[index + 1 :]]
    return ranked


def diagnose(job: Job, ops: list[MatchedOp]) -> Diagnosis:
    """Run every rule over the job's matched ops and weigh the findings into a verdict."""
    evidence = gather_evidence(job, ops)
    context = _Context(evidence, assign_blame(evidence))
    findings = [finding for rule in RULES for finding in rule(context)]
    # A deadlock already explains the missing ops it is made of.
    deadlocked = {k for f in findings if f.kind == KIND_DEADLOCK for k in f.op_keys}
    findings = [f for f in findings if not (f.kind == KIND_MISSING and set(f.op_keys) <= deadlocked)]
    findings = _without_consequences_of_late(findings)
    freeze = find_freeze(job)
    if not any(f.culprit_ranks and f.kind != KIND_STRAGGLER for f in findings):
        # the dumps name no culprit: what lies beside them may (``beside``)
        findings += rule_stuck_cpu(job, freeze) + rule_crashed(job)
    findings, notes = corroborate(evidence, findings)
    findings = order_findings(findings, evidence.timed)
    by_key = ops_by_key(ops, (key for finding in findings for key in finding.op_keys))
    for finding in findings:
        if finding.kind != KIND_STUCK_CPU:  # whose stack is the snapshot that shows it stuck
            finding.stacks = culprit_stacks(evidence, finding, by_key)
            finding.culprit_frames = finding.stacks[0][1] if finding.stacks else ()
        elif finding.culprit_frames:
            finding.stacks = ((finding.culprit_ranks, finding.culprit_frames),)
    weighed = verdict(findings, ops, evidence.timed, contradictions(job, freeze), unseen(job, freeze))
    weighed.evidence += notes
    caveats = blind_spots(job)
    weighed.evidence += caveats
    if any(said in weighed.summary for said in CRASH_SAYS):
        weighed.category = CATEGORY_CRASH
    return Diagnosis(weighed, findings, evidence, victim_roles(context), notes, caveats, freeze)


def _without_consequences_of_late(findings: list[Finding]) -> list[Finding]:
    """Without the ranks that came late to an op after another cause, found earlier, or to an op that is
    a cause already: once an op fails (a mismatch, a rank that never came), its members' timeouts and
    errors make them late to what follows. Only a late entry that nothing else explains is a cause."""
    causes = [f for f in findings if f.kind not in (KIND_AFTER_TIMEOUT, KIND_STRAGGLER) and _is_a_cause(f)]
    first = min((f.time_ns for f in causes), default=None)
    explained = {key for f in causes for key in f.op_keys}  # an op that is a cause already (a mismatch) says it
    return [
        f for f in findings
        if f.kind != KIND_AFTER_TIMEOUT or ((first is None or f.time_ns < first) and not set(f.op_keys) & explained)
    ]  # fmt: skip


def victim_roles(context: _Context) -> dict[tuple[int, int], str]:
    """(rank, op key) -> what a victim does there: blocked in the op, waiting for other ranks, or
    queued behind its own blocking op (its kernel never started). Culprits are marked elsewhere."""
    evidence, blame = context.evidence, context.blame
    roles: dict[tuple[int, int], str] = {}
    for rank, wait in evidence.waits.items():
        if rank not in blame.victims:
            continue  # a culprit, or one of ranks that wait for each other
        if wait.on:
            roles[(rank, wait.op.op_key)] = f"victim: blocked here, waiting for {ranks_text(wait.on)} ({wait.reason})"
        for queued in evidence.queued.get(rank, ()):
            roles[(rank, queued.op_key)] = f"victim: queued behind {where(wait.op)}; its kernel never started"
    return roles
