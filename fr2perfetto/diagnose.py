"""Turn matched ops into findings and one verdict: which rank, which group, which op, and why.

The diagnosis is a list of rules (``RULES``), each a small function from the ``Evidence`` of a job
to its findings. ``diagnose`` runs them all, then ``verdict`` weighs the findings.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from .job import Job
from .model import (
    COMPLETED,
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
    ranks_label,
    state_entry,
)

# Finding kinds, as the report names them.
KIND_MISSING = "missing"
KIND_DEADLOCK = "deadlock"
KIND_STUCK = "stuck"
KIND_P2P = "p2p"
KIND_NO_DUMP = "no_dump"
KIND_STRAGGLER = "straggler"
MISMATCH_KINDS = {"size": "size_mismatch", "dtype": "dtype_mismatch", "op": "type_mismatch"}

# Verdict statuses and root-cause categories, in the words people use.
HANG, MISMATCH_STATUS, HEALTHY, UNDECIDED = "hang", "mismatch", "healthy", "undecided"
CATEGORY_NEVER_REACHED = "a rank never reached the collective (CPU-side divergence or a stuck rank)"
CATEGORY_DEADLOCK = "deadlock across process groups (ranks wait for each other in different groups)"
CATEGORY_ARGUMENTS = "wrong collective arguments (ranks disagree on op, size or dtype)"
CATEGORY_GPU_HANG = "GPU/NCCL/network hang (every rank entered the op and none completed)"
CATEGORY_NO_DUMP = "missing dump (ranks the others wait for left no dump)"
CATEGORY_STRAGGLER = "slow rank (a straggler enqueues collectives late)"
CATEGORY_NONE = "none"


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


@dataclass(slots=True)
class Evidence:
    """What the rules look at: the job, its matched ops, and who waits for whom."""

    job: Job
    ops: list[MatchedOp]
    # rank -> the first op it issued and is blocked in (others never joined it)
    blocked_in: dict[int, MatchedOp]
    # rank -> ranks it waits for in that op
    waits_for: dict[int, tuple[int, ...]]


def where(op: MatchedOp) -> str:
    """``all_reduce #4 of default_pg (pg 0, 4 ranks)``."""
    return f"{op.title} of {op.group.desc or 'pg ' + op.group.name} (pg {op.group.name}, {len(op.group.members)} ranks)"


def ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ranks_label(ranks)


def verb(ranks: tuple[int, ...] | list[int], singular: str, plural: str) -> str:
    """``rank 3 waits`` / ``ranks 0-2 wait``."""
    return f"{ranks_text(ranks)} {singular if len(ranks) == 1 else plural}"


def gather_evidence(job: Job, ops: list[MatchedOp]) -> Evidence:
    """Find, for every rank, the op it is blocked in and the ranks it waits for there.

    A rank is blocked in the earliest op it issued that some member never issued (missing), or,
    where ranks left no dump, in the earliest op it has not completed that a dumpless rank is in.
    """
    blocked_in: dict[int, MatchedOp] = {}
    waits_for: dict[int, tuple[int, ...]] = {}
    no_dump = set(job.missing_ranks)
    for op in ops:  # ops come in time order, so the first one seen is the earliest
        if op.status == MISSING:
            waiting_on = op.missing
        elif op.unknown and no_dump.intersection(op.unknown):
            waiting_on = tuple(r for r in op.unknown if r in no_dump)
        else:
            continue
        for rank, entries in op.entries.items():
            last = state_entry(entries)
            if last.state == COMPLETED and op.status != MISSING:
                continue
            if rank not in blocked_in:
                blocked_in[rank] = op
                waits_for[rank] = waiting_on
    return Evidence(job, ops, blocked_in, waits_for)


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
    return (
        f"rank {rank}'s last op: {last.op} #{seq} of {group.desc or 'pg ' + group.name} (pg {group.name}), {last.state}"
    )


def culprit_frames(evidence: Evidence, rank: int) -> tuple[Frame, ...]:
    """The culprit's stack: where it issued its last op (its best-known position)."""
    dump = evidence.job.dumps.get(rank)
    if dump is None or not dump.entries:
        return ()
    for entry in reversed(dump.entries):
        if entry.frames:
            return entry.frames
    return ()


def rule_missing(evidence: Evidence) -> list[Finding]:
    """Per group, the first op some members never issued; suspects blocked elsewhere are victims."""
    findings = []
    seen: set[Group] = set()
    for op in evidence.ops:
        if op.status != MISSING or op.kind != "collective" or op.group in seen:
            continue
        seen.add(op.group)
        issued = tuple(sorted(op.entries))
        victims = {
            r: evidence.blocked_in[r]
            for r in op.missing
            if r in evidence.blocked_in and evidence.blocked_in[r] is not op
        }
        culprits = tuple(r for r in op.missing if r not in victims)
        lines = [f"{ranks_text(issued)} entered {where(op)}; {ranks_text(op.missing)} never did."]
        for rank in op.missing:
            if rank in victims:
                blocked = victims[rank]
                lines.append(
                    f"rank {rank} is a victim, not a culprit: it is blocked in {where(blocked)}, "
                    f"waiting for {ranks_text(evidence.waits_for[rank])}."
                )
            else:
                lines.append(last_op_text(evidence, rank) + ".")
        later = sum(1 for o in evidence.ops if o.group == op.group and o.status == MISSING and o.seq > op.seq)
        if later:
            lines.append(f"{later} later ops of this group are unmatched too (a consequence).")
        findings.append(
            Finding(
                kind=KIND_MISSING,
                group=op.group,
                seq=op.seq,
                op=op.name,
                ranks=op.group.members,
                culprit_ranks=culprits,
                evidence=lines,
                summary=f"{ranks_text(op.missing)} never issued {where(op)}; {verb(issued, 'waits', 'wait')} in it",
                time_ns=op.first_time_ns,
                culprit_frames=culprit_frames(evidence, culprits[0]) if culprits else (),
                op_keys=(op.op_key,),
            )
        )
    return findings


def rule_deadlock(evidence: Evidence) -> list[Finding]:
    """Cycles in the wait-for graph: A waits in group X for B while B waits in group Y for A."""
    findings = []
    reported: set[frozenset[int]] = set()
    for start in sorted(evidence.waits_for):
        path = [start]
        while True:
            nexts = [r for r in evidence.waits_for.get(path[-1], ()) if r in evidence.waits_for]
            if not nexts:
                break
            step = nexts[0]
            if step in path:
                cycle = path[path.index(step) :]
                key = frozenset(cycle)
                if key not in reported and len(cycle) > 1:
                    reported.add(key)
                    findings.append(_deadlock_finding(evidence, cycle))
                break
            path.append(step)
    return findings


def _deadlock_finding(evidence: Evidence, cycle: list[int]) -> Finding:
    ops = [evidence.blocked_in[r] for r in cycle]
    lines = [
        f"rank {rank} waits in {where(op)} for {ranks_text(evidence.waits_for[rank])}."
        for rank, op in zip(cycle, ops, strict=True)
    ]
    first = min(ops, key=lambda o: o.first_time_ns)
    names = " and ".join(dict.fromkeys(where(op) for op in ops))
    return Finding(
        kind=KIND_DEADLOCK,
        group=first.group,
        seq=first.seq,
        op=first.name,
        ranks=tuple(sorted(cycle)),
        culprit_ranks=tuple(sorted(cycle)),
        evidence=lines,
        summary=f"deadlock: {ranks_text(sorted(cycle))} wait for each other in {names}",
        time_ns=first.first_time_ns,
        culprit_frames=culprit_frames(evidence, cycle[0]),
        op_keys=tuple(dict.fromkeys(op.op_key for op in ops)),
    )


def rule_mismatch(evidence: Evidence) -> list[Finding]:
    """Ops whose members disagree on op, size or dtype: the minority is to blame (if there is one)."""
    findings = []
    for op in evidence.ops:
        if op.status != MISMATCH:
            continue
        kind = MISMATCH_KINDS[op.mismatch]
        values = {}
        for rank, entries in sorted(op.entries.items()):
            inner = inner_entries(entries)
            if op.mismatch == "op":
                values[rank] = ", ".join(e.op for e in inner)
            elif op.mismatch == "size":
                values[rank] = " ".join(str([list(s) for s in e.input_sizes or e.output_sizes]) for e in inner)
            else:
                values[rank] = " ".join(",".join(e.input_dtypes or e.output_dtypes) for e in inner)
        by_value: dict[str, list[int]] = defaultdict(list)
        for rank, value in values.items():
            by_value[value].append(rank)
        lines = [
            f"{ranks_text(ranks)}: {value}" for value, ranks in sorted(by_value.items(), key=lambda kv: -len(kv[1]))
        ]
        decided = len(op.entries) > 2 and op.mismatch_ranks and len(op.mismatch_ranks) < len(op.entries)
        culprits = op.mismatch_ranks if decided else ()
        if not decided:
            lines.append("No majority among the members: which side is wrong cannot be decided from the dumps.")
        what = {"size": "sizes", "dtype": "dtypes", "op": "ops"}[op.mismatch]
        blame = (
            f"{verb(culprits, 'disagrees', 'disagree')} with the rest" if culprits else "undecided which side is wrong"
        )
        findings.append(
            Finding(
                kind=kind,
                group=op.group,
                seq=op.seq,
                op=op.name,
                ranks=tuple(sorted(op.entries)),
                culprit_ranks=culprits,
                evidence=lines,
                summary=f"{what} differ in {where(op)}: {blame}",
                time_ns=op.first_time_ns,
                culprit_frames=culprit_frames(evidence, culprits[0]) if culprits else (),
                op_keys=(op.op_key,),
            )
        )
    return findings


def rule_stuck(evidence: Evidence) -> list[Finding]:
    """Per group, the first op every member entered and none completed: nobody to blame in the dumps."""
    findings = []
    seen: set[Group] = set()
    for op in evidence.ops:
        if op.status != STUCK or op.group in seen:
            continue
        seen.add(op.group)
        states = sorted({state_entry(e).state for e in op.entries.values()})
        lines = [
            f"all {len(op.group.members)} members issued {where(op)} ({'/'.join(states)}) and none completed it.",
            "No rank is missing and none disagrees: the dumps point at the GPU, NCCL or the network, not at a rank.",
        ]
        findings.append(
            Finding(
                kind=KIND_STUCK,
                group=op.group,
                seq=op.seq,
                op=op.name,
                ranks=op.group.members,
                culprit_ranks=(),
                evidence=lines,
                summary=f"{where(op)} is stuck on every rank (GPU/NCCL/network hang)",
                time_ns=op.first_time_ns,
                op_keys=(op.op_key,),
            )
        )
    return findings


def rule_p2p(evidence: Evidence) -> list[Finding]:
    """A send without its recv, or a recv without its send, with both ends in global ranks."""
    findings = []
    for op in evidence.ops:
        if op.kind != "p2p" or op.status != MISSING or not op.peers:
            continue
        src, dst = op.peers
        (present,) = list(op.entries) or [None]
        mine = head_entry(op.entries[present]).op if present is not None else "?"
        other = "recv" if mine == "send" else "send"
        absent = op.missing
        victims = {r for r in absent if r in evidence.blocked_in and evidence.blocked_in[r] is not op}
        culprits = tuple(r for r in absent if r not in victims)
        lines = [
            f"rank {present} posted {op.title_as(mine)} (global ranks {src} -> {dst}); "
            f"rank {absent[0]} never posted the matching {other}."
        ]
        lines += [last_op_text(evidence, r) + "." for r in absent]
        findings.append(
            Finding(
                kind=KIND_P2P,
                group=op.group,
                seq=op.seq,
                op=mine,
                ranks=(src, dst),
                culprit_ranks=culprits,
                evidence=lines,
                summary=f"{mine} {src}->{dst} #{op.seq} has no matching {other} on rank {absent[0]}",
                time_ns=op.first_time_ns,
                culprit_frames=culprit_frames(evidence, culprits[0]) if culprits else (),
                op_keys=(op.op_key,),
            )
        )
    return findings


def rule_no_dump(evidence: Evidence) -> list[Finding]:
    """Members that left no file; when the others wait for them, they are the culprits."""
    findings = []
    for rank in evidence.job.missing_ranks:
        waiting = sorted(r for r, on in evidence.waits_for.items() if rank in on)
        groups = [g for g in evidence.job.groups if rank in g.members]
        lines = [f"rank {rank} is a member of {len(groups)} group(s) but no dump of it was read."]
        blocking = [evidence.blocked_in[r] for r in waiting]
        if waiting:
            first = min(blocking, key=lambda o: o.first_time_ns)
            lines.append(f"{ranks_text(waiting)} have not completed {where(first)}, which rank {rank} is a member of.")
        findings.append(
            Finding(
                kind=KIND_NO_DUMP,
                group=blocking[0].group if waiting else (groups[0] if groups else None),
                seq=blocking[0].seq if waiting else 0,
                op=blocking[0].name if waiting else "",
                ranks=(rank, *waiting),
                culprit_ranks=(rank,) if waiting else (),
                evidence=lines,
                summary=f"rank {rank} left no dump"
                + (f" and {verb(waiting, 'waits', 'wait')} for it" if waiting else ""),
                time_ns=blocking[0].first_time_ns if waiting else 0,
                op_keys=tuple(dict.fromkeys(o.op_key for o in blocking)),
            )
        )
    return findings


STRAGGLER_MIN_OPS = 5
STRAGGLER_MIN_SHARE = 0.5
STRAGGLER_MIN_LAG_NS = 1_000_000


def rule_straggler(evidence: Evidence) -> list[Finding]:
    """Ranks that are the last to enqueue in most collectives, by a clear margin (needs start times)."""
    if not any(dump.has_timing for dump in evidence.job.dumps.values()):
        return []
    last_count: dict[int, int] = defaultdict(int)
    lags: dict[int, list[int]] = defaultdict(list)
    considered = 0
    for op in evidence.ops:
        if op.kind != "collective" or len(op.entries) < 3:
            continue
        created = op.created_ns
        middle = statistics.median(created)
        considered += 1
        latest_time = max(created)
        latest = list(op.entries)[created.index(latest_time)]  # the first rank to be that late
        last_count[latest] += 1
        lags[latest].append(int(latest_time - middle))
    findings = []
    if considered < STRAGGLER_MIN_OPS:
        return findings
    for rank, count in sorted(last_count.items()):
        share = count / considered
        median_lag = statistics.median(lags[rank])
        if share < STRAGGLER_MIN_SHARE or median_lag < STRAGGLER_MIN_LAG_NS:
            continue
        worst = max(lags[rank])
        lines = [
            f"rank {rank} was the last to enqueue in {count} of {considered} collectives ({share:.0%}),",
            f"{median_lag / 1e6:.1f} ms after the median rank (median), {worst / 1e6:.1f} ms at worst.",
        ]
        findings.append(
            Finding(
                kind=KIND_STRAGGLER,
                group=None,
                seq=0,
                op="",
                ranks=(rank,),
                culprit_ranks=(rank,),
                evidence=lines,
                summary=f"rank {rank} enqueues collectives late: {median_lag / 1e6:.1f} ms median, "
                f"{worst / 1e6:.1f} ms worst, in {share:.0%} of collectives",
                time_ns=0,
                culprit_frames=culprit_frames(evidence, rank),
            )
        )
    return findings


RULES: list[Callable[[Evidence], list[Finding]]] = [
    rule_deadlock,
    rule_missing,
    rule_p2p,
    rule_no_dump,
    rule_mismatch,
    rule_stuck,
    rule_straggler,
]

# Which kinds make which verdict, strongest first.
_WEIGHT = {
    KIND_DEADLOCK: (HANG, CATEGORY_DEADLOCK),
    KIND_MISSING: (HANG, CATEGORY_NEVER_REACHED),
    KIND_P2P: (HANG, CATEGORY_NEVER_REACHED),
    KIND_NO_DUMP: (HANG, CATEGORY_NO_DUMP),
    "type_mismatch": (MISMATCH_STATUS, CATEGORY_ARGUMENTS),
    "size_mismatch": (MISMATCH_STATUS, CATEGORY_ARGUMENTS),
    "dtype_mismatch": (MISMATCH_STATUS, CATEGORY_ARGUMENTS),
    KIND_STUCK: (HANG, CATEGORY_GPU_HANG),
    KIND_STRAGGLER: (HEALTHY, CATEGORY_STRAGGLER),
}


def verdict(findings: list[Finding], ops: list[MatchedOp]) -> Verdict:
    """Weigh the findings: the strongest kind decides status and category; culprits in that order."""
    blaming = [f for f in findings if f.kind != KIND_NO_DUMP or f.culprit_ranks]
    if not blaming:
        unfinished = [op for op in ops if op.status == INCOMPLETE]
        if unfinished:
            op = unfinished[0]
            return Verdict(
                UNDECIDED,
                (),
                CATEGORY_NONE,
                f"undecided: {where(op)} did not complete on every rank, and the dumps do not say why",
                [f"{len(unfinished)} ops did not complete everywhere."],
            )
        informational = [f.summary for f in findings]
        return Verdict(
            HEALTHY,
            (),
            CATEGORY_NONE,
            "healthy: every op matched on every rank" + (f" ({'; '.join(informational)})" if informational else ""),
            informational,
        )
    order = list(_WEIGHT)
    # Findings that name a culprit come first: a victim's finding explains nothing by itself.
    ranked = sorted(
        blaming, key=lambda f: (not f.culprit_ranks and f.kind != KIND_STUCK, order.index(f.kind), f.time_ns)
    )
    top = ranked[0]
    status, category = _WEIGHT[top.kind]
    culprits: list[int] = []
    for finding in ranked:
        for rank in finding.culprit_ranks:
            if rank not in culprits:
                culprits.append(rank)
    if status != HEALTHY and not top.culprit_ranks and top.kind != KIND_STUCK:
        status = UNDECIDED
    summary = f"{status}: {top.summary}"
    return Verdict(status, tuple(culprits), category, summary, [f.summary for f in ranked])


def diagnose(job: Job, ops: list[MatchedOp]) -> Diagnosis:
    """Run every rule over the job's matched ops and weigh the findings into a verdict."""
    evidence = gather_evidence(job, ops)
    findings = [finding for rule in RULES for finding in rule(evidence)]
    # A deadlock already explains the missing ops it is made of.
    deadlocked = {k for f in findings if f.kind == KIND_DEADLOCK for k in f.op_keys}
    findings = [f for f in findings if not (f.kind == KIND_MISSING and set(f.op_keys) <= deadlocked)]
    return Diagnosis(verdict(findings, ops), findings)
