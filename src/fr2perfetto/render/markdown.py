"""The analysis as GitHub-flavoured Markdown, to paste into a PyTorch, Megatron or torchtitan issue: the
verdict, a table of culprits, each finding with its evidence, the culprit's stack folded away, the
command line and the tool's version."""

from __future__ import annotations

import html

from .. import __version__
from ..base.model import Finding, MatchedOp, ops_by_key, ranks_label, state_entry
from ..base.text import code_block, markdown_text, shown
from ..base.words import count, group_called, ranks_text, stacks_said_once
from ..diagnose.verdict import KIND_STRAGGLER, Diagnosis
from ..read.job import Job
from ..read.runs import which_run
from .terminal import Listed

MAX_FINDINGS = 20
MAX_FRAMES = 12
MAX_STACKS = 3  # distinct stacks per finding
MAX_CULPRIT_ROWS = 32


def _cell(text: object) -> str:
    """Text for a table cell: one line that starts nothing (``markdown_text`` escapes ``|`` too)."""
    return markdown_text(str(text)) or " "


def render_markdown(
    job: Job, ops: list[MatchedOp], diagnosis: Diagnosis, command: str, listed: Listed | None = None
) -> str:
    """The report, ending with a newline: the job's verdict and culprits, and the findings ``listed``
    lists (default: the job's first ``MAX_FINDINGS``), each under its number among the job's."""
    listed = listed or Listed.all_of(diagnosis.findings)
    verdict = diagnosis.verdict
    lines = [
        f"## fr2perfetto verdict: {verdict.status.upper()}",
        "",
        f"**{markdown_text(verdict.summary)}**",
        "",
        f"Root cause: {markdown_text(verdict.category)}.",
        "",
    ]
    if listed.scope:
        lines += [f"{markdown_text(listed.scope_line())}.", ""]
    if verdict.culprit_ranks:
        lines += [*_culprit_table(job, ops, diagnosis, verdict.culprit_ranks[:MAX_CULPRIT_ROWS]), ""]
    missing = job.missing_ranks
    lines.append(
        f"{count(len(job.dumps), 'dump')} read, {count(len(job.ranks), 'rank')}, {count(len(job.groups), 'group')}, "
        f"{count(len(ops), 'op')}" + (f"; no dump from {ranks_text(missing)}" if missing else "") + "."
    )
    if job.run:  # the inputs held several runs: the report is of this one
        lines += ["", markdown_text(which_run(job.runs, job.run))]
    if diagnosis.notes:
        lines += ["", "From the logs:", ""] + [f"- {markdown_text(note)}" for note in diagnosis.notes]
    if diagnosis.caveats:
        lines += ["", "What these dumps cannot show:", ""] + [f"- {markdown_text(line)}" for line in diagnosis.caveats]
    if listed.numbered:
        lines += ["", "### Findings", ""]
    lines += _findings(listed)
    if diagnosis.next_steps:
        lines += ["", "### Next", ""] + [f"- {markdown_text(step)}" for step in diagnosis.next_steps]
    lines += ["", f"<sub>fr2perfetto {__version__} · <code>{html.escape(shown(command))}</code></sub>", ""]
    return "\n".join(lines)


def _findings(listed: Listed) -> list[str]:
    """Each finding listed, under its number among the job's, with its evidence and the culprits' stacks
    folded away; then how many more there are."""
    numbered = listed.first(MAX_FINDINGS)
    findings = [finding for _, finding in numbered]
    lines: list[str] = []
    previous = 0
    for (number, finding), stacks in zip(numbered, stacks_said_once(findings, MAX_STACKS), strict=True):
        if previous and number != previous + 1:
            # Markdown numbers a list's items on from its first: a comment ends the list, and the next
            # one starts at this finding's own number
            lines += ["", "<!-- -->", ""]
        previous = number
        culprits = f" (culprit {ranks_label(finding.culprit_ranks)})" if finding.culprit_ranks else ""
        lines.append(f"{number}. **{markdown_text(finding.kind)}**{culprits}: {markdown_text(finding.summary)}")
        lines += [f"   - {markdown_text(line)}" for line in finding.evidence]
        for ranks, frames, earlier in stacks:
            if earlier is not None:  # its number in the list shown; the report names findings as the job does
                lines.append(f"   - stack of {ranks_text(ranks)}: as in finding {numbered[earlier - 1][0]}")
                continue
            listed_frames = [f"{f.name} ({f.filename}:{f.line})" for f in frames[:MAX_FRAMES]]
            lines += [
                "",
                f"   <details><summary>stack of {ranks_text(ranks)} (innermost first)</summary>",
                "",
                *code_block(listed_frames, indent="   "),
                "",
                "   </details>",
                "",
            ]
    hidden = len(listed.numbered) - len(numbered)
    if hidden > 0:
        lines.append(f"… and {count(hidden, 'more finding')} (`--all` or `--format json` has them all).")
    return lines


def _culprit_table(job: Job, ops: list[MatchedOp], diagnosis: Diagnosis, ranks: tuple[int, ...]) -> list[str]:
    """A row per culprit: rank, host (where any source names one), group, op, its state there, why."""
    by_key = ops_by_key(ops, (f.op_keys[0] for f in diagnosis.findings if f.op_keys))
    with_hosts = any(job.host_of(rank) for rank in ranks)
    head = ["rank", *(["host"] if with_hosts else []), "group", "op", "state", "why"]
    rows = ["| " + " | ".join(head) + " |", "| ---: |" + " --- |" * (len(head) - 1)]
    for rank in ranks:
        finding = next((f for f in diagnosis.findings if rank in f.culprit_ranks), None)
        host = [_cell(job.host_of(rank) or "unknown")] if with_hosts else []
        cells = [str(rank), *host, *_culprit_cells(job, by_key, rank, finding)]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _culprit_cells(job: Job, by_key: dict[int, MatchedOp], rank: int, finding: Finding | None) -> list[str]:
    """The group, op, state and why of a culprit's row."""
    if finding is None:
        return ["-", "-", "-", "-"]
    group = f"{group_called(finding.group)} (pg {finding.group.name})" if finding.group else "-"
    why = _cell(finding.summary)
    if finding.kind == KIND_STRAGGLER:
        return [_cell(group), "its collectives", _cell(f"late by {finding.lag_ns / 1e6:.1f} ms (median)"), why]
    dump = job.dumps.get(rank)
    state = "no dump" if dump is None else "-"
    op = by_key.get(finding.op_keys[0]) if finding.op_keys else None
    if dump is not None and op is not None:
        entries = op.entries.get(rank)
        state = state_entry(entries).state if entries else "never issued"
    name = f"{finding.op} #{finding.seq}" if finding.op else "-"
    if op is not None:
        name = op.title
        if op.kind == "p2p" and op.peers and rank in op.peers:  # the culprit's own side of the transfer
            name = op.title_as("send" if rank == op.peers[0] else "recv")
    return [_cell(group), _cell(name), _cell(state), why]
