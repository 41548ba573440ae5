"""Print the analysis for a person: the verdict first, then the evidence.

On a terminal at least ``MIN_BOXED_WIDTH`` columns wide the verdict sits in a box and a long line wraps
under its bullet. Anywhere else (a file, a pipe, a terminal too narrow for a box) each line is written
whole, however long: ``grep`` then finds a finding on one line, and a narrow terminal wraps it itself
rather than be handed lines cut into pieces of one or two characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from ..base.model import Finding, Frame, ranks_label
from ..base.text import shown
from ..base.words import count, ranks_text, stacks_said_once
from ..diagnose.verdict import HANG, HEALTHY, MISMATCH_STATUS, SLOW, Diagnosis, Verdict
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
MAX_CULPRITS_SHOWN = 16
# Narrower than this, a box and an indent leave too little room to read: lines are written whole
MIN_BOXED_WIDTH = 40
MAX_BOX_WIDTH = 100


class StandardOutput(Console):
    """The console of standard output: it wraps lines to the width only on a terminal. Written to a file
    or a pipe, each line stays one line however long (rich would otherwise break it at 80 columns, and
    ``grep`` would see half a sentence). Whether it is a terminal, and how wide, is asked at each print:
    tests and ``main`` replace ``sys.stdout`` and the environment after the console is made."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        if options.get("width") is None:
            # rich fixes the width at COLUMNS as it is when the console is made (at import); unset, it is
            # read where the output goes, at each print
            self._width = None

    def print(self, *objects: Any, soft_wrap: bool | None = None, **options: Any) -> None:
        """``Console.print``; where ``soft_wrap`` is not given, it is on for anything but a terminal."""
        if soft_wrap is None and not self.is_terminal:
            soft_wrap = True
        super().print(*objects, soft_wrap=soft_wrap, **options)


@dataclass(frozen=True)
class Listed:
    """Which findings a report lists: each with its number among the job's findings (so that finding 3
    is the same one in every report, narrowed or not, and in the trace), how many the job has, what
    narrowed them (``scope``, e.g. ``findings of rank 2 only (--ranks)``; empty: nothing did), and
    whether every one is listed (``--all``) or only the first few."""

    numbered: list[tuple[int, Finding]]
    total: int
    scope: str = ""
    everything: bool = False

    @classmethod
    def all_of(cls, findings: list[Finding]) -> Listed:
        """Every finding of the job, not narrowed (the first few of them listed)."""
        return cls(list(enumerate(findings, start=1)), len(findings))

    def scope_line(self) -> str:
        """``Findings of rank 2 only (--ranks): 1 of 3 findings``, or empty where nothing narrowed them."""
        if not self.scope:
            return ""
        return f"{self.scope[:1].upper()}{self.scope[1:]}: {len(self.numbered)} of {count(self.total, 'finding')}"

    def first(self, limit: int) -> list[tuple[int, Finding]]:
        """The findings to list: all of them with ``--all``, else the first ``limit``."""
        return self.numbered if self.everything else self.numbered[:limit]


@dataclass(frozen=True)
class _Page:
    """Where the report goes and how: ``boxed`` (a wide terminal) wraps lines to its width; otherwise
    each line is written whole."""

    console: Console
    boxed: bool

    def line(self, text: Text | str = "") -> None:
        """One line of the report (a ``str`` is never read as markup: it may hold text from a dump)."""
        self.console.print(text if isinstance(text, Text) else Text(text), soft_wrap=not self.boxed)

    def bullet(self, line: str, style: str = "dim") -> None:
        """A bullet of text from outside; boxed, its wrapped lines keep their indent under its text."""
        text = Text(shown(line), style=style)
        if not self.boxed:
            self.line(Text("  • ") + text)
            return
        for number, part in enumerate(text.wrap(self.console, self.console.width - BULLET_INDENT)):
            part.rstrip()
            self.line(Text("  • " if number == 0 else " " * BULLET_INDENT) + part)


def render_analysis(
    console: Console, job: Job, diagnosis: Diagnosis, op_count: int, listed: Listed | None = None
) -> None:
    """Write the verdict, each finding that ``listed`` lists (default: the job's first few) with its
    evidence and the culprits' stacks, and what to do next. Never fails for a width, however small."""
    listed = listed or Listed.all_of(diagnosis.findings)
    page = _Page(console, console.is_terminal and console.width >= MIN_BOXED_WIDTH)
    _verdict(page, diagnosis.verdict, listed)
    missing = job.missing_ranks
    page.line(
        f"{count(len(job.dumps), 'dump')} read, {count(len(job.ranks), 'rank')}, {count(len(job.groups), 'group')}, "
        f"{count(op_count, 'op')}" + (f"; no dump from {ranks_text(missing)}" if missing else "")
    )
    if job.run:  # the inputs held several runs: the verdict is of this one
        page.line(Text(shown(which_run(job.runs, job.run)), style="bold"))
    for heading, lines in (("From the logs:", diagnosis.notes), ("What these dumps cannot show:", diagnosis.caveats)):
        if lines:
            page.line(Text(heading, style="bold"))
            for line in lines:
                page.bullet(line)
    _findings(page, listed)
    if diagnosis.next_steps:
        page.line()
        page.line(Text("Next:", style="bold"))
        for line in diagnosis.next_steps:
            page.bullet(line, style="")


def _verdict(page: _Page, verdict: Verdict, listed: Listed) -> None:
    """The verdict: in a box on a wide terminal, else as lines that start ``fr2perfetto verdict:``; with
    a last line saying what narrowed the findings, where something did."""
    head = _head(verdict)
    body = [Text(shown(verdict.summary)), Text(f"Root cause: {shown(verdict.category)}", style="italic")]
    scope = listed.scope_line()
    if scope:
        body.append(Text(shown(scope), style="bold"))
    if page.boxed:
        width = min(page.console.width, MAX_BOX_WIDTH)
        page.console.print(Panel(Group(head, *body), title="fr2perfetto verdict", title_align="left", width=width))
        return
    page.line(Text("fr2perfetto verdict: ") + head)
    for line in body:
        page.line(line)


def _head(verdict: Verdict) -> Text:
    """The status word and the culprits: `` HANG   culprit rank 5`` (a space either side of the word
    for its coloured block, kept without colour so that the line reads the same anywhere)."""
    head = Text()
    head.append(f" {verdict.status.upper()} ", style=STATUS_STYLE.get(verdict.status, "bold white on grey37"))
    culprits = verdict.culprit_ranks
    if culprits:
        head.append("  culprit " + ("rank " if len(culprits) == 1 else "ranks "), style="bold")
        head.append(", ".join(str(r) for r in culprits[:MAX_CULPRITS_SHOWN]), style="bold red")
        if len(culprits) > MAX_CULPRITS_SHOWN:
            head.append(f" (+{len(culprits) - MAX_CULPRITS_SHOWN} more)")
    return head


def _findings(page: _Page, listed: Listed) -> None:
    """Each finding listed, then how many more there are and where they are."""
    numbered = listed.first(MAX_FINDINGS_SHOWN)
    findings = [finding for _, finding in numbered]
    for (number, finding), stacks in zip(numbered, stacks_said_once(findings, MAX_STACKS_SHOWN), strict=True):
        # ``earlier`` counts in the list shown; the report names findings by their number in the job
        stacks = [
            (ranks, frames, None if earlier is None else numbered[earlier - 1][0]) for ranks, frames, earlier in stacks
        ]
        _finding(page, number, finding, stacks)
    hidden = len(listed.numbered) - len(numbered)
    if hidden > 0:
        page.line()
        page.line(
            f"{count(len(listed.numbered), 'finding')}; the first {len(numbered)} shown, "
            f"{hidden} more with --all (or in --json)."
        )


def _finding(
    page: _Page,
    number: int,
    finding: Finding,
    stacks: list[tuple[tuple[int, ...], tuple[Frame, ...], int | None]],
) -> None:
    """A finding: its number and kind, its summary, its evidence and the culprits' stacks."""
    page.line()
    title = Text(f"{number}. {shown(finding.kind)}", style="bold")
    if finding.culprit_ranks:
        title.append(f"  culprit {ranks_label(finding.culprit_ranks)}", style="red")
    page.line(title)
    page.line(Text(shown(finding.summary)))
    for line in finding.evidence:
        page.bullet(line)
    for ranks, frames, earlier in stacks:
        if earlier is not None:
            page.line(Text(f"  stack of {ranks_text(ranks)}: as in finding {earlier}", style="dim"))
            continue
        page.line(Text(f"  stack of {ranks_text(ranks)} (innermost first):"))
        for frame in frames[:MAX_FRAMES_SHOWN]:
            page.line(Text(shown(f"    {frame.name}  {short_path(frame.filename)}:{frame.line}"), style="cyan"))
        if len(frames) > MAX_FRAMES_SHOWN:
            page.line(Text(f"    … {count(len(frames) - MAX_FRAMES_SHOWN, 'more frame')}"))
    if len(finding.stacks) > MAX_STACKS_SHOWN:
        page.line(Text(f"  … {count(len(finding.stacks) - MAX_STACKS_SHOWN, 'more stack')} (--json)"))


def short_path(path: str, keep: int = 3, width: int = 48) -> str:
    """Keep the last few parts of a long path, so that a frame fits on one line at 80 columns."""
    if len(path) <= width:
        return path
    parts = path.split("/")
    return "…/" + "/".join(parts[-keep:])
