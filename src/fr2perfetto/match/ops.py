"""Line up the same op across ranks.

Collectives match on (group, collective seq), where group means name plus members; send/recv by
their order within each pair (``pairs``); coalesced groups are tied together first (``coalesce``).
Collectives are filed from the ranks' columns (``EntryRows.kept_columns``: group, seq, op, sizes, dtypes,
state and creation time as bytes, ids into tables the ranks share), in one pass in C, where whether an op's
ranks agree is a comparison of ids; the entries themselves are only put where they belong. Every entry
is visited a constant number of times (hash joins), so the cost grows linearly with the number of
entries.
"""

from __future__ import annotations

from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from operator import lt
from typing import Any

from ..base.model import (
    COMPLETED,
    INCOMPLETE,
    MISMATCH,
    MISSING,
    OK,
    SCHEDULED,
    STUCK,
    EntriesByRank,
    Entry,
    Group,
    MatchedOp,
    RankDump,
    entries_at,
    head_entry,
    inner_entries,
    majority_op,
    state_entry,
)
from ..base.speedups import SPEEDUPS as _speedups
from ..read.columns import (
    KEPT_COLUMNS,
    NONE,
    STATES,
    EntryRows,
    JobTables,
    LinkedRows,
    Tables,
    column_bytes,
    first_uses,
    from_entries,
    gather,
)
from ..read.job import Job
from .arguments import dtypes_that_agree, sizes_that_agree
from .coalesce import link_coalesced
from .pairs import CLOCK_MARGIN_NS, HeldRows, PairKey, PairOp, Settled, file_transfers, pair_ops

# Backends that record when an op was enqueued, never when it completed.
NO_COMPLETION_BACKENDS = ("gloo", "c10d")
NO_GROUP = 0xFFFFFFFF  # in a rank's column of group indices: a group the rank does not know by that name


def match_ops(job: Job) -> list[MatchedOp]:
    """Every op of the job, matched across ranks and classified, in the order the ops began."""
    link_coalesced(job)
    if any(a > b for a, b in pairwise(job.dumps)):  # an op's ranks are found by bisection: in order
        job.dumps = dict(sorted(job.dumps.items()))
    named: dict[int, dict[str, Group]] = defaultdict(dict)  # rank -> group name -> the group it means there
    for (rank, name), group in job.group_of.items():
        named[rank][name] = group
    groups, inputs, op_names, untracked, name_list = _take_collective_columns(job, named)
    # each group's members as the matcher files ranks (int32 bytes): an op every member issued once is
    # found by one comparison (the common case) and shares them, its absent members by none
    members = list(map(_member_bytes, groups))
    match = _speedups.match_collectives if _speedups is not None else _match_collectives_in_python
    filed, spans, p2p_rows = match(
        inputs, members, op_names, untracked, STATES, STATES.index(COMPLETED), STATES.index(SCHEDULED)
    )
    del inputs  # the columns' bytes: the entries' own, or made for the matcher alone
    ranks = list(job.dumps)
    covered: dict[tuple[int, Group], list[int]] = {  # (rank, group) -> [first seq, last seq]
        (ranks[rank_index], groups[group]): [first, last] for rank_index, group, first, last in spans
    }
    sides: dict[PairKey, tuple[HeldRows, HeldRows]] = {}  # each pair's sends and recvs, by row
    for (rank, dump), rows in zip(job.dumps.items(), p2p_rows, strict=True):
        at = array("I", rows)
        for start in range(0, len(at), EntryRows.CHUNK):  # made a chunk at a time, never held all at once
            chunk = at[start : start + EntryRows.CHUNK]
            made = entries_at(dump.entries, chunk)
            if not dump.version.startswith("1."):  # 1.x: one seq for both kinds
                _widen_by_p2p(made, rank, named[rank], covered, dump.renumbered_groups)
            file_transfers(job, sides, rank, chunk, made)
    del p2p_rows

    ops: list[MatchedOp] = []
    # each op not settled where it is filed, with (alike, pending, its op name if known) for ``classify``
    to_classify: list[tuple[MatchedOp, bool, int, str | None]] = []
    entries_of = {rank: dump.entries for rank, dump in job.dumps.items()}
    # what the ops every member issued share, rather than hold a copy each (millions at thousands of ranks):
    # their ranks (a group's members), and the states of those every rank completed
    member_arrays = [None if given is None else array("i", given) for given in members]
    all_completed: dict[int, tuple[str, ...]] = {}  # number of ranks -> their states

    def completed(count: int) -> tuple[str, ...]:
        """The states of an op of ``count`` ranks that each completed: one tuple for every such op."""
        states = all_completed.get(count)
        return states if states is not None else all_completed.setdefault(count, (COMPLETED,) * count)

    edges: dict[int, int | None] = {}  # rank -> when its wrapped buffer's oldest entry was made (None: not wrapped)
    filed.reverse()
    while filed:  # each op's rows let go as they become its arrays: never held twice across the job
        group_index, seq, ranks_filed, rows, scanned = filed.pop()
        every_member = ranks_filed == members[group_index]  # where it is, the very object: no bytes compared
        shared = member_arrays[group_index] if every_member else None
        ranks_array = shared if shared is not None else array("i", ranks_filed)
        entries = EntriesByRank(entries_of, ranks_array, array("I", rows), distinct=every_member)
        known: str | None = None  # its op's name, where every rank issued the same op
        if scanned is not None:
            first_time, alike, pending, created_bytes, filed_states, name_index = scanned
            created: Sequence[int] = array("q", created_bytes)
            known = name_list[name_index] if alike else None
            states: Sequence[str] = completed(len(created)) if filed_states is None else filed_states
        else:
            first_time, alike, pending, created, states = _scan(entries)
            if states.count(COMPLETED) == len(states):
                states = completed(len(states))
        op = MatchedOp(
            group=groups[group_index], kind="collective", seq=seq, entries=entries, first_time_ns=first_time,
            created_ns=created, states=states,
        )  # fmt: skip
        if not every_member:
            _find_absent(op, job, covered, edges)
        ops.append(op)
        if every_member and known is not None and not pending:
            op.name = known  # every member issued it alike and completed it: OK, as ``classify`` would say
        else:
            to_classify.append((op, alike, pending, known))
    pair_ranks: dict[tuple[int, ...], array[int]] = {}  # what a pair's transfers share: their ranks
    pair_peers: dict[tuple[int, int], tuple[int, int]] = {}  # and their peers
    for pair in pair_ops(job, sides):
        if isinstance(pair, Settled):
            peers = pair_peers.setdefault(pair.peers, pair.peers)
            ops += _settled_ops(pair, entries_of, pair_ranks, peers, completed)
            continue
        held = _held_as_rows(pair, entries_of, pair_ranks)
        # named and classified from the entries pairing made, in the order the op holds its ranks: a send's or
        # recv's entries made from its rows again, for each look at them, cost more than the pairing
        in_hand = {rank: pair.entries[rank] for rank in held}
        first_time, alike, pending, _, states, name, in_batch = _scan_transfer(in_hand)
        if states.count(COMPLETED) == len(states):
            states = completed(len(states))
        peers = (pair.source, pair.destination)
        op = MatchedOp(
            group=pair.group, kind="p2p", seq=pair.index, missing=pair.missing, entries=in_hand,
            unknown=pair.unknown, peers=pair_peers.setdefault(peers, peers), first_time_ns=first_time,
            created_ns=(), states=states, name=name, in_batch=in_batch,
        )  # fmt: skip
        classify(op, alike, pending)
        op.entries = held
        ops.append(op)
    ops.sort(key=lambda o: (o.first_time_ns, o.group.order, o.seq))
    for number, op in enumerate(ops, start=1):
        op.op_key = number
    for op, alike, pending, known in to_classify:
        op.name = known if known is not None else _op_name(op.entries, alike)
        classify(op, alike, pending)
    return ops


def _settled_ops(
    settled: Settled,
    entries_of: Mapping[int, Sequence[Entry]],
    shared: dict[tuple[int, ...], array[int]],
    peers: tuple[int, int],
    completed: Callable[[int], tuple[str, ...]],
) -> list[MatchedOp]:
    """The ops of a pair's transfers settled from columns: OK, as ``classify`` would say, held as rows (as
    ``_held_as_rows`` holds them); ``completed``: the states of an op of so many ranks that each completed."""
    group, source, destination = settled.group, settled.source, settled.destination
    send_first = source < destination  # the order of the ranks, as a dict of them iterates
    key = (source, destination) if send_first else (destination, source)
    ranks = shared.get(key) or shared.setdefault(key, array("i", key))
    # one end held: its rank, and the other unknown
    alone = {rank: (shared.get((rank,)) or shared.setdefault((rank,), array("i", (rank,))), (other,))
             for rank, other in ((source, destination), (destination, source))}  # fmt: skip
    ops = []
    transfers = zip(
        settled.indices, settled.send_rows, settled.recv_rows, settled.first_times, settled.names, settled.in_batch,
        strict=True,
    )  # fmt: skip
    unknown: tuple[int, ...]
    for index, send, recv, first_time, name, in_batch in transfers:
        if send != NONE and recv != NONE:
            held, unknown = ranks, ()
            rows = array("I", (send, recv) if send_first else (recv, send))
        else:
            held, unknown = alone[source if send != NONE else destination]
            rows = array("I", (send if send != NONE else recv,))
        op = MatchedOp(
            group=group, kind="p2p", seq=index, entries=EntriesByRank(entries_of, held, rows), peers=peers,
            unknown=unknown, first_time_ns=first_time, created_ns=(), states=completed(len(rows)), name=name,
            in_batch=in_batch,
        )  # fmt: skip
        ops.append(op)
    return ops


def _op_name(entries: Mapping[int, list[Entry]], alike: bool) -> str:
    """The op most of ``entries``' ranks issued: where every rank issued the same ops, the first rank's."""
    return head_entry(entries[next(iter(entries))]).op if alike else majority_op(entries)


def _member_bytes(group: Group) -> bytes | None:
    """A group's members as the matcher files an op's ranks (ascending int32 bytes); None where a stranger's
    config lists them out of order, twice, or beyond what the matcher files."""
    members = group.members
    if not all(map(lt, members, members[1:])) or (members and not 0 <= members[0] <= members[-1] < 2**31):
        return None
    return array("i", members).tobytes()


def _held_as_rows(
    pair: PairOp, entries_of: Mapping[int, Sequence[Entry]], shared: dict[tuple[int, ...], array[int]]
) -> Mapping[int, list[Entry]]:
    """A send's or recv's entries held as rows, as a collective's are, so that the entries made to pair
    them go once paired; as they are (``pair.entries``) where one is filed under a rank other than its own
    (a dump whose peers say so). Its ranks are an array of ``shared`` (ranks -> their array), as its pair's
    others."""
    source, destination, send_at, recv_at = pair.source, pair.destination, pair.send_at, pair.recv_at
    # in the order of the ranks, as a dict of them iterates; a rank that sends to itself: its send first
    parts = (
        [(source, send_at), (destination, recv_at)]
        if source <= destination
        else [(destination, recv_at), (source, send_at)]
    )
    key: tuple[int, ...] = ()
    rows = array("I")
    for rank, at in parts:
        if at is not None:
            if at[0] != rank:
                return pair.entries
            key += (rank,)
            rows.append(at[1])
    return EntriesByRank(entries_of, shared.get(key) or shared.setdefault(key, array("i", key)), rows)


# What ``_match_collectives_in_python`` reads of a rank: (rank, its number of rows, and columns as bytes:
# group index (uint32), collective seq (int64), op, input sizes and input dtypes (uint32 ids into the job's
# tables), state (uint8, an index into ``STATES``), created (int64), is p2p (uint8), and in a coalesced group
# (uint8, or None where none is)).
RankInput = tuple[int, int, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes | None]
_INPUT_COLUMNS = ("group", "seq", "op", "sizes", "dtypes", "state", "created", "is_p2p")
# (group index, seq, its rows' ranks and its rows (int32 and uint32 bytes, rank by rank in order), the op's
# scan or None), as ``_scan`` gives it but for the creation times (int64 bytes) and the states (None: every one
# completed), and the index of its op's name
Filed = tuple[int, int, bytes, bytes, tuple[int, bool, int, bytes, list[str] | None, int] | None]


def _kept_columns(dump: RankDump) -> tuple[dict[str, bytes], Tables | None]:
    """The columns of ``dump`` the matcher reads (``KEPT_COLUMNS``), as bytes, and the tables their ids
    index: those its entries are made from; None for tables where its entries are not made from columns
    (they are held, and their columns must be made)."""
    entries = dump.entries
    if isinstance(entries, (EntryRows, LinkedRows)):
        kept = entries.kept_columns()
        if kept is not None:
            return kept, entries.base.tables if isinstance(entries, LinkedRows) else entries.tables
    return {}, None


def _take_collective_columns(
    job: Job, named: dict[int, dict[str, Group]]
) -> tuple[list[Group], list[RankInput], bytes, bytes, list[str]]:
    """What ``_match_collectives_in_python`` is given: the groups the job's collectives are filed under,
    each rank's input, and per op id of the tables the ids index, its name's index (one per op name) and
    whether its backend records no completion.

    The columns are those the reader made (those the entries are made from, ``EntryRows.kept_columns``),
    with ids into tables every rank shares; a rank without them (entries made otherwise, or changed since)
    has them made from its entries, and where the ranks' columns do not share their tables they are merged
    into one set.
    """
    read = {rank: _kept_columns(dump) for rank, dump in job.dumps.items()}
    uses = Counter(id(tables) for _, tables in read.values() if tables is not None)
    # the tables most ranks index go on; any other rank's ids are moved into them
    most = next((t for _, t in read.values() if t is not None and id(t) == uses.most_common(1)[0][0]), None)
    tables: JobTables | None = None
    groups: list[Group] = []
    index_of: dict[Group, int] = {}
    inputs: list[RankInput] = []
    for rank, dump in job.dumps.items():
        c, rank_tables = read.pop(rank)
        if rank_tables is None or rank_tables is not most:
            if tables is None:
                tables = JobTables.going_on_from(most) if most is not None else JobTables({})
                most = tables.values
            if rank_tables is None:
                made = from_entries(rank, dump.entries, KEPT_COLUMNS)
                c, rank_tables = column_bytes(made), made.tables
            c, rank_tables = tables.merged_bytes(c, rank_tables), tables.values
        known = named[rank]
        table = rank_tables["groups"]
        remap = array("I", [NO_GROUP]) * len(table)
        for group_id in first_uses(c["group"]):
            group = known.get(table[group_id][0])
            if group is not None:
                remap[group_id] = index_of.setdefault(group, len(index_of))
                if remap[group_id] == len(groups):
                    groups.append(group)
        flagged = None
        if not isinstance(dump.entries, EntryRows):  # held, or linked: some may be in a coalesced group
            held = dump.entries
            # where they are linked, read without making them
            in_group = held.closed() if isinstance(held, LinkedRows) else bytes(e.closed_by is not None for e in held)
            flagged = in_group if any(in_group) else None
        inputs.append((
            rank, len(dump.entries), gather(c["group"], remap.tobytes(), 4), c["collective_seq"], c["op"],
            c["input_sizes"], c["input_dtypes"], c["state"], c["created"], c["is_p2p"], flagged,
        ))  # fmt: skip
    ops_table = most["ops"] if most is not None else []
    names: dict[str, int] = {}
    op_names = array("I", [names.setdefault(op, len(names)) for _, op in ops_table])
    untracked = bytes(backend in NO_COMPLETION_BACKENDS for backend, _ in ops_table)
    return groups, inputs, op_names.tobytes(), untracked, list(names)


def _match_collectives_in_python(
    ranks: list[RankInput],
    members: list[bytes | None],
    op_names: bytes,
    untracked: bytes,
    states: tuple[str, ...],
    completed: int,
    scheduled: int,
) -> tuple[list[Filed], list[tuple[int, int, int, int]], list[bytes]]:
    """File every rank's collective entries by (group index, collective seq), from the ranks' columns
    (``RankInput``); ``_speedups.match_collectives`` does the same in C. Return:

    - the ops, in the order they are first met (rank by rank, row by row): (group index, seq, the rank
      of each of its rows and the rows (int32 and uint32 bytes), rank by rank in the order of ``ranks``, a
      rank's rows in order, and the op's scan as ``_scan`` makes it where every rank holds one
      entry, none in a coalesced group, else None; with the creation times as int64 bytes, the states None
      where every one is completed, and the index of the first rank's op name in ``op_names``). The ranks
      of an op whose rows are its group's members (``members``: each group's, as int32 bytes, or None)
      are that very object, not a copy. Entries' ops agree where their op names (the index
      ``op_names`` gives each op id) and their sizes' and dtypes' ids do: the ids of one set of tables are
      one per value. A state is pending unless completed, or scheduled on a backend that records no
      completion (``untracked``, per op id);
    - each rank's span of seqs on each group it issued collectives of: (rank index, group index,
      first, last), in the order met;
    - each rank's rows of p2p entries (uint32 bytes), in order.
    """
    names = array("I", op_names)
    group_count = len(members)
    ops: dict[tuple[int, int], dict[int, list[int]]] = {}  # (group, seq) -> rank index -> rows
    spans: list[tuple[int, int, int, int]] = []
    p2p_rows: list[bytes] = []
    read: list[dict[str, Any]] = []  # per rank: column name -> its values
    for index, (_, count, *raw, flagged) in enumerate(ranks):
        c: dict[str, Any] = {
            name: array(kind, data) for name, kind, data in zip(_INPUT_COLUMNS, "IqIIIBqB", raw, strict=True)
        }
        if any(len(column) != count for column in c.values()):
            raise ValueError("match_collectives: a column of the wrong length")
        c["flagged"] = flagged or bytes(count)
        read.append(c)
        p2p_rows.append(array("I", [row for row, p2p in enumerate(c["is_p2p"]) if p2p]).tobytes())
        span: dict[int, list[int]] = {}  # group -> [first seq, last seq]
        for row, (group, seq, p2p) in enumerate(zip(c["group"], c["seq"], c["is_p2p"], strict=True)):
            if p2p:
                continue
            if group >= group_count:
                raise ValueError("match_collectives: a collective of no group known")
            ops.setdefault((group, seq), {}).setdefault(index, []).append(row)
            first_last = span.setdefault(group, [seq, seq])
            first_last[:] = min(first_last[0], seq), max(first_last[1], seq)
        spans += [(index, group, first, last) for group, (first, last) in span.items()]
    filed: list[Filed] = []
    for (group, seq), rows_by_rank in ops.items():
        filed_ranks = array("i", [ranks[index][0] for index, rows in rows_by_rank.items() for _ in rows]).tobytes()
        given = members[group]
        ranks_filed = given if given is not None and filed_ranks == given else filed_ranks  # the very object
        rows_filed = array("I", [row for rows in rows_by_rank.values() for row in rows])
        scanned = None
        if all(len(rows) == 1 and not read[index]["flagged"][rows[0]] for index, rows in rows_by_rank.items()):
            parts = [(read[index], rows[0]) for index, rows in rows_by_rank.items()]
            (reference, at), *_ = parts
            alike = all(
                (names[c["op"][row]], c["sizes"][row], c["dtypes"][row])
                == (names[reference["op"][at]], reference["sizes"][at], reference["dtypes"][at])
                for c, row in parts
            )
            pending = sum(
                c["state"][row] != completed and not (untracked[c["op"][row]] and c["state"][row] == scheduled)
                for c, row in parts
            )
            created_ns = array("q", [c["created"][row] for c, row in parts])
            first = min(created_ns)
            filed_states = [states[c["state"][row]] for c, row in parts]
            scanned = (
                first, alike, pending, created_ns.tobytes(),
                None if filed_states.count(states[completed]) == len(filed_states) else filed_states,
                names[reference["op"][at]],
            )  # fmt: skip
        filed.append((group, seq, ranks_filed, rows_filed.tobytes(), scanned))
    return filed, spans, p2p_rows


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


def _scan(entries_by_rank: Mapping[int, list[Entry]]) -> tuple[int, bool, int, list[int], list[str]]:
    """One pass over an op's entries: when the first rank enqueued it, whether every rank issued the
    same ops with the same sizes and dtypes, how many ranks have not completed it, and, in the order of
    ``entries_by_rank``, when each rank enqueued it (its first entry) and the state of its part.

    At thousands of ranks, reaching each entry in memory costs more than what is done with it, so
    everything the matcher and the diagnosis need of the entries is taken in this one visit.
    """
    alike = True
    reference: Entry | tuple[object, ...] | None = None
    pending = 0
    created_ns = []
    states = []
    for entries in entries_by_rank.values():
        head = entries[0]
        created = head.time_created_ns
        created_ns.append(created)
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
    return min(created_ns, default=-1), alike, pending, created_ns, states


def _scan_transfer(
    entries_by_rank: Mapping[int, list[Entry]],
) -> tuple[int, bool, int, list[int], list[str], str, bool]:
    """``_scan`` of a send's and recv's entries, with the op most of its ranks issued (``_op_name``) and
    whether it is in a batch, or one a rank sent itself (its ends need not complete together)."""
    first_time, alike, pending, created, states = _scan(entries_by_rank)
    parts = list(entries_by_rank.values())
    if len(parts) == 2 and len(parts[0]) == len(parts[1]) == 1:  # a send and its recv (the common case)
        (one,), (other,) = parts
        name = max(one.op, other.op)  # the op most ranks issued: of two that differ, the alphabetically last
        return first_time, alike, pending, created, states, name, bool(one.closed_by or other.closed_by)
    in_batch = not all(len(entries) == 1 and entries[0].closed_by is None for entries in parts)
    return first_time, alike, pending, created, states, _op_name(entries_by_rank, alike), in_batch


def _find_absent(
    op: MatchedOp, job: Job, covered: dict[tuple[int, Group], list[int]], edges: dict[int, int | None]
) -> None:
    """Sort the members without an entry into ``missing`` (never issued) and ``unknown``. ``edges``: each
    rank's ``_edge``, as far as known (filled in here: the oldest ops of a wrapped job miss half their
    members, each asked once an op)."""
    members = op.group.members
    entries = op.entries
    if (
        entries.covers(members)
        if isinstance(entries, EntriesByRank)
        else len(entries) >= len(members) and all(map(entries.__contains__, members))
    ):
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
        edge = edges[rank] if rank in edges else edges.setdefault(rank, _edge(dump))
        if span is not None and op.seq > span[1]:
            missing.append(rank)  # it never got this far: the classic hang
        elif edge is not None and span is None and op.first_time_ns >= edge + CLOCK_MARGIN_NS:
            # none of the group's ops in its buffer, which covers when the others issued it (by more than
            # two hosts' clocks may differ)
            missing.append(rank)
        elif edge is not None and (span is None or op.seq < span[0]):
            unknown.append(rank)  # older than what its ring buffer still holds
        else:
            missing.append(rank)
    op.missing, op.unknown = tuple(missing), tuple(unknown)


def _edge(dump: RankDump) -> int | None:
    """When the oldest entry of a ring buffer that may have wrapped was made; None where it did not."""
    return dump.entries[0].time_created_ns if dump.may_have_wrapped else None


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
        one, other = map(head_entry, op.entries.values())
        sizes_differ = (one.input_sizes or one.output_sizes) != (other.input_sizes or other.output_sizes)
        if sizes_differ or (one.input_dtypes or one.output_dtypes) != (other.input_dtypes or other.output_dtypes):
            op.status, op.mismatch = MISMATCH, "size" if sizes_differ else "dtype"
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
