"""Match each send with its recv by their order within the pair, not by ``p2p_seq_id``.

``p2p_seq_id`` is no pair's counter: ``ProcessGroupNCCL::pointToPoint`` bumps one ``seqP2P_`` per rank
and group for each single send/recv, and once per batch, whatever the peer, so a send and the recv it
meets carry different numbers as soon as either rank has talked to a third one (every middle stage of
a pipeline does). NCCL pairs them by order: within a group, the k-th send from a to b meets the k-th
recv at b from a. So each pair's sends (on a) and recvs (on b) are lined up in the order each rank
issued them, and ``p2p_seq_id`` only orders a rank's own ops.

When both ranks' buffers hold their whole history, the k-th of each side meet. When the ring buffer
dropped the oldest ops of a side, the sides are aligned from the newest back, on the last op each
completed (the two ends of a transfer complete together, and a pair's ops complete in order on each
side; where one side completed none, its oldest op comes after the other's last completed one),
among the nearby alignments that give every completed op an other end that began. Ops in a
batch carry the batch's state, which waits for all of its ops: an alignment that leaves a pending
batch with no op still waiting gives way to another. With nothing completed on either side, the newest
ops of both sides meet. What one side holds beyond the other's newest op the other never posted (missing); what lies
before a wrapped side's oldest op is unknown.

Nearly every transfer of a job completed on both ends alike, or completed on the one end a rank's buffer
still holds: those are settled from the ranks' columns, a pair's at once, with no entry made
(``Settled``); only the others are made into entries and lined up one by one (``PairOp``).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

from ..base.model import COMPLETED, SCHEDULED, Entry, Group, RankDump, entries_at, state_entry
from ..read.columns import NONE, STATES, EntryRows, LinkedRows, Tables
from ..read.job import Job

NEARBY = 2  # alignments tried on either side of the one the completion counts give
CLOCK_MARGIN_NS = 100_000_000  # times of two ranks are compared only by more than this

PairKey = tuple[Group, int, int]  # a pair: its group, the sending rank and the receiving one
# One side of a pair (its sends, or its recvs), in the order issued: the rank whose dump holds each op and
# its row there; the entries are made from these one pair at a time
HeldRows = tuple["array[int]", "array[int]"]


@dataclass(slots=True)
class PairOp:
    """One transfer of a pair: the send on ``source``, the recv on ``destination``, either maybe absent."""

    group: Group
    source: int
    destination: int
    index: int  # its place in the pair's order, from 1 (counted from the oldest op either side holds
    # when both sides' buffers wrapped)
    entries: dict[int, list[Entry]]
    missing: tuple[int, ...]
    unknown: tuple[int, ...]
    send_at: tuple[int, int] | None = None  # (the rank whose dump holds the send, its row there)
    recv_at: tuple[int, int] | None = None  # the same for the recv


@dataclass(slots=True)
class Settled:
    """Transfers of a pair that are settled from the ranks' columns, with no entry made: each send and recv
    held by its own rank, both completed, with the same sizes and dtypes; or one end, completed, whose other
    the other rank's buffer does not hold (what ``classify`` calls OK, that one unknown). A pipeline job's
    transfers are millions, nearly all of them so. One item a transfer in each list."""

    group: Group
    source: int
    destination: int
    indices: list[int]  # as ``PairOp.index``
    send_rows: list[int]  # the send's row in the source's dump (``NONE``: it holds none)
    recv_rows: list[int]  # the recv's row in the destination's dump (``NONE``: it holds none)
    first_times: list[int]  # when the first of its ends was enqueued
    names: list[str]  # the op most of its ranks issued (``_scan_transfer``)
    in_batch: list[bool]  # either end in a batch

    @property
    def peers(self) -> tuple[int, int]:
        return self.source, self.destination


class _Ends(NamedTuple):
    """What a rank's columns say of one side of a pair (its sends, or its recvs), op by op in the order
    issued: the index into ``STATES`` of its state (its state entry's, ``state_entry``), when it was
    enqueued, the ids (into ``tables``) of its op, its input sizes and its input dtypes, and whether
    another entry closes it (a batch's op)."""

    tables: Tables
    states: list[int]
    created: list[int]
    ops: list[int]
    sizes: list[int]
    dtypes: list[int]
    closed: list[bool]


def file_transfers(
    job: Job, sides: dict[PairKey, tuple[HeldRows, HeldRows]], rank: int, rows: Sequence[int], entries: list[Entry]
) -> None:
    """File ``rank``'s sends and recvs ``entries`` (at ``rows`` of its dump) under their pair's sides in
    ``sides``, by row: a pipeline's sends and recvs are a third of its entries, too many to hold at once."""
    pair_of: dict[tuple[str, tuple[int, int]], PairKey] = {}  # (group name, local peers) -> their pair
    for row, entry in zip(rows, entries, strict=True):
        peers = entry.p2p_local
        if peers is None:
            continue  # the closing entry of a batch: its state lives on in closed_by
        key = pair_of.get((entry.group_name, peers))
        if key is None:
            group = job.group_of[(rank, entry.group_name)]
            src, dst = (group.global_rank(x) for x in peers)
            if src is None or dst is None:
                src, dst = peers  # trust the numbers rather than drop the op
            key = pair_of[(entry.group_name, peers)] = (group, src, dst)
        pair = sides.get(key) or sides.setdefault(key, ((array("i"), array("I")), (array("i"), array("I"))))
        owners, at = pair[entry.op in ("recv", "irecv")]
        owners.append(rank)
        at.append(row)


def pair_ops(job: Job, sides: dict[PairKey, tuple[HeldRows, HeldRows]]) -> Iterator[PairOp | Settled]:
    """Every transfer of the job, from each pair's sends and recvs (``file_transfers``): those settled from
    columns (``Settled``, a pair's at once), then the rest each a ``PairOp``. It empties ``sides``: a pair's
    entries are made when it is lined up, for the transfers not settled, and let go once they are yielded."""
    candidates = {
        key: _candidates(job, sends, recvs, job.dumps.get(key[1]), job.dumps.get(key[2]))
        for key, (sends, recvs) in sides.items()
    }
    # each pair's entries, where the alignments of some pair are weighed against batches of others
    made = (
        {key: (_made(job, sends), _made(job, recvs)) for key, (sends, recvs) in sides.items()}
        if any(len(options) > 1 for options in candidates.values())
        else {}
    )
    shifts = _settle_batches(made, candidates)
    for group, src, dst in list(sides):
        send_rows, recv_rows = sides.pop((group, src, dst))
        src_dump, dst_dump = job.dumps.get(src), job.dumps.get(dst)
        bases = _bases(shifts[(group, src, dst)], _whole(src_dump), _whole(dst_dump))
        settled = None if made else _settle(job, (group, src, dst), send_rows, recv_rows, bases)
        if settled is not None:
            yield settled
        done = set(settled.indices) if settled is not None else set()
        sends: Sequence[Entry | None]
        recvs: Sequence[Entry | None]
        if made:
            sends, recvs = made.pop((group, src, dst))
        else:  # the entries of the transfers left
            sends = _made_but(job, send_rows, {index - bases[0] for index in done})
            recvs = _made_but(job, recv_rows, {index - bases[1] for index in done})
        yield from _line_up(group, src, dst, (sends, send_rows), (recvs, recv_rows), src_dump, dst_dump, bases, done)


def _made(job: Job, held: HeldRows) -> list[Entry]:
    """The entries of one side of a pair, made a dump's run of rows at a time."""
    entries: list[Entry] = []
    for owner, run in groupby(zip(*held, strict=True), key=itemgetter(0)):
        entries += entries_at(job.dumps[owner].entries, [row for _, row in run])
    return entries


def _made_but(job: Job, held: HeldRows, left_out: set[int]) -> Sequence[Entry | None]:
    """``_made``, with None at the positions ``left_out``: no entry is made for them."""
    if not left_out:
        return _made(job, held)
    owners, rows = held
    kept = [position for position in range(len(rows)) if position not in left_out]
    made = iter(_made(job, (array("i", [owners[p] for p in kept]), array("I", [rows[p] for p in kept]))))
    return [None if position in left_out else next(made) for position in range(len(rows))]


def _settle(job: Job, key: PairKey, send_rows: HeldRows, recv_rows: HeldRows, bases: tuple[int, int]) -> Settled | None:
    """The transfers of a pair that its ranks' columns settle (``Settled``); None where they cannot tell
    (entries made otherwise, ranks whose ids index other tables, a rank sending to itself)."""
    group, src, dst = key
    if src == dst:
        return None
    sends, recvs = _ends(job, src, send_rows), _ends(job, dst, recv_rows)
    if sends is None or recvs is None or sends.tables is not recvs.tables:
        return None
    completed = STATES.index(COMPLETED)
    ops, sizes, dtypes = (sends.tables[name] for name in ("ops", "sizes", "dtypes"))
    settled = Settled(group, src, dst, [], [], [], [], [], [])
    send_base, recv_base = bases
    both = range(max(send_base, recv_base), min(send_base + len(sends.states), recv_base + len(recvs.states)))
    for index in both:
        at, other = index - send_base, index - recv_base
        size, dtype = sends.sizes[at], sends.dtypes[at]
        # as ``classify`` compares them: the input sizes and dtypes (ids: one per value), where there are some
        if not (
            sends.states[at] == completed == recvs.states[other]
            and size == recvs.sizes[other]
            and dtype == recvs.dtypes[other]
            and sizes[size]
            and dtypes[dtype]
        ):
            continue
        settled.indices.append(index)
        settled.send_rows.append(send_rows[1][at])
        settled.recv_rows.append(recv_rows[1][other])
        settled.first_times.append(min(sends.created[at], recvs.created[other]))
        settled.names.append(max(ops[sends.ops[at]][1], ops[recvs.ops[other]][1]))
        settled.in_batch.append(sends.closed[at] or recvs.closed[other])
    # one end only, the other older than its rank's buffer or lost with it: a transfer completes only once
    # both ends ran, so the other is unknown (``_never_posted``), and the op OK
    for ends, base, rows, is_send in ((sends, send_base, send_rows[1], True), (recvs, recv_base, recv_rows[1], False)):
        for at, state in enumerate(ends.states):
            if state != completed or base + at in both:
                continue
            settled.indices.append(base + at)
            settled.send_rows.append(rows[at] if is_send else NONE)
            settled.recv_rows.append(NONE if is_send else rows[at])
            settled.first_times.append(ends.created[at])
            settled.names.append(ops[ends.ops[at]][1])
            settled.in_batch.append(ends.closed[at])
    return settled if settled.indices else None


def _ends(job: Job, rank: int, held: HeldRows) -> _Ends | None:
    """``_Ends`` of a side of a pair from its rank's columns; None where some of its ops are held by another
    rank's dump, or its entries are not made from columns that tell."""
    owners, rows = held
    dump = job.dumps.get(rank)
    if dump is None or owners.count(rank) != len(owners):
        return None
    read = _read_from_columns(dump.entries, rows)
    if read is None:
        return None
    entries, tables, state_rows = read
    columns: list[list[int]] = []
    for field, at in (
        ("state", state_rows), ("time_created_ns", rows), ("op", rows), ("input_sizes", rows), ("input_dtypes", rows)
    ):  # fmt: skip
        values = entries.raw_at(field, at)
        if values is None:
            return None
        columns.append(values)
    states, created, ops, sizes, dtypes = columns
    return _Ends(tables, states, created, ops, sizes, dtypes, [a != b for a, b in zip(state_rows, rows, strict=True)])


def _read_from_columns(
    entries: Sequence[Entry], rows: Sequence[int]
) -> tuple[EntryRows | LinkedRows, Tables, list[int]] | None:
    """Where a rank's entries at ``rows`` can be read from its columns (``raw_at``): those entries, the tables
    their ids index and the row of each one's state entry; None where they cannot."""
    if isinstance(entries, LinkedRows):
        tables, state_rows = entries.base.tables, entries.state_rows(rows)
    elif isinstance(entries, EntryRows):
        tables, state_rows = entries.tables, list(rows)
    else:
        return None
    return None if tables is None or state_rows is None else (entries, tables, state_rows)


def _states(job: Job, held: HeldRows) -> list[str]:
    """The state of each op of one side of a pair (its state entry's): read from its rank's columns where
    they tell it, else from its entries."""
    states: list[str] = []
    for owner, run in groupby(zip(*held, strict=True), key=itemgetter(0)):
        rows = [row for _, row in run]
        entries = job.dumps[owner].entries
        read = _read_from_columns(entries, rows)
        indices = read[0].raw_at("state", read[2]) if read is not None else None
        if indices is None:
            states += [state_entry([entry]).state for entry in entries_at(entries, rows)]
        else:
            states += map(STATES.__getitem__, indices)
    return states


def _whole(dump: RankDump | None) -> bool:
    return dump is not None and not dump.may_have_wrapped


def _candidates(
    job: Job, sends: HeldRows, recvs: HeldRows, src_dump: RankDump | None, dst_dump: RankDump | None
) -> list[int]:
    """The alignments worth considering for a pair (recv j meets send j + shift), the likeliest first."""
    if (_whole(src_dump) and _whole(dst_dump)) or not sends[1] or not recvs[1]:
        return [0]
    return _shifts(_states(job, sends), _states(job, recvs))


def _settle_batches(
    sides: dict[PairKey, tuple[list[Entry], list[Entry]]], candidates: dict[PairKey, list[int]]
) -> dict[PairKey, int]:
    """Each pair's alignment: its likeliest, unless that leaves a batch impossible.

    A batch completes once all of its ops do, so a batch that did not complete holds at least one op
    whose other end did not complete. Where a pair's likeliest alignment pairs every op of such a batch
    with a completed other end, the pair's other candidates are tried (a batch's state lags behind
    the transfers it already made, and completion counts mislead)."""
    shifts = {key: options[0] for key, options in candidates.items()}
    undecided = [key for key, options in candidates.items() if len(options) > 1]
    if not undecided:
        return shifts
    where: dict[int, tuple[PairKey, bool, int]] = {}  # id(entry) -> (pair, is a send, position)
    # closing entry (its rank's, by value: entries made apart share none) -> its batch's ops
    batches: dict[Entry, list[Entry]] = {}
    for key, (sends, recvs) in sides.items():
        for is_send, side in ((True, sends), (False, recvs)):
            for position, entry in enumerate(side):
                where[id(entry)] = (key, is_send, position)
                if entry.closed_by is not None and entry.closed_by.state != COMPLETED:
                    batches.setdefault(entry.closed_by, []).append(entry)
    if not batches:
        return shifts

    def other_end(entry: Entry) -> Entry | None:
        key, is_send, position = where[id(entry)]
        sends, recvs = sides[key]
        return _at(recvs, position - shifts[key]) if is_send else _at(sends, position + shifts[key])

    batches_of: dict[PairKey, list[list[Entry]]] = {}  # pair -> the pending batches holding one of its ops
    for ops in batches.values():
        for key in {where[id(op)][0] for op in ops}:
            batches_of.setdefault(key, []).append(ops)

    def impossible(key: PairKey) -> int:
        """Pending batches that hold an op of ``key`` and whose every op meets a completed other end."""
        count = 0
        for ops in batches_of.get(key, ()):
            ends = [other_end(op) for op in ops]
            if all(end is not None and state_entry([end]).state == COMPLETED for end in ends):
                count += 1
        return count

    for _ in range(3):
        changed = False
        for key in undecided:
            options = candidates[key]
            best = min(options, key=lambda shift: (_try(shifts, key, shift, impossible), options.index(shift)))
            if best != shifts[key]:
                shifts[key] = best
                changed = True
        if not changed:
            break
    return shifts


def _try(shifts: dict[PairKey, int], key: PairKey, shift: int, impossible: Callable[[PairKey], int]) -> int:
    previous = shifts[key]
    shifts[key] = shift
    try:
        return impossible(key)
    finally:
        shifts[key] = previous


def _line_up(
    group: Group,
    src: int,
    dst: int,
    send_side: tuple[Sequence[Entry | None], HeldRows],
    recv_side: tuple[Sequence[Entry | None], HeldRows],
    src_dump: RankDump | None,
    dst_dump: RankDump | None,
    bases: tuple[int, int],
    settled: set[int],
) -> Iterator[PairOp]:
    """A pair's transfers but those ``settled`` (their indices): its sends and recvs (each side's entries,
    None where settled, and where they are held) lined up."""
    (sends, (send_owners, send_rows)), (recvs, (recv_owners, recv_rows)) = send_side, recv_side
    send_base, recv_base = bases
    first = min(send_base if sends else recv_base, recv_base if recvs else send_base)
    last = max(send_base + len(sends), recv_base + len(recvs))
    for index in range(first, last):
        if index in settled:
            continue
        entries: dict[int, list[Entry]] = {}
        op = PairOp(group, src, dst, index, entries, (), ())
        send = sends[index - send_base] if 0 <= index - send_base < len(sends) else None
        if send is not None:
            entries[src] = [send]
            op.send_at = (send_owners[index - send_base], send_rows[index - send_base])
        recv = recvs[index - recv_base] if 0 <= index - recv_base < len(recvs) else None
        if recv is not None:
            entries.setdefault(dst, []).append(recv)
            op.recv_at = (recv_owners[index - recv_base], recv_rows[index - recv_base])
        present = send or recv
        assert present is not None
        missing: list[int] = []
        unknown: list[int] = []
        for rank, held, base, dump in ((src, sends, send_base, src_dump), (dst, recvs, recv_base, dst_dump)):
            if (send if rank == src else recv) is not None or (rank == src == dst):
                continue
            if _never_posted(index, held, base, dump, present):
                missing.append(rank)
            else:
                unknown.append(rank)
        op.missing, op.unknown = tuple(missing), tuple(unknown)
        yield op


def _never_posted(index: int, held: Sequence[Entry | None], base: int, dump: RankDump | None, present: Entry) -> bool:
    """Whether the side that holds no op at ``index`` never posted it (rather than lost it)."""
    if dump is None:
        return False  # no dump: unknown
    if state_entry([present]).state == COMPLETED:
        return False  # a transfer completes only once both ends ran: the other end was lost
    if held:
        if index >= base + len(held):
            return True  # newer than anything it posted
        return not dump.may_have_wrapped  # older than its oldest: lost, if its buffer wrapped
    if not dump.may_have_wrapped or not dump.entries:
        return True
    # its buffer covers the time the other end posted it (by more than two hosts' clocks may differ)
    return present.time_created_ns >= dump.entries[0].time_created_ns + CLOCK_MARGIN_NS


def _bases(shift: int, send_whole: bool, recv_whole: bool) -> tuple[int, int]:
    """The pair index of each side's first op, given how far the sends run ahead."""
    if send_whole and recv_whole:
        return 1, 1
    if send_whole:
        return 1, max(1, 1 + shift)
    if recv_whole:
        return max(1, 1 - shift), 1
    return (1, 1 + shift) if shift >= 0 else (1 - shift, 1)


def _shifts(sends: list[str], recvs: list[str]) -> list[int]:
    """The alignments that give every completed op an other end that began, nearest to the one the
    completion counts give first (that one alone where none is consistent)."""
    send_side, recv_side = _Side(sends), _Side(recvs)
    last_send, last_recv = send_side.last_completed, recv_side.last_completed
    if last_recv is None:
        if last_send is None:
            return [len(sends) - len(recvs)]  # the newest ops meet
        anchor = last_send + 1  # the recvs it holds all came after the last transfer that completed
    elif last_send is None:
        anchor = -(last_recv + 1)
    else:
        anchor = last_send - last_recv
    nearby = sorted(range(anchor - NEARBY, anchor + NEARBY + 1), key=lambda shift: (abs(shift - anchor), shift))
    return [
        shift for shift in nearby if recv_side.can_meet(send_side, shift) and send_side.can_meet(recv_side, -shift)
    ] or [anchor]


class _Side:
    """One side of a pair (its sends, or its recvs) as the alignments are judged on it: where its completed
    ops and its scheduled ones stand. A pipeline's pairs hold hundreds of thousands of ops, each
    alignment tried on all of them."""

    def __init__(self, states: list[str]) -> None:
        """``states``: each op's (its state entry's), in the order issued."""
        self.length = len(states)
        self.completed = {position for position, state in enumerate(states) if state == COMPLETED}
        self.last_completed = max(self.completed, default=None)
        self.scheduled = [position for position, state in enumerate(states) if state == SCHEDULED]

    def can_meet(self, theirs: _Side, shift: int) -> bool:
        """Whether each completed op of this side (at j) meets an other end that began (``theirs``' op at
        j + shift, not scheduled), or one lost to their ring buffer (older than their oldest); never one
        newer than all they posted. A transfer completes only once both ends run (an end may still say
        ``started`` where its rank dumped before it noticed the completion, or where its batch waits for
        another of its ops)."""
        if self.last_completed is not None and self.last_completed + shift >= theirs.length:
            return False
        return not any(position - shift in self.completed for position in theirs.scheduled)


def _at(side: list[Entry], position: int) -> Entry | None:
    return side[position] if 0 <= position < len(side) else None
