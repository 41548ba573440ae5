"""Print the analysis for a person: the verdict first, then the evidence, at 80 columns."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from ..base.model import Frame, ranks_label
from ..base.text import shown
from ..base.words import count, ranks_text, stacks_said_once
from ..diagnose.verdict import HANG, HEALTHY, MISMATCH_STATUS, SLOW, Diagnosis, Finding
from ..read.job import Job
from ..read.runs import which_run

STATUS_STYLE = {
    HANG: "bold white on red",
    MISMATCH_STATUS: "bold white on dark_orange",
    SLOW: "bold black on yellow",
    HEALTHY: "bold white on green",
}
MAX_FINDINGS_SHOWN = 12
MAX_FRAMES_SHOWN = 6
MAX_STACKS_SHOWN = 3  # distinct stacks per finding
BULLET_INDENT = 4


def render_analysis(console: Console, job: Job, diagnosis: Diagnosis, op_count: int) -> None:
    """Write the verdict panel, each finding with its evidence, and the culprit's stack."""
    verdict = diagnosis.verdict
    head = Text()
    head.append(f" {verdict.status.upper()} ", style=STATUS_STYLE.get(verdict.status, "bold white on grey37"))
    if verdict.culprit_ranks:
        head.append("  culprit " + ("rank " if len(verdict.culprit_ranks) == 1 else "ranks "), style="bold")
        head.append(", ".join(str(r) for r in verdict.culprit_ranks[:16]), style="bold red")
        if len(verdict.culprit_ranks) > 16:
            head.append(f" (+{len(verdict.culprit_ranks) - 16} more)")
    body = [head, Text(shown(verdict.summary)), Text(f"Root cause: {shown(verdict.category)}", style="italic")]
    console.print(Panel(Group(*body), title="fr2perfetto verdict", title_align="left", width=min(console.width, 100)))
    missing = job.missing_ranks
    console.print(
        f"{count(len(job.dumps), 'dump')} read, {count(len(job.ranks), 'rank')}, {count(len(job.groups), 'group')}, "
        f"{count(op_count, 'op')}" + (f"; no dump from {ranks_text(missing)}" if missing else "")
    )
    if job.run:  # the inputs held several runs: the verdict is of this one
        console.print(Text(shown(which_run(job.runs, job.run)), style="bold"))
    if diagnosis.notes:
        console.print(Text("From the logs:", style="bold"))
        for line in diagnosis.notes:
            _bullet(console, line)
    if diagnosis.caveats:
        console.print(Text("What these dumps cannot show:", style="bold"))
        for line in diagnosis.caveats:
            _bullet(console, line)
    findings = diagnosis.findings[:MAX_FINDINGS_SHOWN]
    for number, (finding, stacks) in enumerate(
        zip(findings, stacks_said_once(findings, MAX_STACKS_SHOWN), strict=True), start=1
    ):
        _finding(console, number, finding, stacks)
    hidden = len(diagnosis.findings) - MAX_FINDINGS_SHOWN
    if hidden > 0:
        console.print()
        console.print(f"{count(len(diagnosis.findings), 'finding')}; the first {MAX_FINDINGS_SHOWN} shown, "
                      f"{hidden} more in --json or --format markdown.")  # fmt: skip
    if diagnosis.next_steps:
        console.print()
        console.print(Text("Next:", style="bold"))
        for line in diagnosis.next_steps:
            _bullet(console, line, style="")


def _bullet(console: Console, line: str, style: str = "dim") -> None:
    """A bullet whose wrapped lines keep their indent under its text."""
    wrapped = Text(shown(line), style=style).wrap(console, max(20, console.width - BULLET_INDENT))
    for number, part in enumerate(wrapped):
        part.rstrip()
        console.print(Text("  • " if number == 0 else " " * BULLET_INDENT) + part)


def _finding(
    console: Console,
    number: int,
    finding: Finding,
    stacks: list[tuple[tuple[int, ...], tuple[Frame, ...], int | None]],
) -> None:
    console.print()
    title = Text(f"{number}. {shown(finding.kind)}", style="bold")
    if finding.culprit_ranks:
        title.append(f"  culprit {ranks_label(finding.culprit_ranks)}", style="red")
    console.print(title)
    console.print(Text(shown(finding.summary)))
    for line in finding.evidence:
        _bullet(console, line)
    for ranks, frames, earlier in stacks:
        if earlier is not None:
            console.print(Text(f"  stack of {ranks_text(ranks)}: as in finding {earlier}", style="dim"))
            continue
        console.print(Text(f"  stack of {ranks_text(ranks)} (innermost first):"))
        for frame in frames[:MAX_FRAMES_SHOWN]:
            console.print(Text(shown(f"    {frame.name}  {short_path(frame.filename)}:{frame.line}"), style="cyan"))
        if len(frames) > MAX_FRAMES_SHOWN:
            console.print(Text(f"    … {count(len(frames) - MAX_FRAMES_SHOWN, 'more frame')}"))
    if len(finding.stacks) > MAX_STACKS_SHOWN:
        console.print(Text(f"  … {count(len(finding.stacks) - MAX_STACKS_SHOWN, 'more stack')} (--json)"))


def short_path(path: str, keep: int = 3, width: int = 48) -> str:
    """Keep the last few parts of a long path, so that a frame fits on one line at 80 columns."""
    if len(path) <= width:
        return path
    parts = path.split("/")
    return "…/" + "/".join(parts[-keep:])
