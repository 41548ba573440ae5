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
from array import array
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..base.model import Entry, LoadProblem, RankDump, closes_coalesced_group, distinct_values, ranks_label
from ..read.columns import EntryRows, LinkedRows
from ..read.job import Job

# The fields of an entry that linking changes (``_link_rank``, ``_renumber_collectives``)
LINKED_FIELDS = ("closed_by", "is_p2p", "p2p_local", "collective_seq")


@dataclass(slots=True)
class _Fields:
    """What linking reads of a rank's entries, one list per field, in row order: read from its columns where
    its entries are made from them (a pipeline that batches links every rank's thousands, too many to make)."""

    group: list[str]
    ends: list[bool]  # closes a coalesced group
    is_p2p: list[bool]
    has_peers: list[bool]  # a send's or recv's (``p2p_local``)
    p2p_seq: list[int]
    collective_seq: list[int]


@dataclass(slots=True)
class _Links:
    """What linking changes of a rank's entries: each row's closing entry (its row; -1: none), ``is_p2p``
    (a batch's closing entry made p2p), the rows set aside (p2p without peers: filed nowhere) and, per
    group, the collective seqs its batches consumed."""

    closing: list[int]
    is_p2p: list[bool]
    aside: set[int]
    consumed: dict[str, list[int]]


def link_coalesced(job: Job) -> None:
    """Point every op inside a coalesced group at its closing entry (``Entry.closed_by``), mark the
    closing entries of p2p batches p2p, set aside groups the ring buffer cut (p2p, without peers: filed
    nowhere), and renumber the collectives of ranks whose batches consumed collective seqs (each noted in
    ``job.problems``)."""
    ends: dict[str, bool] = {}  # op name -> whether it closes a coalesced group
    for dump in job.dumps.values():
        ops = _op_names(dump)
        for op in ops - ends.keys():
            ends[op] = closes_coalesced_group(op)
        if not any(ends[op] for op in ops):
            continue  # most ranks never coalesce: nothing to link
        read = dump.entries
        fields = _fields(read, ends)
        links = _link_rank(fields, dump.may_have_wrapped)
        if type(read) is EntryRows and not links.consumed:  # from its columns: no entry made
            dump.entries = LinkedRows(read, *_changed(read, fields, links))
            continue
        made = list(read)
        dump.entries = _linked(made, links)
        if links.consumed:
            _renumber_collectives(job, dump, links.consumed)
        if isinstance(read, (EntryRows, LinkedRows)):  # made from columns: so they stay, but for the links
            base = read.base if isinstance(read, LinkedRows) else read
            dump.entries = LinkedRows.from_entries(
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


def _fields(entries: Sequence[Entry], ends: dict[str, bool]) -> _Fields:
    """``_Fields`` of a rank's entries, read from its columns where they are made from them."""
    rows = range(len(entries))
    if isinstance(entries, (EntryRows, LinkedRows)):
        values = entries.values
    else:

        def values(field: str, rows: Sequence[int]) -> list[Any]:
            return [getattr(entries[row], field) for row in rows]

    return _Fields(
        values("group_name", rows), [ends[op] for op in values("op", rows)], values("is_p2p", rows),
        [peers is not None for peers in values("p2p_local", rows)], values("p2p_seq", rows),
        values("collective_seq", rows),
    )  # fmt: skip


def _link_rank(fields: _Fields, cut: bool) -> _Links:
    """Link one rank's coalesced groups (``cut``: its ring buffer may have dropped its first ops)."""
    count = len(fields.group)
    links = _Links([-1] * count, list(fields.is_p2p), set(), {})
    is_p2p = links.is_p2p  # as linked so far: only rows up to the one at hand change
    open_runs: dict[tuple[str, bool, int], list[int]] = {}  # (group, p2p, seq) -> rows of its ops
    last_in_group: dict[str, int] = {}  # group -> row of its latest entry
    last_collective: dict[str, int] = {}  # group -> seq of its latest collective
    # group -> its batches' closing rows, each with whether a collective of the group came before it
    batches: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for row in range(count):
        group = fields.group[row]
        previous = last_in_group.get(group)
        last_in_group[group] = row
        if not fields.ends[row]:
            p2p = is_p2p[row]
            key = (group, p2p, fields.p2p_seq[row] if p2p else fields.collective_seq[row])
            run = open_runs.get(key)
            if run is not None and run[-1] == previous:
                run.append(row)
            else:
                open_runs[key] = [row]
            if not p2p:
                last_collective[group] = fields.collective_seq[row]
            continue
        # A closing entry ends the run of its group just before it: a batch's (by p2p seq) or a
        # coalesced collective group's (by collective seq).
        run = _pop_run(open_runs, (group, True, fields.p2p_seq[row]), previous)
        if run is not None:
            batches[group].append((row, group in last_collective))
            is_p2p[row] = True
        else:
            run = _pop_run(open_runs, (group, is_p2p[row], fields.collective_seq[row]), previous) or []
        if cut and not is_p2p[row] and (run[0] if run else row) == 0:
            # the buffer's first entry: the coalesced collectives may have lost their first ops (a batch's
            # sends and recvs are matched one by one, whatever was lost before them)
            for inner in (*run, row):
                is_p2p[inner] = True
                links.aside.add(inner)
            continue
        for inner in run:
            links.closing[inner] = row
        if not is_p2p[row]:
            last_collective[group] = fields.collective_seq[row]
    links.consumed = _consumed_seqs(batches, fields, links)
    return links


def _pop_run(
    open_runs: dict[tuple[str, bool, int], list[int]], key: tuple[str, bool, int], previous: int | None
) -> list[int] | None:
    """The open run under ``key`` if it ends right before the closing entry (``previous``)."""
    run = open_runs.get(key)
    if run is None or run[-1] != previous:
        return None
    del open_runs[key]
    return run


def _consumed_seqs(batches: dict[str, list[tuple[int, bool]]], fields: _Fields, links: _Links) -> dict[str, list[int]]:
    """Per group, the collective seqs this rank's batches consumed (older PyTorch); nothing for a group
    whose batches carry its current seq (PyTorch 2.13), or where nothing tells.

    A batch consumed a seq when its closing entry carries one that no collective before it used, or
    when two batches with no collective between them carry different ones."""
    consumed: dict[str, list[int]] = {}
    seqs, is_p2p = fields.collective_seq, links.is_p2p
    for group, closings in batches.items():
        mine = [row for row in range(len(seqs)) if fields.group[row] == group]
        used = {seqs[row] for row in mine if not is_p2p[row] and not fields.ends[row]}
        fresh = [seqs[closing] not in used for closing, _ in closings]
        shown = any(is_fresh and prior for is_fresh, (_, prior) in zip(fresh, closings, strict=True))
        if not shown:
            previous: int | None = None
            for row in mine:
                if not is_p2p[row] and not fields.ends[row]:
                    previous = None  # a collective between two batches
                elif fields.ends[row] and is_p2p[row] and not (fields.has_peers[row] and row not in links.aside):
                    if previous is not None and previous != seqs[row]:
                        shown = True
                        break
                    previous = seqs[row]
        if shown:
            consumed[group] = sorted(seqs[c] for (c, _), is_fresh in zip(closings, fresh, strict=True) if is_fresh)
    return consumed


def _linked(made: list[Entry], links: _Links) -> list[Entry]:
    """A rank's entries (``made``) as linking changes them (``links``)."""
    linked = list(made)
    for row, entry in enumerate(made):
        if row in links.aside:
            linked[row] = entry._replace(is_p2p=True, p2p_local=None)
        elif links.is_p2p[row] != entry.is_p2p:
            linked[row] = entry._replace(is_p2p=links.is_p2p[row])
    for row, closing in enumerate(links.closing):
        if closing >= 0:
            linked[row] = linked[row]._replace(closed_by=linked[closing])
    return linked


def _changed(read: EntryRows, fields: _Fields, links: _Links) -> tuple[array[int] | None, dict[str, list[Any]]]:
    """What ``LinkedRows`` holds of a rank's links: the row of each row's closing entry (None where none
    has one) and the values of each other field that linking changed."""
    changed: dict[str, list[Any]] = {}
    if links.is_p2p != fields.is_p2p:
        changed["is_p2p"] = links.is_p2p
    if any(fields.has_peers[row] for row in links.aside):
        peers = read.values("p2p_local", range(len(read)))
        changed["p2p_local"] = [None if row in links.aside else value for row, value in enumerate(peers)]
    closing = array("i", links.closing) if any(row >= 0 for row in links.closing) else None
    return closing, changed


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
