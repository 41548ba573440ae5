"""How findings name ranks and ops, in one place so that every rule says them alike."""

from __future__ import annotations

from .model import MatchedOp, ranks_label


def where(op: MatchedOp) -> str:
    """``all_reduce #4 of default_pg (pg 0, 4 ranks)``."""
    return f"{op.title} of {op.group.desc or 'pg ' + op.group.name} (pg {op.group.name}, {len(op.group.members)} ranks)"


def ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    """``rank 3`` / ``ranks 0-2,5``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ranks_label(ranks)


def verb(ranks: tuple[int, ...] | list[int], singular: str, plural: str) -> str:
    """``rank 3 waits`` / ``ranks 0-2 wait``."""
    return f"{ranks_text(ranks)} {singular if len(ranks) == 1 else plural}"
