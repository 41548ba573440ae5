"""The words around a verdict agree with it: what every sample and generated program is checked for.

The status line, the culprit line, the root cause and the first finding say one thing: a job with a
culprit is never "healthy"; a job held up only by stragglers is "slow"; the headline is finding 1, its
root cause the one its kind means, and its culprits lead the verdict's.
"""

from __future__ import annotations

from fr2perfetto.diagnose.verdict import (
    _WEIGHT,
    CATEGORY_CONTRADICTED,
    CATEGORY_CRASH,
    CRASH,
    HEALTHY,
    SLOW,
    UNDECIDED,
    Diagnosis,
    _is_a_cause,
)


def disagreements(diagnosis: Diagnosis) -> list[str]:
    """What in the verdict's words contradicts the rest (empty: they agree)."""
    verdict, findings = diagnosis.verdict, diagnosis.findings
    problems = []
    if verdict.status == HEALTHY and verdict.culprit_ranks:
        problems.append(f"healthy, with culprits {list(verdict.culprit_ranks)}")
    held_up = not any(_is_a_cause(f) for f in findings) and any(f.kind == "straggler" for f in findings)
    if (verdict.status == SLOW) != (held_up and verdict.category != CATEGORY_CONTRADICTED):
        problems.append(f"status {verdict.status}, though stragglers alone hold the job up: {held_up}")
    if not findings or verdict.category == CATEGORY_CONTRADICTED:
        return problems
    top = findings[0]
    if verdict.status == UNDECIDED:
        if not verdict.culprit_ranks and verdict.summary.startswith(f"{UNDECIDED}: {top.summary}"):
            return problems
        if not _is_a_cause(top):  # undecided for want of a cause: its headline is its own
            return problems
    if not verdict.summary.endswith(f": {top.summary}"):
        problems.append(f"headline {verdict.summary!r} is not finding 1 ({top.kind}: {top.summary!r})")
    if top.kind in _WEIGHT and verdict.status != UNDECIDED:
        status, category = _WEIGHT[top.kind]
        if verdict.status == CRASH or verdict.category == CATEGORY_CRASH:
            category = verdict.category
        if verdict.status not in (status, CRASH) or verdict.category != category:
            problems.append(f"{verdict.status} / {verdict.category!r}, but finding 1 is {top.kind}")
    if top.culprit_ranks and verdict.culprit_ranks[: len(top.culprit_ranks)] != top.culprit_ranks:
        problems.append(
            f"culprits {list(verdict.culprit_ranks)} do not lead with finding 1's {list(top.culprit_ranks)}"
        )
    return problems
