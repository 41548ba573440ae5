"""Where the waits end: the sinks of the wait-for graph that ``evidence`` built.

Ranks are nodes, with an edge from each blocked rank to the ranks its blocking op waits for. Its sinks
(the parts no edge leaves) are the answer: a rank nothing blocks that others wait for is a culprit;
ranks that wait for each other are a deadlock, in which the rank that broke the symmetry (``symmetry``)
comes first; an op that is a cause by itself (a mismatch, a hang inside the op) ends the waits in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.model import COMPLETED, MISMATCH, MISSING, MatchedOp, state_entry
from .evidence import WAIT_HELD, WAIT_MISMATCH, WAIT_MISSING, WAIT_NO_DUMP, WAIT_NOT_STARTED, WAIT_STUCK, Evidence
from .siblings import Siblings, odd_member
from .streams import parting
from .symmetry import order_cycle, skipped_past


@dataclass(slots=True)
class Cycle:
    """Ranks that wait for each other: those that broke the symmetry first, and what shows it."""

    ranks: list[int]
    why: list[str]


@dataclass(slots=True)
class Blame:
    """The sinks of the wait-for graph."""

    culprits: dict[int, str]  # rank nobody blocks that others wait for -> how they wait for it (WAIT_*)
    cycles: list[Cycle]  # ranks that wait for each other
    causes: list[MatchedOp]  # ops that are causes by themselves (mismatch, stuck), in time order
    victims: set[int]  # blocked ranks whose waits lead to a sink elsewhere
    # culprit that skipped an op and went on -> that op, and what shows it
    skipped: dict[int, tuple[MatchedOp, str]] = field(default_factory=dict)
    # op key of a collective whose members disagree -> the one member its group's siblings say is wrong,
    # and what shows it (``siblings.odd_member``): for ops with no majority to tell, two members say
    odd_members: dict[int, tuple[int, str]] = field(default_factory=dict)


def assign_blame(evidence: Evidence) -> Blame:
    """Follow every wait to where it ends.

    Ranks that wait for each other are a deadlock, the rank that broke the symmetry first. Where none
    did but one of them skipped an op and went on (``skipped_past``), they wait because of it: it is
    the culprit. Otherwise the dumps cannot say which side to fix, and the deadlock says so: two ranks
    that each issued the other's op second look alike whichever of them has the program's order.

    Ranks held by ops queued behind each other's (no timing) say little of who waits for whom; they
    are a deadlock only where a rank among them skipped an op, or issued two ops in the order the
    members of its group's siblings did not (``order_cycle`` with ``only_siblings``).
    """
    waits = evidence.waits
    edges: dict[int, set[int]] = {rank: set(wait.on) for rank, wait in waits.items()}
    culprits: dict[int, str] = {}
    cycles: list[Cycle] = []
    victims: set[int] = set()
    causes: list[MatchedOp] = []
    skipped: dict[int, tuple[MatchedOp, str]] = {}
    siblings = Siblings(evidence)
    for component in _sink_components(edges):
        if len(component) == 1:
            (rank,) = component
            wait = waits.get(rank)
            if wait is None or not edges.get(rank):
                if wait is not None and wait.reason in (WAIT_MISMATCH, WAIT_STUCK):
                    if wait.op not in causes:
                        causes.append(wait.op)
                    continue
                how = _how_waited_for(evidence, rank)
                if how in (WAIT_NOT_STARTED, WAIT_HELD) and wait is None and _blocker_dropped(evidence, rank):
                    continue  # what holds its stream is older than its ring buffer: nobody to blame here
                culprits[rank] = how
            continue
        # Ops queued on each other's streams say nothing of who holds them: without timing, a wait
        # for a member held elsewhere may as well be a wait behind an op of the rank's own.
        held = [r for r in component if r in waits and waits[r].reason == WAIT_HELD]
        vague = len(held) == len(component) or (held and not evidence.timed)
        ordered, why = ([], []) if vague else order_cycle(evidence, sorted(component), siblings)
        if not why:
            found = _skippers(evidence, component, siblings)
            if found:
                skipped.update(found)
                culprits.update(dict.fromkeys(found, WAIT_MISSING))
                continue
        if vague:
            ordered, why = order_cycle(evidence, sorted(component), siblings, only_siblings=True)
        if not why:
            parted = _parted(evidence, component, siblings)
            if parted is not None and parted[0] in parted[1].missing:  # it skipped the op
                skipped[parted[0]] = (parted[1], parted[2])
                culprits[parted[0]] = WAIT_MISSING
                continue
            if parted is not None:  # it went on past another op: the others wait for it in that one
                ordered, why = [parted[0], *sorted(component - {parted[0]})], [parted[2]]
        if vague and not why:
            continue
        cycles.append(Cycle(ordered, why))
    in_sinks = set(culprits) | {r for cycle in cycles for r in cycle.ranks}
    for rank in waits:
        if rank not in in_sinks:
            victims.add(rank)
    causes.sort(key=lambda op: op.first_time_ns)
    odd_members = {
        op.op_key: odd for op in evidence.unsettled
        if op.status == MISMATCH and (odd := odd_member(siblings, op) or _parted_in(evidence, siblings, op))
    }  # fmt: skip
    return Blame(culprits, cycles, causes, victims, skipped, odd_members)


def _skippers(evidence: Evidence, component: set[int], siblings: Siblings) -> dict[int, tuple[MatchedOp, str]]:
    """Ranks of a sink component that never issued an op its other members wait in (or queued) and
    went on past it, with what shows it: each one's first such op per group is tested."""
    tested: set[tuple[int, str]] = set()
    found: dict[int, tuple[MatchedOp, str]] = {}
    for op in evidence.unsettled:
        if op.status != MISSING or not any(r in component for r in op.entries):
            continue
        for rank in op.missing:
            if rank not in component or rank in found or (rank, op.group.name) in tested:
                continue
            tested.add((rank, op.group.name))
            line = skipped_past(evidence, rank, op, siblings)
            if line is not None:
                found[rank] = (op, line)
    return found


def _parted(evidence: Evidence, component: set[int], siblings: Siblings) -> tuple[int, MatchedOp, str] | None:
    """The rank of a sink component whose stream of ops left the program (``streams.parting``) at the
    first collective some members never issued, that op, and what shows it."""
    tested: set[str] = set()
    for op in evidence.unsettled:
        if op.status != MISSING or op.kind != "collective" or op.group.name in tested:
            continue
        if not any(r in component for r in op.entries) or not any(r in component for r in op.missing):
            continue
        tested.add(op.group.name)
        found = parting(evidence, siblings, op)
        if found is not None and found[0] in component:
            return found[0], op, found[1]
    return None


def _parted_in(evidence: Evidence, siblings: Siblings, op: MatchedOp) -> tuple[int, str] | None:
    """For a collective whose members disagree with no majority to tell: the member whose stream of
    ops left the program at or before it (``streams.parting``)."""
    if op.mismatch_ranks and len(op.mismatch_ranks) * 2 < len(op.entries):
        return None  # a majority tells already
    return parting(evidence, siblings, op)


def _blocker_dropped(evidence: Evidence, rank: int) -> bool:
    """Whether the op that holds a rank's stream may be older than its ring buffer: the buffer wrapped
    and its oldest op (a cut coalesced group aside) never completed."""
    dump = evidence.job.dumps.get(rank)
    if dump is None or not dump.may_have_wrapped:
        return False
    for entry in dump.entries:
        if entry.is_p2p and entry.p2p_local is None and not entry.closed_by and not entry.is_coalesced_end:
            continue  # an op of a coalesced group the buffer cut: set aside, recorded without events
        return state_entry([entry]).state != COMPLETED
    return False


def _how_waited_for(evidence: Evidence, rank: int) -> str:
    """How the ranks blocked on ``rank`` wait for it: the strongest reason among their waits."""
    reasons = {wait.reason for wait in evidence.waits.values() if rank in wait.on}
    for reason in (WAIT_MISSING, WAIT_NO_DUMP, WAIT_NOT_STARTED, WAIT_HELD):
        if reason in reasons:
            return reason
    return WAIT_MISSING


def _sink_components(edges: dict[int, set[int]]) -> list[set[int]]:
    """The strongly connected components of the wait-for graph that no edge leaves (Tarjan, iterative)."""
    nodes = set(edges) | {t for targets in edges.values() for t in targets}
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[set[int]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    sinks = []
    for component in components:
        leaves = any(t not in component for r in component for t in edges.get(r, ()))
        if not leaves:
            sinks.append(component)
    return sinks
