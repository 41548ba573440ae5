"""Line up the same op across ranks.

Collectives match on (group, collective seq), where group means name plus members; send/recv by
their order within each pair (``pairs``); coalesced groups are tied together first (``coalesce``).
Every entry is visited a constant number of times (hash joins), so the cost grows linearly with the
number of entries.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ..base.model import (
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
    RankDump,
    head_entry,
    inner_entries,
    majority_op,
    state_entry,
)
from ..base.speedups import SPEEDUPS as _speedups
from ..read.job import Job
from .arguments import dtypes_that_agree, sizes_that_agree
from .coalesce import link_coalesced
from .pairs import CLOCK_MARGIN_NS, pair_ops

CollectiveKey = tuple[Group, int]


# Where the C speed-ups find what they read in an Entry.
_BUCKET_FIELDS = tuple(Entry._fields.index(name) for name in ("group_name", "is_p2p", "collective_seq"))
_SCAN_FIELDS = tuple(
    Entry._fields.index(name)
    for name in ("time_created_ns", "op", "input_sizes", "input_dtypes", "state", "backend", "closed_by")
)
# Backends that record when an op was enqueued, never when it completed.
NO_COMPLETION_BACKENDS = ("gloo", "c10d")


def match_ops(job: Job) -> list[MatchedOp]:
    """Every op of the job, matched across ranks and classified, in the order the ops began."""
    link_coalesced(job)
    collectives: dict[CollectiveKey, dict[int, list[Entry]]] = defaultdict(dict)
    covered: dict[tuple[int, Group], list[int]] = {}  # (rank, group) -> [first seq, last seq]
    bucket = _speedups.bucket_collectives if _speedups is not None else _bucket_collectives
    named: dict[int, dict[str, Group]] = defaultdict(dict)  # rank -> group name -> the group it means there
    for (rank, name), group in job.group_of.items():
        named[rank][name] = group
    p2p_by_rank: dict[int, list[Entry]] = {}
    for rank, dump in job.dumps.items():
        p2p_entries = bucket(dump.entries, rank, named[rank], collectives, covered, _BUCKET_FIELDS)
        if p2p_entries:
            p2p_by_rank[rank] = p2p_entries
            if not dump.version.startswith("1."):  # 1.x: one seq for both kinds
                _widen_by_p2p(p2p_entries, rank, named[rank], covered, dump.renumbered_groups)

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
    for pair in pair_ops(job, p2p_by_rank):
        first_time, alike, pending, created, states = _scan(pair.entries)
        op = MatchedOp(
            group=pair.group, kind="p2p", seq=pair.index, entries=pair.entries, missing=pair.missing,
            unknown=pair.unknown, peers=(pair.source, pair.destination), first_time_ns=first_time,
            created_ns=created, states=states,
        )  # fmt: skip
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


def _widen_by_p2p(
    p2p_entries: list[Entry],
    rank: int,
    groups_by_name: dict[str, Group],
    covered: dict[tuple[int, Group], list[int]],
    renumbered: list[str],
) -> None:
    """Raise each (rank, group) span's last seq to what the rank's sends and recvs say of it.

    A send or recv records its group's collective counter as it stands (in ``ProcessGroupNCCL.cpp``,
    ``initWork`` records ``seqCollective_`` and ``seqP2P_`` on every entry, and ``pointToPoint`` bumps
    only ``seqP2P_``): the rank had issued that many collectives of the group when it sent. So a rank
    whose newest entry in a group is a send with collective seq 0 never issued the group's collective
    #1, even where its ring buffer holds no collective of the group to say so; and the collectives up
    to that seq are older than its buffer. Not on a group whose collectives were renumbered
    (``renumbered``): its sends keep the old count.
    """
    for entry in p2p_entries:
        group = groups_by_name.get(entry.group_name)
        if group is None or entry.group_name in renumbered:
            continue
        seq = entry.collective_seq
        span = covered.get((rank, group))
        if span is None:
            covered[(rank, group)] = [seq + 1, seq]  # none held: older than the buffer up to seq, never after
        elif seq > span[1]:
            span[1] = seq


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
                # past a plain tuple (a signature) it is an Entry: ``type() is``, cheaper, narrows nothing for mypy
                type(reference) is tuple
                or head.op != reference.op  # type: ignore[attr-defined]
                or head.input_sizes != reference.input_sizes  # type: ignore[attr-defined]
                or head.input_dtypes != reference.input_dtypes  # type: ignore[attr-defined]
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
    members = op.group.members
    if len(op.entries) >= len(members) and all(map(op.entries.__contains__, members)):
        return  # every member issued it (the common case: checked at C speed)
    missing: list[int] = []
    unknown: list[int] = []
    for rank in members:
        if rank in op.entries:
            continue
        dump = job.dumps.get(rank)
        if dump is None:
            unknown.append(rank)
            continue
        span = covered.get((rank, op.group))
        if span is not None and op.seq > span[1]:
            missing.append(rank)  # it never got this far: the classic hang
        elif dump.may_have_wrapped and span is None and _buffer_covers(dump, op.first_time_ns):
            missing.append(rank)  # none of the group's ops in its buffer, which covers when the others issued it
        elif dump.may_have_wrapped and (span is None or op.seq < span[0]):
            unknown.append(rank)  # older than what its ring buffer still holds
        else:
            missing.append(rank)
    op.missing, op.unknown = tuple(missing), tuple(unknown)


def _buffer_covers(dump: RankDump, time_ns: int) -> bool:
    """Whether a wrapped ring buffer still holds what its rank issued at ``time_ns`` (another rank's
    clock: by more than two hosts' clocks may differ)."""
    return bool(dump.entries) and time_ns >= dump.entries[0].time_created_ns + CLOCK_MARGIN_NS


def signature(entries: list[Entry], what: str) -> tuple[object, ...]:
    """What a rank passed to an op that every member must pass alike (``arguments``): its ops, the
    sizes their rule reads, or the dtypes they name."""
    inner = inner_entries(entries)
    if what == "op":
        return tuple(e.op for e in inner)
    if what == "size":
        return tuple(sizes_that_agree(e) for e in inner)
    return tuple(dtypes_that_agree(e) for e in inner)


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
            signatures = {rank: signature(entries, what) for rank, entries in op.entries.items()}
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
