"""Siblings: groups of one shape built together, which run the same part of the program.

``new_subgroups(group_size=2)`` gives a job its pairs, and a tp x pp x dp grid its tp groups, by one
``new_group`` call per group that every rank makes in one order. Only members build a group's backend
(``_new_process_group_helper`` returns ``NON_GROUP_MEMBER`` to the others), so each member counts it with
the same per-process creation counter, the ``pg_id`` its entries carry. Groups are siblings when they
have the same size, the same description (``undefined`` or none counting as one), that same ``pg_id``
on every member, no member in common, and the same collective at each seq. Each sibling is what the
others' members did, seen again: a member that orders two ops unlike every other sibling's members is
the one that deviated.

Sibling groups described ``undefined`` are called alike in op keys (``label``): their names differ (a
counter), yet their ops are the same ops of the program. Groups with a description of their own are
already called by it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ..base.model import MISMATCH, Entry, Group, MatchedOp, head_entry, inner_entries, ranks_label
from ..match.arguments import dtypes_that_agree, recorded_sizes
from ..match.ops import signature
from .evidence import Evidence

UNDESCRIBED = ("", "undefined", "default_pg")  # descriptions that do not tell one group from another
MAX_SIBLINGS_LISTED = 4  # siblings named by their ranks in a line; the rest are counted


@dataclass(frozen=True, slots=True)
class Family:
    """Sibling groups: the same size, description and creation place, the same collective at each seq."""

    label: tuple[str, str]  # what op keys call each of its groups
    groups: tuple[Group, ...]  # by first member
    desc: str  # the shared description; "" where they have none

    @property
    def size(self) -> int:
        """The members of each group."""
        return len(self.groups[0].members)

    def noun(self, count: int = 2) -> str:
        """What its groups are called: ``pair``/``pairs``, ``tp group``/``tp groups``, ``group of 4 ranks``."""
        if not self.desc and self.size == 2:
            return "pair" if count == 1 else "pairs"
        if not self.desc:
            return f"group of {self.size} ranks" if count == 1 else f"groups of {self.size} ranks"
        return f"{self.desc} group" if count == 1 else f"{self.desc} groups"

    def group_of(self, rank: int) -> Group | None:
        """The group of the family that ``rank`` is a member of (one at most: siblings share no member)."""
        for group in self.groups:
            if rank in group.members:
                return group
        return None

    def members(self) -> set[int]:
        """Every member of every group of the family."""
        return {rank for group in self.groups for rank in group.members}


class Siblings:
    """The families of a job's groups, found the first time one is asked for (a pass over its ops)."""

    def __init__(self, evidence: Evidence) -> None:
        self._evidence = evidence
        self._families: dict[Group, Family] | None = None
        self._collectives: dict[tuple[Group, int], MatchedOp] | None = None

    def label(self, group: Group) -> tuple[str, str]:
        """What op keys call ``group``: its description where it has one of its own; else its family,
        where it has one (so that its siblings' ops are the same ops); else its name."""
        if group.desc not in UNDESCRIBED:
            return ("desc", group.desc)
        family = self.family(group)
        return family.label if family is not None else ("name", group.name)

    def family(self, group: Group) -> Family | None:
        """The family ``group`` belongs to, if it has siblings."""
        if self._families is None:
            self._families = find_families(self._evidence.job.groups, self._evidence.ops)
        return self._families.get(group)

    def collective(self, group: Group, seq: int) -> MatchedOp | None:
        """The collective of ``group`` with ``seq``, if its members recorded it."""
        if self._collectives is None:
            self._collectives = {(op.group, op.seq): op for op in self._evidence.ops if op.kind == "collective"}
        return self._collectives.get((group, seq))


def find_families(groups: Iterable[Group], ops: list[MatchedOp]) -> dict[Group, Family]:
    """Every group that has siblings -> its family.

    Candidates share a description, a size and the ``pg_id`` every member of theirs gives them; of
    those, the groups that issue the collective most of them issue at each seq they have in common are
    a family (two at least, no member in common)."""
    seen = _collectives_seen(ops)
    buckets: dict[tuple[str, int, int], list[Group]] = {}
    for group in groups:
        pg_id = seen.pg_ids.get(group)
        if pg_id is None or len(group.members) < 2:
            continue  # members that disagree on it, or no op recorded: nothing says how it was built
        desc = "" if group.desc in UNDESCRIBED else group.desc
        buckets.setdefault((desc, len(group.members), pg_id), []).append(group)
    families: dict[Group, Family] = {}
    for (desc, size, pg_id), candidates in buckets.items():
        alike = _same_collectives(candidates, seen.ops)
        members = [rank for group in alike for rank in group.members]
        if len(alike) < 2 or len(set(members)) < len(members):
            continue
        label = ("desc", desc) if desc else ("siblings", f"{size} ranks, pg {pg_id}")
        family = Family(label, tuple(sorted(alike, key=lambda g: g.members)), desc)
        families.update(dict.fromkeys(alike, family))
    return families


@dataclass(slots=True)
class _Seen:
    """Per group: the ``pg_id`` all its members give it (None when they disagree), and per collective
    seq the collectives its members issued."""

    pg_ids: dict[Group, int | None]
    ops: dict[Group, dict[int, set[str]]]


def _collectives_seen(ops: list[MatchedOp]) -> _Seen:
    """What each group's ops say of how it was built (sends and recvs too) and what it runs (its
    collectives: a send's seq is its rank's own count, whatever the peer)."""
    seen = _Seen({}, {})
    for op in ops:
        names = seen.ops.setdefault(op.group, {}).setdefault(op.seq, set()) if op.kind == "collective" else None
        for entries in op.entries.values():
            head = head_entry(entries)
            if names is not None:
                names.add(head.op)
            known = seen.pg_ids.setdefault(op.group, head.pg_id)
            if known is not None and known != head.pg_id:
                seen.pg_ids[op.group] = None
    return seen


def _same_collectives(candidates: list[Group], ops: dict[Group, dict[int, set[str]]]) -> list[Group]:
    """The candidates that issued, at every seq, the collective most candidates with that seq issued
    (one member of theirs having issued it there is enough: a member that issued another op is the
    deviation siblings are looked at for, not a sign of another part of the program)."""
    usual: dict[int, str] = {}
    counts: dict[int, Counter[str]] = {}
    for group in candidates:
        for seq, names in ops.get(group, {}).items():
            counts.setdefault(seq, Counter()).update(names)
    for seq, tally in counts.items():
        (name, count), *_ = tally.most_common(1)
        with_seq = sum(1 for group in candidates if seq in ops.get(group, {}))
        if count * 2 > with_seq:
            usual[seq] = name
    return [
        group for group in candidates
        if all(seq not in usual or usual[seq] in names for seq, names in ops.get(group, {}).items())
    ]  # fmt: skip


def odd_member(siblings: Siblings, op: MatchedOp) -> tuple[int, str] | None:
    """Of a collective whose members disagree on its arguments, the one member whose part differs from
    what every sibling's members agreed on at that seq, and the line that says so; None where the
    siblings do not tell (none has that op matched alike, or they passed another value still).

    With two members nobody can tell from the op alone which side is wrong; siblings run the same part
    of the program, so what they passed is what the program passes there."""
    family = siblings.family(op.group) if op.status == MISMATCH and op.kind == "collective" else None
    if family is None:
        return None
    agreed: dict[tuple[object, ...], list[Group]] = {}
    for group in family.groups:
        sibling_op = siblings.collective(group, op.seq) if group is not op.group else None
        if sibling_op is None or sibling_op.status == MISMATCH or set(sibling_op.entries) != set(group.members):
            continue
        values = {signature(entries, op.mismatch) for entries in sibling_op.entries.values()}
        if len(values) == 1:
            agreed.setdefault(values.pop(), []).append(group)
    if len(agreed) != 1:
        return None  # no sibling has a say, or they disagree among themselves
    ((usual, agreeing),) = agreed.items()
    odd = [rank for rank, entries in op.entries.items() if signature(entries, op.mismatch) != usual]
    if len(odd) != 1 or len(op.entries) < 2:
        return None
    (rank,) = odd
    usual_words = _part_words(op.entries[next(r for r in op.entries if r != rank)], op.mismatch)
    return rank, (
        f"in {siblings_text(family, agreeing)} {all_members(family.size)} {usual_words} in their "
        f"{family.noun(1)}'s #{op.seq}; rank {rank} {_part_words(op.entries[rank], op.mismatch)}"
    )


def _part_words(entries: list[Entry], mismatch: str) -> str:
    """A member's part in words, as the mismatch finding lists it: ``passed sizes [[1024]]``."""
    inner = inner_entries(entries)
    if mismatch == "op":
        return "issued " + ", ".join(e.op for e in inner)
    if mismatch == "size":
        return "passed sizes " + " ".join(str([list(s) for s in recorded_sizes(e)]) for e in inner)
    return "passed dtypes " + " ".join(",".join(sorted(dtypes_that_agree(e))) for e in inner)


def siblings_text(family: Family, groups: list[Group]) -> str:
    """``the 3 other pairs (ranks 0-1, 2-3, 6-7)``, ``the other tp group (ranks 2-3)``: ``groups`` of
    ``family`` by their members."""
    shown = [ranks_label(group.members) for group in groups[:MAX_SIBLINGS_LISTED]]
    more = len(groups) - len(shown)
    # groups of ranks that are not consecutive (``0,4``) are told apart by semicolons
    listed = ("; " if any("," in label for label in shown) else ", ").join(shown)
    listed += f" and {more} more" if more else ""
    count = f"{len(groups)} " if len(groups) > 1 else ""
    return f"the {count}other {family.noun(len(groups))} (ranks {listed})"


def all_members(count: int) -> str:
    """``both members`` / ``all members``."""
    return "both members" if count == 2 else "all members"
