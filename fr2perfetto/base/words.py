"""How findings name ranks and ops, in one place so that every rule says them alike."""

from __future__ import annotations

from collections.abc import Sequence

from .model import Finding, Frame, Group, MatchedOp, ranks_label
from .text import shown


def group_called(group: Group) -> str:
    """What a group is called in words: its description (``tp``), else ``pg 3``."""
    return group.desc or "pg " + group.name


def where(op: MatchedOp) -> str:
    """``all_reduce #4 of default_pg (pg 0, 4 ranks)``."""
    return f"{op.title} of {group_called(op.group)} (pg {op.group.name}, {len(op.group.members)} ranks)"


def ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    """``rank 3`` / ``ranks 0-2,5``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ranks_label(ranks)


def verb(ranks: tuple[int, ...] | list[int], singular: str, plural: str) -> str:
    """``rank 3 waits`` / ``ranks 0-2 wait``."""
    return f"{ranks_text(ranks)} {singular if len(ranks) == 1 else plural}"


def lateness_track(group: Group, rank: int) -> str:
    """The name of a rank's lateness counter in a group, in the trace: one the deep link can pin by."""
    return shown(f"enqueue lateness · {group_called(group)} (pg {group.name}) · rank {rank}")


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
