"""Where ranks that run one program part ways: each rank's own stream of ops says which one left it.

Members of a group that run the same part of the program issue the same ops in the same order. Read
from the last op of the group they all issued (the anchor), their streams agree until one of them
leaves the program; two signs tell which one did:

- **One op left out.** With two members, the rank whose stream from the parting on is the other's with
  one op left out skipped that op and went on (a branch on a rank's data or index is the usual
  mistake); the other's stream, shifted the other way, must not fit. At least one op after the
  parting must fit: a rank that stopped, or is merely behind, fits either way and tells nothing.
- **The odd one.** With three or more, the only rank that issued something else where all the others
  issued the same op.

Ops are compared as the program names them, not by seq: a skip shifts the seqs of the skipper's later
ops of that group, so ``default_pg's all_reduce #2`` of one rank may be the program's #3. A stream is
the rank's group (by its label: its description, or its family of siblings), the op, a send's or
recv's ends in the group, and the sizes and dtypes that members must pass alike. The streams before
the anchor must agree too, or the ranks do not run the same part of the program and nothing is said.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..base.model import Entry, MatchedOp
from ..base.words import group_called
from ..match.ops import signature
from ..read.columns import EntryRows
from .evidence import Evidence
from .siblings import Siblings

MAX_BEFORE = 8  # ops before the anchor (and it) that must agree
MAX_AFTER = 64  # ops after the anchor compared

Step = tuple[object, ...]  # one op of a stream, as the program names it


def parting(evidence: Evidence, siblings: Siblings, op: MatchedOp) -> tuple[int, str] | None:
    """The member of collective ``op``'s group that left the program at or before ``op`` (one left out,
    or the odd one: the module's docstring), and a line that shows it; None where the streams do not
    tell."""
    if op.kind != "collective" or op.seq <= 1:
        return None
    dumps = evidence.job.dumps
    members = [r for r in op.group.members if r in dumps]
    found = {r: _anchor(dumps[r].entries, op.group.name, op.seq - 1) for r in members}
    anchors = {r: i for r, i in found.items() if i is not None}
    ranks = list(anchors)
    if len(ranks) < 2 or len(ranks) < len(members):
        return None  # a member whose anchor is out of its buffer: where it parted cannot be seen
    before = min(MAX_BEFORE, *(i + 1 for i in anchors.values()))
    windows = {r: dumps[r].entries[anchors[r] + 1 - before : anchors[r] + 1 + MAX_AFTER] for r in ranks}
    steps = {r: [_step(evidence, siblings, r, e) for e in window] for r, window in windows.items()}
    if len({tuple(s[:before]) for s in steps.values()}) != 1:
        return None  # they do not run the same part of the program
    after = {r: s[before:] for r, s in steps.items()}
    entries = {r: window[before:] for r, window in windows.items()}
    anchor_name = f"{group_called(op.group)}'s {_op_title(windows[ranks[0]][before - 1])}"
    if len(ranks) == 2:
        return _one_left_out(evidence, ranks, after, entries, anchor_name)
    return _odd_one(evidence, ranks, after, entries, anchor_name)


def _one_left_out(
    evidence: Evidence, ranks: list[int], after: dict[int, list[Step]], entries: dict[int, Sequence[Entry]], anchor: str
) -> tuple[int, str] | None:
    """Of two ranks, the one whose stream is the other's with one op left out, where only one fits."""
    a, b = ranks
    parted = _parted_at([after[a], after[b]])
    if parted is None:
        return None
    fits = [r for r, other in ((a, b), (b, a)) if _fits_without(after[r], after[other], parted)]
    if len(fits) != 1:
        return None
    (skipper,) = fits
    other = b if skipper == a else a
    left_out = entries[other][parted]
    went_on = min(len(after[skipper]) - parted, len(after[other]) - parted - 1)
    return skipper, (
        f"{_after(anchor, parted)} rank {other} issued "
        f"{_entry_name(evidence, other, left_out)} (sizes {_sizes(left_out)}), and rank {skipper} never issued that "
        f"op but went on with the {_ops(went_on)} rank {other} issued after it (as a rank that skipped an op does)"
    )


def _odd_one(
    evidence: Evidence, ranks: list[int], after: dict[int, list[Step]], entries: dict[int, Sequence[Entry]], anchor: str
) -> tuple[int, str] | None:
    """Of three or more ranks, the only one that issued another op where all the others issued one."""
    parted = _parted_at([after[r] for r in ranks])
    if parted is None:
        return None
    nexts = {r: after[r][parted] if parted < len(after[r]) else None for r in ranks}
    counts = Counter(nexts.values())
    if len(counts) != 2 or None in counts:
        return None  # a rank with nothing more may have stopped; several ways say nothing
    (usual, _), (odd_step, odd_count) = counts.most_common()
    if odd_count != 1:
        return None
    odd = next(r for r in ranks if nexts[r] == odd_step)
    peer = next(r for r in ranks if nexts[r] == usual)
    theirs, its = _entry_name(evidence, peer, entries[peer][parted]), _entry_name(evidence, odd, entries[odd][parted])
    return (
        odd,
        f"{_after(anchor, parted)} rank {odd} issued {its} where the {len(ranks) - 1} other members issued {theirs}",
    )


def _parted_at(streams: list[list[Step]]) -> int | None:
    """The first place where the streams differ (one that ends counts as not differing); None if none."""
    for i in range(min(len(s) for s in streams) if streams else 0):
        if len({s[i] for s in streams}) > 1:
            return i
    return None


def _fits_without(mine: list[Step], theirs: list[Step], parted: int) -> bool:
    """Whether ``mine`` from ``parted`` on is ``theirs`` with its op at ``parted`` left out, with at
    least one op to show it."""
    rest, shifted = mine[parted:], theirs[parted + 1 :]
    overlap = min(len(rest), len(shifted))
    return overlap >= 1 and rest[:overlap] == shifted[:overlap]


def _anchor(entries: Sequence[Entry], group_name: str, seq: int) -> int | None:
    """Where a rank's collective ``seq`` of the group is in its entries (its last one, for a coalesced group)."""
    if isinstance(entries, EntryRows):  # the rows of that seq, from its column: the few of them made
        rows = entries.rows_with("collective_seq", seq)
        found_rows = {
            row for row, entry in zip(rows, entries.rows(rows), strict=True)
            if entry.group_name == group_name and not entry.is_p2p
        }  # fmt: skip
        if not found_rows:
            return None
        first = min(found_rows)
        while first + 1 in found_rows:
            first += 1
        return first
    found = None
    for i, entry in enumerate(entries):
        if entry.group_name == group_name and not entry.is_p2p and entry.collective_seq == seq:
            found = i
        elif found is not None:
            break
    return found


def _step(evidence: Evidence, siblings: Siblings, rank: int, entry: Entry) -> Step:
    """An entry as the program names it: no seq, no rank of its own."""
    group = evidence.job.group_of.get((rank, entry.group_name))
    label = siblings.label(group) if group is not None else ("name", entry.group_name)
    return (*label, entry.op, entry.p2p_local, signature([entry], "size"), signature([entry], "dtype"))


def _entry_name(evidence: Evidence, rank: int, entry: Entry) -> str:
    group = evidence.job.group_of.get((rank, entry.group_name))
    called = group_called(group) if group is not None else entry.group_name
    return f"{called}'s {_op_title(entry)}"


def _op_title(entry: Entry) -> str:
    if entry.is_p2p and entry.p2p_local is not None:
        return f"{entry.op} {entry.p2p_local[0]}->{entry.p2p_local[1]} (local ranks)"
    return f"{entry.op} #{entry.collective_seq}"


def _after(anchor: str, parted: int) -> str:
    """Where the streams part: after the anchor, and after the ops they all issued next."""
    return f"after {anchor}" + (f" and the {_ops(parted)} all issued next," if parted else "")


def _ops(count: int) -> str:
    return "op" if count == 1 else f"{count} ops"


def _sizes(entry: Entry) -> str:
    return str([list(size) for size in entry.input_sizes])
