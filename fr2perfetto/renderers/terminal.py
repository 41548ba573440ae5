"""Print the analysis for a person: the verdict first, then the evidence, at 80 columns."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from ..diagnose import HANG, HEALTHY, MISMATCH_STATUS, Diagnosis, Finding
from ..job import Job
from ..model import ranks_label
from ..text import shown

STATUS_STYLE = {HANG: "bold white on red", MISMATCH_STATUS: "bold white on dark_orange", HEALTHY: "bold white on green"}
MAX_FINDINGS_SHOWN = 12
MAX_FRAMES_SHOWN = 6


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
        f"{len(job.dumps)} dumps read, {len(job.ranks)} ranks, {len(job.groups)} groups, {op_count} ops"
        + (f"; no dump from {'rank' if len(missing) == 1 else 'ranks'} {ranks_label(missing)}" if missing else "")
    )
    if diagnosis.notes:
        console.print(Text("From the logs:", style="bold"))
        for line in diagnosis.notes:
            console.print(Text("  • " + shown(line)))
    if diagnosis.caveats:
        console.print(Text("What these dumps cannot show:", style="bold"))
        for line in diagnosis.caveats:
            console.print(Text("  • " + shown(line)))
    for number, finding in enumerate(diagnosis.findings[:MAX_FINDINGS_SHOWN], start=1):
        _finding(console, number, finding)
    hidden = len(diagnosis.findings) - MAX_FINDINGS_SHOWN
    if hidden > 0:
        console.print(f"… and {hidden} more findings (see --json)")


def _finding(console: Console, number: int, finding: Finding) -> None:
    console.print()
    title = Text(f"{number}. {shown(finding.kind)}", style="bold")
    if finding.culprit_ranks:
        title.append(f"  culprit {ranks_label(finding.culprit_ranks)}", style="red")
    console.print(title)
    console.print(Text(shown(finding.summary)))
    for line in finding.evidence:
        console.print(Text("  • " + shown(line), style="dim"))
    if finding.culprit_frames:
        console.print(Text(f"  stack of rank {finding.culprit_ranks[0]} (innermost first):"))
        for frame in finding.culprit_frames[:MAX_FRAMES_SHOWN]:
            console.print(Text(shown(f"    {frame.name}  {short_path(frame.filename)}:{frame.line}"), style="cyan"))
        if len(finding.culprit_frames) > MAX_FRAMES_SHOWN:
            console.print(Text(f"    … {len(finding.culprit_frames) - MAX_FRAMES_SHOWN} more frames"))


def short_path(path: str, keep: int = 3, width: int = 48) -> str:
    """Keep the last few parts of a long path, so that a frame fits on one line at 80 columns."""
    if len(path) <= width:
        return path
    parts = path.split("/")
    return "…/" + "/".join(parts[-keep:])
