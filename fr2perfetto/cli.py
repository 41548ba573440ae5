"""The ``fr2perfetto`` command line: a thin typer layer over load -> match -> diagnose -> emit.

Every error a user can cause ends in a one-line message and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from . import __version__
from .convert import analyse, write_trace
from .diagnose import HEALTHY
from .fold import parse_ranks, plan_view
from .job import Job, load_job
from .renderers.terminal import render_analysis
from .report import build_report, report_json

app = typer.Typer(
    name="fr2perfetto",
    help="Turn PyTorch Flight Recorder dumps of every rank into one Perfetto trace, and name what hung the job.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_OK, EXIT_FINDINGS, EXIT_UNUSABLE = 0, 1, 2

Inputs = Annotated[
    list[str], typer.Argument(help="Dump files, directories of dumps, or glob patterns.", show_default=False)
]
Jobs = Annotated[int, typer.Option("--jobs", "-j", help="Processes that read dumps in parallel (default: all cores).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print only errors (and the report with --json).")]


def _load(inputs: list[str], jobs: int, quiet: bool) -> Job:
    """Load the dumps, report each bad file in one line, and stop when nothing could be read."""
    job = load_job(inputs, jobs=jobs or (os.cpu_count() or 1))
    for problem in job.problems:
        if quiet and not problem.fatal:
            continue
        level = "error" if problem.fatal else "warning"
        err.print(f"[bold red]{level}[/]: {problem}" if problem.fatal else f"[yellow]{level}[/]: {problem}")
    if not job.dumps:
        err.print("[bold red]error[/]: no dump could be read from " + ", ".join(inputs))
        raise typer.Exit(EXIT_UNUSABLE)
    return job


@app.command(
    epilog="Examples:\n\n  fr2perfetto convert dumps/ -o crash.pftrace\n\n"
    "  fr2perfetto convert 'dumps/nccl_trace_rank_*' -o crash.pftrace"
)
def convert(
    inputs: Inputs,
    output: Annotated[Path, typer.Option("--output", "-o", help="Trace file to write.")] = Path("trace.pftrace"),
    full: Annotated[bool, typer.Option("--full", help="Write every op of every rank, however large.")] = False,
    ranks: Annotated[
        str | None, typer.Option("--ranks", help="Only these ranks, e.g. 0-7,85 (never folded).", show_default=False)
    ] = None,
    groups: Annotated[
        str | None, typer.Option("--groups", help="Only these groups, by name or desc, e.g. tp,0.", show_default=False)
    ] = None,
    window: Annotated[
        int | None,
        typer.Option(
            "--window", min=1, help="Keep the last N ops of each group before its first problem.", show_default=False
        ),
    ] = None,
    max_size_mb: Annotated[
        float, typer.Option("--max-size", min=0.001, help="Fold the trace to stay under this many MB.")
    ] = 256,
    jobs: Jobs = 0,
    quiet: Quiet = False,
) -> None:
    """Write one Perfetto trace of every rank: a process per rank, a track per process group.

    A job whose trace would pass --max-size is folded: identical ranks share a process and old
    history is summarised, never what the findings name. --full writes everything.
    """
    try:
        chosen_ranks = parse_ranks(ranks) if ranks is not None else None
    except ValueError as error:
        err.print(f"[bold red]error[/]: --ranks: {error}")
        raise typer.Exit(EXIT_UNUSABLE) from None
    job = _load(inputs, jobs, quiet)
    analysis = analyse(job)
    view = plan_view(
        job, analysis.ops, analysis.diagnosis.findings, max_bytes=int(max_size_mb * 1024 * 1024), full=full,
        ranks=chosen_ranks, groups=set(groups.split(",")) if groups else None, window=window,
    )  # fmt: skip
    try:
        stats = write_trace(analysis, str(output), view)
    except OSError as error:
        err.print(f"[bold red]error[/]: {output}: cannot write the trace ({error.strerror or error})")
        raise typer.Exit(EXIT_UNUSABLE) from None
    if not quiet:
        size = os.path.getsize(output)
        verdict = analysis.diagnosis.verdict
        out.print(
            f"Wrote [bold]{output}[/] ({_human_size(size)}): {len(job.ranks)} ranks in {stats.processes} processes, "
            f"{len(job.groups)} groups, {stats.tracks} tracks, {stats.slices} ops, {stats.flows} flows, "
            f"{stats.markers} markers, "
            f"{len(analysis.diagnosis.findings)} findings."
        )
        out.print(f"Verdict: {verdict.summary}")
        if view.folded:
            out.print(
                f"Folded to stay under {max_size_mb:g} MB (everything: about {_human_size(view.full_bytes)}): "
                + "; ".join(view.notes)
                + ". Use --full for everything, or --ranks, --groups, --window to choose."
            )
        out.print("Open it at https://ui.perfetto.dev (Open trace file), or run: fr2perfetto analyze for the details.")


@app.command(
    epilog="Examples:\n\n  fr2perfetto analyze dumps/\n\n  fr2perfetto analyze dumps/ --json > report.json\n\n"
    "Exit codes: 0 healthy, 1 findings, 2 unusable input."
)
def analyze(
    inputs: Inputs,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (schema: proto/) and nothing else.")
    ] = False,
    jobs: Jobs = 0,
    quiet: Quiet = False,
) -> None:
    """Name the rank, the process group and the op that hung the job, with the evidence."""
    job = _load(inputs, jobs, quiet or as_json)
    analysis = analyse(job)
    diagnosis = analysis.diagnosis
    if as_json:
        sys.stdout.write(report_json(build_report(job, analysis.ops, diagnosis)) + "\n")
    elif not quiet:
        render_analysis(out, job, diagnosis, len(analysis.ops))
    else:
        out.print(diagnosis.verdict.summary)
    healthy = diagnosis.verdict.status == HEALTHY and not diagnosis.findings
    raise typer.Exit(EXIT_OK if healthy else EXIT_FINDINGS)


def _human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size} B"


def _version(value: bool) -> None:
    if value:
        out.print(f"fr2perfetto {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """fr2perfetto: Flight Recorder dumps to Perfetto traces and a verdict."""


def main() -> None:
    """Entry point of the console script; turns Ctrl-C into a one-line message."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
