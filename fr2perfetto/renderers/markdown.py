"""The analysis as GitHub-flavoured Markdown, to paste into a PyTorch, Megatron or torchtitan issue: the
verdict, a table of culprits, each finding with its evidence, the culprit's stack folded away, the
command line and the tool's version."""

from __future__ import annotations

import html

from .. import __version__
from ..diagnose import Diagnosis
from ..job import Job
from ..model import Finding, MatchedOp, ranks_label, state_entry
from ..text import code_block, markdown_text, shown

MAX_FINDINGS = 20
MAX_FRAMES = 12


def _cell(text: object) -> str:
    """Text for a table cell: one line that starts nothing (``markdown_text`` escapes ``|`` too)."""
    return markdown_text(str(text)) or " "


def render_markdown(job: Job, ops: list[MatchedOp], diagnosis: Diagnosis, command: str) -> str:
    """The report, ending with a newline."""
    verdict = diagnosis.verdict
    lines = [
        f"## fr2perfetto verdict: {verdict.status.upper()}",
        "",
        f"**{markdown_text(verdict.summary)}**",
        "",
        f"Root cause: {markdown_text(verdict.category)}.",
        "",
    ]
    if verdict.culprit_ranks:
        lines += ["| rank | host | group | op | seq | state | why |", "| ---: | --- | --- | --- | ---: | --- | --- |"]
        for rank in verdict.culprit_ranks[:32]:
            finding = next((f for f in diagnosis.findings if rank in f.culprit_ranks), None)
            lines.append(_culprit_row(job, ops, rank, finding))
        lines.append("")
    missing = job.missing_ranks
    lines.append(
        f"{len(job.dumps)} dumps read, {len(job.ranks)} ranks, {len(job.groups)} groups, {len(ops)} ops"
        + (f"; no dump from ranks {ranks_label(missing)}" if missing else "")
        + "."
    )
    if diagnosis.notes:
        lines += ["", "From the logs:", ""] + [f"- {markdown_text(note)}" for note in diagnosis.notes]
    if diagnosis.caveats:
        lines += ["", "What these dumps cannot show:", ""] + [f"- {markdown_text(line)}" for line in diagnosis.caveats]
    if diagnosis.findings:
        lines += ["", "### Findings", ""]
    for number, finding in enumerate(diagnosis.findings[:MAX_FINDINGS], start=1):
        culprits = f" (culprit {ranks_label(finding.culprit_ranks)})" if finding.culprit_ranks else ""
        lines.append(f"{number}. **{markdown_text(finding.kind)}**{culprits}: {markdown_text(finding.summary)}")
        lines += [f"   - {markdown_text(line)}" for line in finding.evidence]
        if finding.culprit_frames:
            rank = finding.culprit_ranks[0]
            frames = [f"{f.name} ({f.filename}:{f.line})" for f in finding.culprit_frames[:MAX_FRAMES]]
            lines += [
                "",
                f"   <details><summary>stack of rank {rank} (innermost first)</summary>",
                "",
                *code_block(frames, indent="   "),
                "",
                "   </details>",
                "",
            ]
    hidden = len(diagnosis.findings) - MAX_FINDINGS
    if hidden > 0:
        lines.append(f"… and {hidden} more findings (`--format json` has them all).")
    lines += ["", f"<sub>fr2perfetto {__version__} · <code>{html.escape(shown(command))}</code></sub>", ""]
    return "\n".join(lines)


def _culprit_row(job: Job, ops: list[MatchedOp], rank: int, finding: Finding | None) -> str:
    dump = job.dumps.get(rank)
    host = (dump.host or "") if dump else ""
    if finding is None:
        return f"| {rank} | {_cell(host)} | | | | | |"
    group = f"{finding.group.desc or 'pg ' + finding.group.name} (pg {finding.group.name})" if finding.group else ""
    state = "no dump" if dump is None else ""
    if dump is not None and finding.op_keys:
        op = next((o for o in ops if o.op_key == finding.op_keys[0]), None)
        if op is not None:
            entries = op.entries.get(rank)
            state = state_entry(entries).state if entries else "never issued"
    cells = [str(rank), _cell(host), _cell(group), _cell(finding.op), str(finding.seq), _cell(state)]
    return "| " + " | ".join([*cells, _cell(finding.summary)]) + " |"
