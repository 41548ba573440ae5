"""Tie the ops of each coalesced group to the entry that closes it, before anything is matched.

PyTorch records a coalesced group (``startCoalescing`` ... ``endCoalescing``: coalesced collectives,
``batch_isend_irecv``, an uneven all_gather) as one entry per op, recorded without events and so
``scheduled`` for ever, then a closing entry (``nccl:coalesced``, ``nccl:ALLGATHER_coalesced``) with
empty sizes that carries the group's state and times. What the closing entry says of itself comes from
``ProcessGroupNCCL.cpp``, not from its name:

- ``endCoalescing`` makes its work with ``initWork``, which records ``isP2POp(opType)``: false for
  ``OpType::COALESCED``. So the closing entry of a *p2p* batch says ``is_p2p: False``, and it carries
  the group's current ``seqCollective_``, which a batch does not bump in PyTorch 2.13 (``pointToPoint``
  bumps ``seqP2P_`` once per batch, ``startCoalescing`` nothing). Filed as a collective, it would land on
  the seq of the group's previous collective; it is marked p2p here.
- Older PyTorch bumped ``seqCollective_`` in ``startCoalescing`` for every batch, p2p ones too (its
  ``coalescing_state_`` is still 0 there, so the ``CoalP2P`` test never took the p2p branch), so
  after its batches a rank's collectives carry seqs that peers in fewer batches never use. Where a
  rank's batches show it (a closing entry above the group's last collective seq), its collective seqs
  on that group are renumbered to count collectives only.
- The ring buffer drops a group's first ops and keeps the rest when it wraps in the middle of one:
  coalesced collectives that hold the buffer's first entry may be cut, and are matched with nothing
  (a cut batch's sends and recvs still meet theirs, each on its own).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from operator import attrgetter

from ..base.model import Entry, LoadProblem, RankDump, closes_coalesced_group, distinct_values, ranks_label
from ..read.columns import EntryRows, LinkedRows
from ..read.job import Job

_op_of = attrgetter("op")
# The fields of an entry that linking changes (``_link_rank``, ``set_aside``, ``_renumber_collectives``)
LINKED_FIELDS = ("closed_by", "is_p2p", "p2p_local", "collective_seq")


def set_aside(entry: Entry) -> Entry:
    """An entry the matcher files nowhere: p2p (never a collective) without peers (never a pair)."""
    return entry._replace(is_p2p=True, p2p_local=None)


def link_coalesced(job: Job) -> None:
    """Point every op inside a coalesced group at its closing entry (``Entry.closed_by``), mark the
    closing entries of p2p batches p2p, set aside groups the ring buffer cut, and renumber the
    collectives of ranks whose batches consumed collective seqs (each noted in ``job.problems``)."""
    ends: dict[str, bool] = {}  # op name -> whether it closes a coalesced group
    for dump in job.dumps.values():
        ops = _op_names(dump)
        for op in ops - ends.keys():
            ends[op] = closes_coalesced_group(op)
        if not any(ends[op] for op in ops):
            continue  # most ranks never coalesce: nothing to link
        read = dump.entries
        made = list(read)
        dump.entries = made
        burnt = _link_rank(dump, ends)
        if burnt:
            _renumber_collectives(job, dump, burnt)
        if isinstance(read, (EntryRows, LinkedRows)):  # made from columns: so they stay, but for the links
            base = read.base if isinstance(read, LinkedRows) else read
            dump.entries = LinkedRows(
                base, made if type(read) is EntryRows else list(base), dump.entries, LINKED_FIELDS
            )
    renumbered: dict[str, list[int]] = {}  # group -> ranks whose collective seqs on it were renumbered
    for dump in job.dumps.values():
        for group in dump.renumbered_groups:
            renumbered.setdefault(group, []).append(dump.rank)
    for group, ranks in renumbered.items():
        job.problems.append(
            LoadProblem(
                f"ranks {ranks_label(ranks)}",
                f"p2p batches on group {group} consumed collective seqs (older PyTorch bumped seqCollective_ in "
                "startCoalescing for every batch); their collective seqs on it are renumbered to count collectives",
                fatal=False,
            )
        )


def _op_names(dump: RankDump) -> set[str]:
    """The names of the ops ``dump`` holds: from its op column where its entries are made from columns
    (without making each entry), else from its entries."""
    return distinct_values(dump.entries, "op")


def _link_rank(dump: RankDump, ends: dict[str, bool]) -> dict[str, list[int]]:
    """Link one rank's coalesced groups; return, per group, the collective seqs its batches consumed.
    Its entries are held from here on (a list): some are replaced."""
    entries = list(dump.entries)
    dump.entries = entries
    open_runs: dict[tuple[str, bool, int], list[int]] = {}  # (group, p2p, seq) -> positions of its ops
    last_in_group: dict[str, int] = {}  # group -> position of its latest entry
    last_collective: dict[str, int] = {}  # group -> seq of its latest collective
    # group -> its batches' closing entries, each with whether a collective of the group came before it
    batches: dict[str, list[tuple[Entry, bool]]] = defaultdict(list)
    cut = dump.may_have_wrapped
    for position, entry in enumerate(entries):
        group = entry.group_name
        previous = last_in_group.get(group)
        last_in_group[group] = position
        if not ends[entry.op]:
            seq = entry.p2p_seq if entry.is_p2p else entry.collective_seq
            key = (group, entry.is_p2p, seq)
            run = open_runs.get(key)
            if run is not None and run[-1] == previous:
                run.append(position)
            else:
                open_runs[key] = [position]
            if not entry.is_p2p:
                last_collective[group] = entry.collective_seq
            continue
        # A closing entry ends the run of its group just before it: a batch's (by p2p seq) or a
        # coalesced collective group's (by collective seq).
        closing = entry
        run = _pop_run(open_runs, (group, True, entry.p2p_seq), previous)
        if run is not None:
            closing = entry if entry.is_p2p else entry._replace(is_p2p=True)
            batches[group].append((entry, group in last_collective))
        else:
            run = _pop_run(open_runs, (group, entry.is_p2p, entry.collective_seq), previous) or []
        if cut and not closing.is_p2p and (run[0] if run else position) == 0:
            # the buffer's first entry: the coalesced collectives may have lost their first ops (a batch's
            # sends and recvs are matched one by one, whatever was lost before them)
            for inner in run:
                entries[inner] = set_aside(entries[inner])
            entries[position] = set_aside(entry)
            continue
        entries[position] = closing
        for inner in run:
            entries[inner] = entries[inner]._replace(closed_by=closing)
        if not closing.is_p2p:
            last_collective[group] = closing.collective_seq
    return _consumed_seqs(batches, entries, ends)


def _pop_run(
    open_runs: dict[tuple[str, bool, int], list[int]], key: tuple[str, bool, int], previous: int | None
) -> list[int] | None:
    """The open run under ``key`` if it ends right before the closing entry (``previous``)."""
    run = open_runs.get(key)
    if run is None or run[-1] != previous:
        return None
    del open_runs[key]
    return run


def _consumed_seqs(
    batches: dict[str, list[tuple[Entry, bool]]], entries: list[Entry], ends: dict[str, bool]
) -> dict[str, list[int]]:
    """Per group, the collective seqs this rank's batches consumed (older PyTorch); nothing for a group
    whose batches carry its current seq (PyTorch 2.13), or where nothing tells.

    A batch consumed a seq when its closing entry carries one that no collective before it used, or
    when two batches with no collective between them carry different ones."""
    consumed: dict[str, list[int]] = {}
    for group, closings in batches.items():
        used = {e.collective_seq for e in entries if e.group_name == group and not e.is_p2p and not ends[e.op]}
        fresh = [closing.collective_seq not in used for closing, _ in closings]
        shown = any(is_fresh and prior for is_fresh, (_, prior) in zip(fresh, closings, strict=True))
        if not shown:
            previous: int | None = None
            for position in range(len(entries)):
                entry = entries[position]
                if entry.group_name != group:
                    continue
                if not entry.is_p2p and not ends[entry.op]:
                    previous = None  # a collective between two batches
                elif ends[entry.op] and entry.is_p2p and entry.p2p_local is None:
                    if previous is not None and previous != entry.collective_seq:
                        shown = True
                        break
                    previous = entry.collective_seq
        if shown:
            consumed[group] = sorted(c.collective_seq for (c, _), is_fresh in zip(closings, fresh, strict=True)
                                     if is_fresh)  # fmt: skip
    return consumed


def _renumber_collectives(job: Job, dump: RankDump, consumed: dict[str, list[int]]) -> None:
    """Number this rank's collectives on each group as if its batches had consumed no seq (each group
    noted in ``dump.renumbered_groups``).

    Where every p2p op of the group is in a batch, each batch bumped seqP2P_ once as it bumped
    seqCollective_, so an entry's collective seq minus its p2p seq counts its collectives, however
    much history the ring buffer dropped. Otherwise the batches in the buffer are counted, and those
    before it estimated from members that hold their whole history."""
    for group, seqs in consumed.items():
        singles = any(
            e.group_name == group and e.is_p2p and e.p2p_local is not None and e.closed_by is None for e in dump.entries
        )
        renumbered: Callable[[Entry], int]  # one of two definitions, by how the group's seqs were consumed
        if singles:
            base = _consumed_before_buffer(job, dump, group, seqs) if dump.may_have_wrapped else 0

            def renumbered(entry: Entry, base: int = base, seqs: list[int] = seqs) -> int:
                return entry.collective_seq - base - sum(1 for burnt in seqs if burnt < entry.collective_seq)
        else:

            def renumbered(entry: Entry) -> int:
                return entry.collective_seq - entry.p2p_seq

        closings: dict[int, Entry] = {}  # id of a renumbered closing entry -> its new self
        entries = []
        for entry in dump.entries:
            if entry.group_name == group and not entry.is_p2p:
                new = entry._replace(collective_seq=renumbered(entry))
                if entry.closed_by is None and closes_coalesced_group(entry.op):
                    closings[id(entry)] = new
                entry = new
            entries.append(entry)
        # the ops of a coalesced group point at its closing entry, renumbered after them
        dump.entries = [
            e._replace(closed_by=closings[id(e.closed_by)]) if e.closed_by is not None and id(e.closed_by) in closings
            else e
            for e in entries
        ]  # fmt: skip
        dump.renumbered_groups.append(group)


def _consumed_before_buffer(job: Job, dump: RankDump, group: str, seqs: list[int]) -> int:
    """How many seqs batches consumed before the buffer's first entry: the median difference between
    this rank's renumbered seqs and those of the nearest (by enqueue time) collectives of members whose
    dumps hold their whole history."""
    mine = [
        (e.time_created_ns, e.collective_seq - sum(1 for burnt in seqs if burnt < e.collective_seq))
        for e in dump.entries
        if e.group_name == group and not e.is_p2p and not closes_coalesced_group(e.op)
    ]
    differences = []
    for other in job.dumps.values():
        if other is dump or other.may_have_wrapped:
            continue
        theirs = sorted(
            (e.time_created_ns, e.collective_seq)
            for e in other.entries
            if e.group_name == group and not e.is_p2p and not closes_coalesced_group(e.op)
        )
        if not theirs:
            continue
        for created, seq in mine:
            nearest = min(theirs, key=lambda item: abs(item[0] - created))
            differences.append(seq - nearest[1])
    return max(0, round(statistics.median(differences))) if differences else 0
