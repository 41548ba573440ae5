"""How findings name ranks and ops, in one place so that every rule says them alike."""

from __future__ import annotations

from collections.abc import Sequence

from .model import Finding, Frame, Group, MatchedOp, ranks_label
from .text import shown

# What PyTorch records as the description of a group made without a name (``new_group``'s default):
# shown as is, it reads like an error of fr2perfetto's, and it tells one group from no other.
UNNAMED = "undefined"


def group_called(group: Group) -> str:
    """What a group is called in words: its description (``tp``), else ``pg 3``."""
    return group.desc if group.desc and group.desc != UNNAMED else "pg " + group.name


def group_in_words(group: Group, *more: str) -> str:
    """A group and its pg, with ``more`` after it: ``tp (pg 3, 8 ranks)``; ``an unnamed group (pg 3, 8
    ranks)`` for one made without a name; ``pg 3 (8 ranks)`` where the dump records no description
    (older PyTorch: whether it had a name is unknown)."""
    if not group.desc:
        return f"pg {group.name}" + (f" ({', '.join(more)})" if more else "")
    called = "an unnamed group" if group.desc == UNNAMED else group.desc
    return f"{called} ({', '.join([f'pg {group.name}', *more])})"


def where(op: MatchedOp) -> str:
    """``all_reduce #4 of default_pg (pg 0, 4 ranks)``."""
    return f"{op.title} of {group_in_words(op.group, f'{len(op.group.members)} ranks')}"


def ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    """``rank 3`` / ``ranks 0-2,5``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ranks_label(ranks)


def verb(ranks: tuple[int, ...] | list[int], singular: str, plural: str) -> str:
    """``rank 3 waits`` / ``ranks 0-2 wait``."""
    return f"{ranks_text(ranks)} {singular if len(ranks) == 1 else plural}"


def lateness_track(group: Group, rank: int) -> str:
    """The name of a rank's lateness counter in a group, in the trace: one the deep link can pin by."""
    called = "unnamed group" if group.desc == UNNAMED else group_called(group)
    return shown(f"enqueue lateness · {called} (pg {group.name}) · rank {rank}")


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``1 group`` / ``3 groups`` (``plural``: where adding an s is wrong)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def stacks_said_once(
    findings: Sequence[Finding], per_finding: int
) -> list[list[tuple[tuple[int, ...], tuple[Frame, ...], int | None]]]:
    """For each finding, its first ``per_finding`` stacks as (ranks, frames, earlier): ``earlier`` is the
    number (from 1) of the finding that already showed the same ranks' same stack, which a report then
    names instead of printing it again; None where it is shown here first."""
    first_shown: dict[tuple[tuple[int, ...], tuple[Frame, ...]], int] = {}
    said = []
    for number, finding in enumerate(findings, start=1):
        stacks = []
        for ranks, frames in finding.stacks[:per_finding]:
            earlier = first_shown.setdefault((ranks, frames), number)
            stacks.append((ranks, frames, earlier if earlier != number else None))
        said.append(stacks)
    return said
