"""Line up the same op across ranks.

Collectives match on (group, collective seq), point-to-point ops on (group, source, destination,
p2p seq), where group means name plus members. Every entry is visited a constant number of times
(hash joins), so the cost grows linearly with the number of entries.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from operator import attrgetter

from .job import Job
from .model import (
    COMPLETED,
    INCOMPLETE,
    MISMATCH,
    MISSING,
    OK,
    SCHEDULED,
    STUCK,
    Entry,
    Group,
    MatchedOp,
    closes_coalesced_group,
    head_entry,
    inner_entries,
    majority_op,
    state_entry,
)
from .speedups import SPEEDUPS as _speedups

# Ops whose input sizes must agree on every rank. Others (gather, scatter, all_to_all, p2p) may
# legitimately differ between ranks.
SAME_SIZE_OPS = frozenset(
    {
        "all_reduce",
        "allreduce",
        "broadcast",
        "_broadcast_oop",
        "reduce",
        "all_gather",
        "allgather",
        "_allgather_base",
        "all_gather_into_tensor",
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce_scatter_tensor",
        "all_reduce_barrier",
        "barrier",
    }
)

CollectiveKey = tuple[Group, int]
P2PKey = tuple[Group, int, int, int]


_op_of = attrgetter("op")
# Where the C speed-ups find what they read in an Entry.
_BUCKET_FIELDS = tuple(Entry._fields.index(name) for name in ("group_name", "is_p2p", "collective_seq"))
_SCAN_FIELDS = tuple(
    Entry._fields.index(name)
    for name in ("time_created_ns", "op", "input_sizes", "input_dtypes", "state", "backend", "closed_by")
)
# Backends that record when an op was enqueued, never when it completed.
NO_COMPLETION_BACKENDS = ("gloo", "c10d")


def link_coalesced(job: Job) -> None:
    """Point every op inside a coalesced group at the entry that closes it (``Entry.closed_by``).

    A coalesced group is a run of entries of one group on one rank sharing a seq (the p2p seq for
    point-to-point batches), ended by a ``coalesced`` / ``*_coalesced`` entry.
    """
    ends: dict[str, bool] = {}  # op name -> whether it closes a coalesced group
    for dump in job.dumps.values():
        ops = set(map(_op_of, dump.entries))
        for op in ops - ends.keys():
            ends[op] = closes_coalesced_group(op)
        if not any(ends[op] for op in ops):
            continue  # most ranks never coalesce: nothing to link
        entries = dump.entries
        open_runs: dict[tuple[str, bool, int], list[int]] = {}  # -> positions of the run's entries
        for position, entry in enumerate(entries):
            seq = entry.p2p_seq if entry.is_p2p else entry.collective_seq
            key = (entry.group_name, entry.is_p2p, seq)
            if ends[entry.op]:
                for inner in open_runs.pop(key, ()):
                    entries[inner] = entries[inner]._replace(closed_by=entry)
            else:
                run = open_runs.get(key)
                if run is not None:
                    run.append(position)
                else:
                    open_runs[key] = [position]
        # Runs never closed are plain ops.


def match_ops(job: Job) -> list[MatchedOp]:
    """Every op of the job, matched across ranks and classified, in the order the ops began."""
    link_coalesced(job)
    collectives: dict[CollectiveKey, dict[int, list[Entry]]] = defaultdict(dict)
    p2p: dict[P2PKey, dict[int, list[Entry]]] = defaultdict(dict)
    covered: dict[tuple[int, Group], list[int]] = {}  # (rank, group) -> [first seq, last seq]
    bucket = _speedups.bucket_collectives if _speedups is not None else _bucket_collectives
    named: dict[int, dict[str, Group]] = defaultdict(dict)  # rank -> group name -> the group it means there
    for (rank, name), group in job.group_of.items():
        named[rank][name] = group
    for rank, dump in job.dumps.items():
        groups_by_name = named[rank]
        for entry in bucket(dump.entries, rank, groups_by_name, collectives, covered, _BUCKET_FIELDS):
            if entry.p2p_local is None:
                continue  # the closing entry of a p2p batch; its state lives on in closed_by
            group = groups_by_name[entry.group_name]
            src, dst = (group.global_rank(x) for x in entry.p2p_local)
            if src is None or dst is None:
                src, dst = entry.p2p_local  # trust the numbers rather than drop the op
            p2p[(group, src, dst, entry.p2p_seq)].setdefault(rank, []).append(entry)

    ops: list[MatchedOp] = []
    scans: dict[int, tuple[bool, int]] = {}  # id(op) -> (alike, pending): see _scan
    for (group, seq), entries in collectives.items():
        first_time, alike, pending, created, states = _scan(entries)
        op = MatchedOp(
            group=group, kind="collective", seq=seq, entries=entries, first_time_ns=first_time, created_ns=created,
            states=states,
        )  # fmt: skip
        _find_absent(op, job, covered)
        ops.append(op)
        scans[id(op)] = (alike, pending)
    for (group, src, dst, seq), entries in p2p.items():
        first_time, alike, pending, created, states = _scan(entries)
        op = MatchedOp(
            group=group, kind="p2p", seq=seq, entries=entries, peers=(src, dst), first_time_ns=first_time,
            created_ns=created, states=states,
        )  # fmt: skip
        absent = [r for r in (src, dst) if r not in entries]
        op.missing = tuple(r for r in absent if r in job.dumps)
        op.unknown = tuple(r for r in absent if r not in job.dumps)
        ops.append(op)
        scans[id(op)] = (alike, pending)
    ops.sort(key=lambda o: (o.first_time_ns, o.group.order, o.seq))
    for number, op in enumerate(ops, start=1):
        op.op_key = number
        alike, pending = scans[id(op)]
        # When every rank issued the same ops, the first rank's op is the majority's.
        op.name = head_entry(next(iter(op.entries.values()))).op if alike else majority_op(op.entries)
        classify(op, alike, pending)
    return ops


def _bucket_collectives(
    entries: list[Entry],
    rank: int,
    groups_by_name: dict[str, Group],
    collectives: dict[CollectiveKey, dict[int, list[Entry]]],
    covered: dict[tuple[int, Group], list[int]],
    fields: tuple[int, ...] = (),
) -> list[Entry]:
    """File each collective entry of one rank under its (group, seq) in ``collectives`` and widen the
    rank's span of seqs on that group in ``covered``; return the rank's p2p entries, in order.

    ``_speedups.bucket_collectives`` does the same in C (``fields``: where it finds what it reads).
    """
    p2p_entries = []
    for entry in entries:
        if entry.is_p2p:
            p2p_entries.append(entry)
            continue
        group = groups_by_name[entry.group_name]
        seq = entry.collective_seq
        collectives[(group, seq)].setdefault(rank, []).append(entry)
        span = covered.get((rank, group))
        if span is None:
            covered[(rank, group)] = [seq, seq]
        elif seq > span[1]:
            span[1] = seq
        elif seq < span[0]:
            span[0] = seq
    return p2p_entries


def _scan(entries_by_rank: dict[int, list[Entry]]) -> tuple[int, bool, int, list[int], list[str]]:
    """What ``_scan_in_python`` says; in C where the speed-ups are built and every rank holds one entry."""
    if _speedups is not None:
        scanned = _speedups.scan_op(entries_by_rank, _SCAN_FIELDS, COMPLETED, SCHEDULED, NO_COMPLETION_BACKENDS)
        if scanned is not None:
            return scanned  # type: ignore[no-any-return]
    return _scan_in_python(entries_by_rank)


def _scan_in_python(entries_by_rank: dict[int, list[Entry]]) -> tuple[int, bool, int, list[int], list[str]]:
    """One pass over an op's entries: when the first rank enqueued it, whether every rank issued the
    same ops with the same sizes and dtypes, how many ranks have not completed it, and, in the order of
    ``entries_by_rank``, when each rank enqueued it (its first entry) and the state of its part.

    At thousands of ranks, reaching each entry in memory costs more than what is done with it, so
    everything the matcher and the diagnosis need of the entries is taken in this one visit.
    """
    first_time = -1
    alike = True
    reference: Entry | tuple[object, ...] | None = None
    pending = 0
    created_ns = []
    states = []
    for entries in entries_by_rank.values():
        head = entries[0]
        created = head.time_created_ns
        created_ns.append(created)
        if created < first_time or first_time < 0:
            first_time = created
        if len(entries) == 1:
            if reference is None:
                reference = head
            elif alike and (
                type(reference) is tuple
                or head.op != reference.op  # type: ignore[union-attr]
                or head.input_sizes != reference.input_sizes  # type: ignore[union-attr]
                or head.input_dtypes != reference.input_dtypes  # type: ignore[union-attr]
            ):
                alike = False
        else:
            signature = tuple((e.op, e.input_sizes, e.input_dtypes) for e in entries)
            if reference is None:
                reference = signature
            elif signature != reference:
                alike = False
        last = state_entry(entries)
        states.append(last.state)
        if last.state != COMPLETED and tracks_completion(last):
            pending += 1
    return first_time, alike, pending, created_ns, states


def _find_absent(op: MatchedOp, job: Job, covered: dict[tuple[int, Group], list[int]]) -> None:
    """Sort the members without an entry into ``missing`` (never issued) and ``unknown``."""
    missing: list[int] = []
    unknown: list[int] = []
    for rank in op.group.members:
        if rank in op.entries:
            continue
        dump = job.dumps.get(rank)
        if dump is None:
            unknown.append(rank)
            continue
        span = covered.get((rank, op.group))
        if span is not None and op.seq > span[1]:
            missing.append(rank)  # it never got this far: the classic hang
        elif dump.may_have_wrapped and (span is None or op.seq < span[0]):
            unknown.append(rank)  # older than what its ring buffer still holds
        else:
            missing.append(rank)
    op.missing, op.unknown = tuple(missing), tuple(unknown)


def _signature(entries: list[Entry], what: str) -> tuple[object, ...]:
    inner = inner_entries(entries)
    if what == "op":
        return tuple(e.op for e in inner)
    if what == "size":
        return tuple(e.input_sizes for e in inner)
    return tuple(e.input_dtypes for e in inner)


def classify(op: MatchedOp, alike: bool | None = None, pending: int | None = None) -> None:
    """Set ``op.status`` (and the mismatch fields) from the entries each rank holds.

    ``alike`` and ``pending``: what ``_scan(op.entries)`` says, if the caller knows it already.
    """
    if alike is None or pending is None:
        _, alike, pending, _, _ = _scan(op.entries)
    if op.missing:
        op.status = MISSING
        return
    if op.kind == "collective" and len(op.entries) > 1 and not alike:
        for what in ("op", "size", "dtype"):
            if what == "size" and op.name not in SAME_SIZE_OPS:
                continue
            signatures = {rank: _signature(entries, what) for rank, entries in op.entries.items()}
            counts = Counter(signatures.values())
            if len(counts) > 1:
                op.status = MISMATCH
                op.mismatch = what
                op.mismatch_ranks = minority(signatures)
                return
    if op.kind == "p2p" and op.peers and len(op.entries) == 2:
        sizes = {head_entry(e).input_sizes or head_entry(e).output_sizes for e in op.entries.values()}
        dtypes = {head_entry(e).input_dtypes or head_entry(e).output_dtypes for e in op.entries.values()}
        if len(sizes) > 1 or len(dtypes) > 1:
            op.status, op.mismatch = MISMATCH, "size" if len(sizes) > 1 else "dtype"
            op.mismatch_ranks = ()
            return
    if not pending:
        op.status = OK  # done, or nothing says otherwise: gloo records no completion
    elif pending == len(op.entries) and not op.unknown:
        op.status = STUCK  # everyone is in it and nobody came out
    else:
        op.status = INCOMPLETE


def tracks_completion(entry: Entry) -> bool:
    """Whether the entry's backend records completion (NCCL and its kin do; gloo never does)."""
    return entry.backend not in NO_COMPLETION_BACKENDS or entry.state != SCHEDULED


def minority(signatures: dict[int, tuple[object, ...]]) -> tuple[int, ...]:
    """Ranks whose value differs from the majority; with no strict majority, every rank."""
    counts = Counter(signatures.values())
    (top, top_count), *rest = counts.most_common()
    if rest and rest[0][1] == top_count:
        return tuple(sorted(signatures))
    return tuple(sorted(rank for rank, sig in signatures.items() if sig != top))
