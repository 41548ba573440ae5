"""Who broke the symmetry of a wait across groups: the rank that issued two ops in the unusual order.

In a deadlock across groups (A waits in X's op #N for B, B waits in Y's op #M for A) each rank never
issued the op the other one waits in. Ranks that run one program issue every pair of ops in one
order; the rank that issued them the other way round is where to look first. Ops are compared as
every rank would issue them: a collective by its group's description and seq (every rank's own tp
group is "tp"; sibling groups described ``undefined``, such as the pairs of ``new_subgroups``, by
their family: ``siblings``), a send or recv also by its ends' places in the group and the rank's p2p
seq; so the whole job, not only the ranks of the cycle, shows which order is the usual one. Where the
rank's group has siblings, the line says what their members did.
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from typing import cast

from ..base.model import Entry, Group, MatchedOp, head_entry
from ..base.words import group_called
from .evidence import Evidence
from .siblings import Family, Siblings, all_members, siblings_text

SKEW_MARGIN_NS = 50_000_000  # how much later counts as "went on", once clocks are aligned
UNALIGNED_MARGIN_NS = 100_000_000  # ... when they are not


MAX_OPS_COMPARED = 6  # the cycle's earliest distinct blocking ops whose order is compared


def order_cycle(
    evidence: Evidence, cycle: list[int], siblings: Siblings | None = None, *, only_siblings: bool = False
) -> tuple[list[int], list[str]]:
    """The ranks of ``cycle``, those whose order of ops differs from their peers' first, and what
    shows it (one line per such rank; none when no rank stands out).

    With ``only_siblings``, a rank stands out only where its group's siblings show the usual order
    (``_sibling_line``), and nothing else is tried: for ranks whose waits say little (held by ops
    queued behind others), only the program as the siblings ran it tells."""
    siblings = siblings or Siblings(evidence)
    blocking: dict[OpKey, MatchedOp] = {}
    for rank in sorted(cycle, key=lambda r: evidence.waits[r].op.first_time_ns):
        op = evidence.waits[rank].op
        entries = op.entries.get(rank)
        if entries and len(blocking) < MAX_OPS_COMPARED:
            key = _entry_key(evidence, siblings, rank, entries[0])
            if key is not None:  # a group not known gives no key to compare by (``_has`` would fail on None)
                blocking.setdefault(key, op)
    issued = _issued(evidence, siblings, set(blocking))
    breakers: dict[int, str] = {}
    for (a_key, a), (b_key, b) in combinations(blocking.items(), 2):
        orders = _orders(evidence, siblings, issued, a_key, b_key)
        others = [order for rank, order in orders.items() if rank not in cycle]
        usual = _majority(others) or _majority(list(orders.values()))
        if usual is None:
            continue
        for rank in cycle:
            order = orders.get(rank)
            if order is None or order == usual or rank in breakers:
                continue
            first, then = (a, b) if order == "ab" else (b, a)
            line = _sibling_line(siblings, rank, orders, usual, first, then)
            if line is None and only_siblings:
                continue
            agreeing = sum(1 for o in others if o == usual)
            breakers[rank] = line or (
                f"rank {rank} issued {_name(first)} before {_name(then)}; its peers did the reverse "
                f"({agreeing} of {len(others)} other ranks that issued either)"
                if others
                else f"rank {rank} issued {_name(first)} before {_name(then)}, unlike the other ranks of the cycle"
            )
    for fallback in (_odd_one_out, _went_past):  # in turn, while no rank is named
        found = None if breakers or only_siblings else fallback(evidence, cycle)
        if found is not None:
            rank, line = found
            breakers[rank] = line
    ordered = [r for r in cycle if r in breakers] + [r for r in cycle if r not in breakers]
    return ordered, [breakers[r] for r in ordered if r in breakers]


def _sibling_line(
    siblings: Siblings, rank: int, orders: dict[int, str], usual: str, first: MatchedOp, then: MatchedOp
) -> str | None:
    """What the siblings of ``rank``'s group show, where ``rank`` issued ``first`` before ``then``
    unlike the usual order: one of the two ops is of a group with siblings, the other of a group that
    holds every sibling's members (the world, say), and in other siblings the members that issue that
    op (all of a collective's; a send's or recv's in ``rank``'s place) all issued the two the other way
    round, and none in this order. None where the siblings do not show it."""
    for own_op, shared_op in ((first, then), (then, first)):
        found = _family_around(siblings, rank, own_op, shared_op)
        if found is None:
            continue
        family, own = found
        collective = own_op.kind == "collective"
        others = [group for group in family.groups if group is not own]
        contrary = [g for g in others if any(orders.get(r) not in (None, usual) for r in g.members)]
        # a send or recv is issued by the member in one place; what orders has says who that is
        agreeing = [
            g for g in others
            if (asked := g.members if collective else [r for r in g.members if r in orders])
            and all(orders.get(r) == usual for r in asked)
        ]  # fmt: skip
        if contrary or not agreeing:
            continue
        who = all_members(family.size) if collective else f"the member in rank {rank}'s place"
        # the usual order is the reverse of the rank's: ``then`` before ``first``
        return (
            f"in {siblings_text(family, agreeing)} {who} issued {_called(then, own_op, family, rank, 'their')} "
            f"before {_called(first, own_op, family, rank, 'their')}; "
            f"rank {rank} issued {_called(first, own_op, family, rank, 'its')} first"
        )
    return None


def _called(op: MatchedOp, own_op: MatchedOp, family: Family, rank: int, whose: str) -> str:
    """An op as a sibling line names it: ``own_op`` as ``their pair's all_reduce #3`` (each sibling
    issues it in a group of its own: a send or recv without its ends, which differ), or ``its pp
    group's send 2->5 #4`` for ``rank``'s own; any other as ``default_pg's all_reduce #4``."""
    if op is not own_op:
        return _name(op)
    entries = op.entries.get(rank)
    op_name = head_entry(entries).op if entries else op.name
    if op.kind == "collective" or whose != "its":
        return f"{whose} {family.noun(1)}'s {op_name} #{op.seq}"
    return f"{whose} {family.noun(1)}'s {op.title_as(op_name)}"


def _family_around(
    siblings: Siblings, rank: int, own_op: MatchedOp, shared_op: MatchedOp
) -> tuple[Family, Group] | None:
    """The family of ``own_op``'s group and ``rank``'s group in it, where ``shared_op``'s group holds
    every member of the family; None otherwise."""
    family = siblings.family(own_op.group)
    if family is None or not family.members() <= set(shared_op.group.members):
        return None
    own = family.group_of(rank)
    return (family, own) if own is not None else None


def _odd_one_out(evidence: Evidence, cycle: list[int]) -> tuple[int, str] | None:
    """The rank of the cycle that never issued an op most of that op's members issued, where every other
    rank of the cycle lacks one that only half or fewer of its members issued."""
    share: dict[int, tuple[float, MatchedOp]] = {}
    for rank in cycle:
        lacking = [evidence.waits[r].op for r in cycle if rank in evidence.waits[r].on and rank in
                   evidence.waits[r].op.missing]  # fmt: skip
        if not lacking:
            return None
        op = lacking[0]
        members = len(op.entries) + len(op.missing)
        share[rank] = (len(op.entries) / members, op)
    best = max(share, key=lambda r: share[r][0])
    fraction, op = share[best]
    if fraction * 3 < 2 or any(share[r][0] >= fraction for r in cycle if r != best):
        return None
    return best, (
        f"rank {best} is the only one of its peers that never issued {_name(op)} "
        f"({len(op.entries)} of {len(op.entries) + len(op.missing)} members did)"
    )


def _went_past(evidence: Evidence, cycle: list[int]) -> tuple[int, str] | None:
    """The rank of the cycle that blocked clearly later than all the others: it went past the op they
    wait in for it (which it never issued), the way a rank that skipped an op goes on. Times on the
    common clock, by more than the clocks may be off."""
    clocks = evidence.clocks
    margin = max(SKEW_MARGIN_NS, 3 * clocks.uncertainty_ns) if clocks.offsets else UNALIGNED_MARGIN_NS
    blocked_at = {}
    for rank in cycle:
        op = evidence.waits[rank].op
        created = dict(zip(op.entries, op.enqueued_ns(), strict=True)).get(rank)
        if created is None:
            return None
        blocked_at[rank] = clocks.aligned(rank, created)
    latest = max(blocked_at, key=blocked_at.__getitem__)
    others = [t for r, t in blocked_at.items() if r != latest]
    gap = blocked_at[latest] - max(others)
    if gap < margin:
        return None
    waited_in = [evidence.waits[r].op for r in cycle if latest in evidence.waits[r].op.missing]
    if not waited_in:
        return None  # nobody waits for it to issue an op: it may well be the one that stopped
    return latest, (
        f"rank {latest} never issued {_name(waited_in[0])} but went on: it issued {_name(evidence.waits[latest].op)} "
        f"{gap / 1e6:.0f} ms after the others of the cycle had blocked (as a rank that skipped an op does)"
    )


MAX_LATER_OPS = 16  # a rank's newest distinct ops tested for having come after an op it never issued


def skipped_past(evidence: Evidence, rank: int, op: MatchedOp, siblings: Siblings | None = None) -> str | None:
    """Whether ``rank``, which never issued ``op``, issued an op that the members who did issue ``op``
    issued after it: the mark of a rank that skipped an op and went on (a rank that stopped, or is
    merely behind, issued only ops that come before it). What shows it, or None.

    Only the op's own members that issued both are asked (they run the same part of the program, and
    an op they never issued, they may have stopped before: that says nothing of its order), and only
    where their later op is in another group than the rank's (same description, same place). With two
    members, one that issued an extra op looks the same as one that skipped it; skipping is the usual
    mistake (a branch on a rank's data or index), so the rank that lacks the op is named.

    Where ``op``'s group has siblings, their members run that part of the program too, and are asked
    of a later op in a group that holds them all (``_siblings_saw``)."""
    siblings = siblings or Siblings(evidence)
    present = [r for r in op.entries if r in evidence.job.dumps]
    if op.kind != "collective" or not present:
        return None  # the other end of a send or recv runs another part of the program: no witness
    key = _entry_key(evidence, siblings, present[0], op.entries[present[0]][0])
    dump = evidence.job.dumps.get(rank)
    if key is None or dump is None:
        return None
    later: dict[OpKey, Entry] = {}
    for entry in reversed(dump.entries):
        if len(later) >= MAX_LATER_OPS:
            break
        if entry.group_name == op.group.name:
            break  # its own ops of the group come before the one it never issued
        other = _entry_key(evidence, siblings, rank, entry)
        if other is not None and other != key and not entry.is_coalesced_end:
            later.setdefault(other, entry)
    if not later:
        return None
    family = siblings.family(op.group)
    kin = [r for g in family.groups if g is not op.group for r in g.members] if family is not None else []
    issued = _issued(evidence, siblings, {key, *later}, present + [r for r in kin if r in evidence.job.dumps])
    for other in sorted(later, key=lambda k: later[k].time_created_ns):
        # A witness in the group of the rank's later op is matched with it there by seq: if either of
        # them skipped an op of that group, their ops of that seq are not the same op of the program.
        shared = evidence.job.group_of[(rank, later[other].group_name)].members
        both = [r for r in present if key in issued.get(r, {}) and other in issued[r] and r not in shared]
        before = [r for r in both if issued[r][key] <= issued[r][other]]
        after = [r for r in both if issued[r][key] > issued[r][other]]
        later_name = _entry_name(evidence, rank, later[other])
        if before and not after:
            return (
                f"rank {rank} never issued {_name(op)} but went on to issue {later_name}, which "
                f"{'rank' if len(before) == 1 else 'ranks'} {', '.join(map(str, before))} issued after it "
                "(as a rank that skipped an op does)"
            )
        if family is not None and family.members() <= set(shared):
            agreeing = _siblings_saw(family, op.group, issued, key, other)
            if agreeing:
                return (
                    f"rank {rank} never issued {_name(op)} but went on to issue {later_name}; in "
                    f"{siblings_text(family, agreeing)} {all_members(family.size)} issued their "
                    f"{family.noun(1)}'s {op.title} before it (as a rank that skipped an op does)"
                )
    return None


def _siblings_saw(
    family: Family, own: Group, issued: dict[int, dict[OpKey, int]], key: OpKey, later: OpKey
) -> list[Group]:
    """The siblings of ``own`` all of whose members issued ``key`` before ``later``, where no member of
    another sibling issued them the other way round; none otherwise.

    Both ops are asked of every member: a member that stopped in between says nothing, and one sibling
    whose members all issued the two in one order is more than a single rank that skipped an op of
    ``later``'s group (and so issued its ops under other seqs) can make up."""
    agreeing = []
    for group in family.groups:
        if group is own:
            continue
        seen = [issued.get(r, {}) for r in group.members]
        if any(key in s and later in s and s[key] > s[later] for s in seen):
            return []
        if all(key in s and later in s for s in seen):
            agreeing.append(group)
    return agreeing


# An op as every rank running the same program would issue it: a collective by its group's description
# (every rank's own tp group is "tp"; sibling groups described ``undefined`` by their family) and seq;
# a send or recv also by its ends' places in the group (every middle stage receives from the one
# before it) and the rank's p2p seq.
OpKey = tuple[object, ...]


def _entry_key(evidence: Evidence, siblings: Siblings, rank: int, entry: Entry) -> OpKey | None:
    """The op key of one of ``rank``'s entries; None where its group is not known."""
    group = evidence.job.group_of.get((rank, entry.group_name))
    if group is None:
        return None
    if entry.is_p2p:
        # p2p_seq counts a rank's sends, recvs and batches in the group, whatever the peer (``seqP2P_``
        # in ProcessGroupNCCL.cpp): ranks in one place of one program count alike, wrapped buffer or not.
        return (*siblings.label(group), entry.op, entry.p2p_local, entry.p2p_seq)
    return (*siblings.label(group), entry.collective_seq)


def _name(op: MatchedOp) -> str:
    return f"{group_called(op.group)}'s {op.title}"


def _entry_name(evidence: Evidence, rank: int, entry: Entry) -> str:
    """An entry as ``_name`` names its op: ``pp's send 3->1 #8`` (#: the pair's order), ``dp's all_reduce #7``."""
    group = evidence.job.group_of[(rank, entry.group_name)]
    for op in evidence.ops:
        if op.group is group and any(e == entry for e in op.entries.get(rank, ())):  # made anew: not `is`
            return f"{group_called(group)}'s {op.title_as(entry.op)}"
    return f"{group_called(group)}'s {entry.op} #{entry.p2p_seq if entry.is_p2p else entry.collective_seq}"


def _issued(
    evidence: Evidence, siblings: Siblings, wanted: set[OpKey], ranks: list[int] | None = None
) -> dict[int, dict[OpKey, int]]:
    """Per rank with a dump (of ``ranks``, or all), when it first issued each ``wanted`` op's like on
    its own groups, in one pass over its entries."""
    issued: dict[int, dict[OpKey, int]] = {}
    wanted.discard(None)
    if len(wanted) < 2:
        return issued
    for rank in evidence.job.dumps if ranks is None else ranks:
        seen: dict[OpKey, int] = {}
        for entry in evidence.job.dumps[rank].entries:
            key = _entry_key(evidence, siblings, rank, entry)
            if key in wanted and key not in seen:
                seen[key] = entry.time_created_ns
        issued[rank] = seen
    return issued


def _orders(
    evidence: Evidence, siblings: Siblings, issued: dict[int, dict[OpKey, int]], a: OpKey, b: OpKey
) -> dict[int, str]:
    """Per rank whose program has both ops, which it issued first: "ab" or "ba"; an op it never issued
    counts as later than one it did (ranks that issued neither have no say)."""
    orders = {}
    for rank, seen in issued.items():
        at, bt = seen.get(a), seen.get(b)
        if at is not None and bt is not None:
            orders[rank] = "ab" if at <= bt else "ba"
        elif (
            (at is not None or bt is not None)
            and _has(evidence, siblings, rank, a)
            and _has(evidence, siblings, rank, b)
        ):
            orders[rank] = "ab" if at is not None else "ba"
    return orders


def _has(evidence: Evidence, siblings: Siblings, rank: int, key: OpKey) -> bool:
    """Whether a rank's program holds an op like ``key``: it is in a group so described and, for a send
    or recv, in the place of that end."""
    for group in evidence.job.groups_of_rank(rank):
        if siblings.label(group) != key[:2]:
            continue
        if len(key) == 3:
            return True
        op, local = key[2], cast("tuple[int, int] | None", key[3])  # a send's or recv's Entry.p2p_local
        if local is not None and group.global_rank(local[1] if op in ("recv", "irecv") else local[0]) == rank:
            return True
    return False


def _majority(orders: list[str]) -> str | None:
    """The order more than half of ``orders`` share, if any."""
    if not orders:
        return None
    (order, count), *_ = Counter(orders).most_common(1)
    return order if count * 2 > len(orders) else None
