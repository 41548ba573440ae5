"""The ``fr2perfetto`` command line: a thin typer layer over load -> match -> diagnose -> emit.

Every error a user can cause ends in a one-line message and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import math
import os
import shlex
import signal
import socket
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.cells import cell_len
from rich.console import Console, JustifyMethod
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from . import __version__, api
from .base import cleanup
from .base.encoding import tolerate_any_encoding
from .base.gcpause import gc_paused
from .base.model import Finding, LoadProblem, distinct_values, ranks_label
from .base.speedups import NOT_BUILT, OFF_BECAUSE, SPEEDUPS, TURNED_OFF
from .base.text import shown
from .base.words import count, ranks_text
from .convert import STDOUT, left_out, refuse_output, refuse_to_open
from .diagnose.verdict import exit_code
from .layout.fold import choose_ranks, parse_ranks
from .read.job import Job
from .read.runs import run_argument, which_run
from .render.markdown import render_markdown
from .render.report import build_report, report_json
from .render.terminal import Listed, StandardOutput, render_analysis
from .serve import UI_PORT, link_to, serve_once
from .trigger import signal_ranks, trigger_dumps


def _plain_help() -> None:
    """Help that names what a value is (``--ranks RANKS``), as people write it, not the Python type behind
    it: typer 0.2x prints ``<bool>`` beside every flag, ``<list[str]>`` beside arguments and ``{inputs}``
    in the usage line. Older typers print neither; nothing changes there."""
    core = getattr(typer, "core", None)
    option, argument = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if option is None or argument is None or not hasattr(argument, "_usage_display_name"):
        return
    shown_type = option.display_type_rich
    option.display_type_rich = lambda self, ctx: None if self.is_flag else shown_type(self, ctx)
    argument.display_type_rich = lambda self, ctx: None
    argument._usage_display_name = lambda self: (self.metavar or self.name.upper()) + ("..." if self.nargs != 1 else "")


_plain_help()
app = typer.Typer(
    name="fr2perfetto",
    help="Turn PyTorch Flight Recorder dumps of every rank into one Perfetto trace, and name what hung the job.",
    no_args_is_help=True,
    rich_markup_mode="markdown",  # a paragraph of help is one paragraph, however its source lines break
    pretty_exceptions_enable=False,
)
# No console markup: what is printed holds text from dumps (group names, paths), which must print as is.
# Standard output wraps to the width on a terminal only: piped, a line stays one line (see StandardOutput).
out = StandardOutput(highlight=False, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def _error(message: str) -> None:
    err.print(Text.assemble(("error", "bold red"), ": ", shown(message)))


def _chosen_format(as_json: bool, output_format: str) -> str:
    """The verdict's format that ``--json`` and ``--format`` ask for together (text, markdown or json);
    a format that is none of them, or ``--json`` beside another, ends the command with exit 2."""
    if output_format not in ("text", "markdown", "json"):
        _error(f"--format: {output_format!r} is none of text, markdown, json")
        raise typer.Exit(EXIT_UNUSABLE)
    if as_json and output_format not in ("text", "json"):
        _error(f"--json and --format {output_format} ask for two formats: give one")
        raise typer.Exit(EXIT_UNUSABLE)
    return "json" if as_json else output_format


def _warning(message: str) -> None:
    err.print(Text.assemble(("warning", "yellow"), ": ", shown(message)))


EXIT_UNUSABLE = 2  # the exit codes of a verdict: ``verdict.exit_code``
# What a shell reports for a command ended by SIGPIPE (128 + 13), as `git log | head` ends
EXIT_READER_LEFT = 141
# A bug in fr2perfetto (an exception no command expects): EX_SOFTWARE of sysexits.h, "an internal software
# error". Its own code, so that a script acting on `analyze` never takes a bug for a finding (1) or for
# input it cannot use (2); 70 is none of the verdict's codes (0-3), nor 128 + a signal.
EXIT_INTERNAL_ERROR = 70
ISSUES_URL = "https://github.com/fr2perfetto/fr2perfetto/issues"
# For tests only: set to 1, every command fails at its start as a bug would (see ``_root``), to check how one ends.
FORCE_INTERNAL_ERROR = "FR2PERFETTO_FORCE_INTERNAL_ERROR"
# How every command can end besides its own codes, at the end of each one's --help (README: Exit codes).
_EVERY_ENDING = (
    "70 internal error (a bug: one line says where its traceback is saved), 130 interrupted (Ctrl-C), "
    "128 + N stopped by signal N (143 SIGTERM, 129 SIGHUP), 141 standard output closed early (| head)."
)


def _exit_codes(own: str) -> str:
    """The paragraph of a command's --help that lists its exit codes: its own, then those of every command."""
    return f"Exit codes: {own}, {_EVERY_ENDING}"


# Set by ``main``, which ends the process with os._exit: what the commands read stays here rather
# than being freed object by object when they return (half a second for 256 ranks x 2000 entries).
_kept_until_exit: list[object] | None = None


def _keep_until_exit(*objects: object) -> None:
    """Let ``objects`` live until the process ends, when run as the console script (a no-op when
    the app is called in-process, as by tests, where they must be freed as usual)."""
    if _kept_until_exit is not None:
        _kept_until_exit.extend(objects)


Inputs = Annotated[
    list[str],
    typer.Argument(
        help="Dump files, folders of dumps, archives or glob patterns.", metavar="DUMPS", show_default=False
    ),
]
Jobs = Annotated[
    int,
    typer.Option(
        "--jobs",
        "-j",
        min=0,
        metavar="N",
        show_default=False,
        help="Processes that read and write in parallel (when not given: one per core).",
    ),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print only errors.")]
QuietVerdict = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the verdict's line (and errors).")]
Redact = Annotated[
    bool,
    typer.Option(
        "--redact",
        help="Replace every name from the dumps that is not PyTorch's own (hosts, directories, group names, "
        "threads, the script's functions and files) with placeholders, to share publicly.",
    ),
]
KeepNames = Annotated[
    bool, typer.Option("--keep-names", help="With --redact: keep the training script's function and file names.")
]
Logs = Annotated[
    list[str] | None,
    typer.Option(
        "--logs",
        metavar="PATH",
        show_default=False,
        help="Log files or folders of the job (logs beside the dumps are read anyway); may be repeated.",
    ),
]
RunName = Annotated[
    str | None,
    typer.Option(
        "--run",
        metavar="NAME",
        show_default=False,
        help="Where the dumps hold several runs of the job (info lists them): read this one, by name, "
        "number (1: the newest) or folder, rather than the newest.",
    ),
]
MaxDumpSize = Annotated[
    float, typer.Option("--max-dump-size", metavar="MB", help="Refuse, unread, dump files over this many MB.")
]
MAX_MEGABYTES = 1 << 20  # a terabyte: a limit beyond it is no limit, and a number to overflow


def _megabytes(value: float, flag: str) -> int:
    """A size limit given in MB, as bytes; one line and exit 2 for what is no size."""
    if not (math.isfinite(value) and 0 < value <= MAX_MEGABYTES):
        _error(f"{flag}: {value:g} is not a size in MB (a finite number above 0, at most {MAX_MEGABYTES})")
        raise typer.Exit(EXIT_UNUSABLE)
    return max(1, int(value * 2**20))


def _load(
    inputs: list[str],
    jobs: int,
    quiet: bool,
    redact: bool = False,
    max_dump_mb: float = 1024,
    keep_names: bool = False,
    logs: list[str] | None = None,
    run: str | None = None,
) -> Job:
    """Load the dumps (``api.load``; of one run, where they hold several), report each bad file in one
    line, and stop when nothing could be read."""
    if keep_names and not redact:
        # refused, not ignored: who asks to keep some names meant to redact the rest, and would share them all
        _error("--keep-names only applies with --redact (it keeps the script's names as the rest is redacted): "
               "add --redact, or leave --keep-names out")  # fmt: skip
        raise typer.Exit(EXIT_UNUSABLE)
    _megabytes(max_dump_mb, "--max-dump-size")
    options = {"jobs": jobs or (os.cpu_count() or 1), "max_dump_mb": max_dump_mb, "redact": redact,
               "keep_names": keep_names, "logs": logs, "run": run}  # fmt: skip
    try:
        if quiet or not err.is_terminal:
            job = api.load(inputs, **options)  # type: ignore[arg-type]
        else:
            with Progress(
                TextColumn("reading dumps"), BarColumn(), MofNCompleteColumn(), console=err, transient=True
            ) as bar:
                task = bar.add_task("read", total=None)
                job = api.load(
                    inputs,
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                    **options,  # type: ignore[arg-type]
                )
    except api.NoDumps as failed:
        _say(failed.problems, quiet)
        if not any(problem.fatal for problem in failed.problems):  # else each input's line said why already
            _error("no dump could be read from " + ("the inputs" if redact else ", ".join(inputs)))
        raise typer.Exit(EXIT_UNUSABLE) from None
    _say(job.problems, quiet)
    return job


def _say(problems: list[LoadProblem], quiet: bool) -> None:
    """Each input that could not be read (an error), or only in part (a warning, not with --quiet)."""
    for problem in problems:
        if quiet and not problem.fatal:
            continue
        (_error if problem.fatal else _warning)(str(problem))


def _as_given(inputs: list[str], redact: bool, job: Job) -> list[str]:
    """How the dumps were named, for the commands a report suggests: with ``--run`` where the inputs
    hold several runs, so that each command reads the run analysed."""
    given = ["<dumps>"] if redact else list(inputs)
    names = [info.name for info in job.runs]
    if job.run in names:
        given += ["--run", run_argument(job.runs, names.index(job.run))]
    return given


def _chosen_ranks(ranges: list[tuple[int, int]] | None, job: Job) -> set[int] | None:
    """The ranks ``--ranks`` chose; one line and exit 2 when it asks for a rank the job does not have."""
    if ranges is None:
        return None
    chosen, refused = choose_ranks(ranges, job.ranks)
    if refused:
        _error(f"--ranks: {refused}")
        raise typer.Exit(EXIT_UNUSABLE)
    return chosen


def _chosen_groups(text: str | None, job: Job) -> set[str] | None:
    """The group names or descriptions ``--groups`` chose; one line and exit 2 for one the job lacks."""
    if text is None:
        return None
    asked = {part.strip() for part in text.split(",") if part.strip()}
    known = {name for group in job.groups for name in (group.name, group.desc) if name}
    unknown = sorted(asked - known)
    if unknown or not asked:
        names = ", ".join(sorted({g.desc or g.name for g in job.groups}))
        what = f"no group {', '.join(unknown)} in this job" if unknown else "no group given"
        _error(f"--groups: {what} (its groups, by description or name: {names})")
        raise typer.Exit(EXIT_UNUSABLE)
    return asked


@app.command(
    epilog="Examples:\n\n  fr2perfetto convert dumps/ -o crash.pftrace\n\n"
    "  fr2perfetto convert 'dumps/nccl_trace_rank_*' -o crash.pftrace\n\n"
    + _exit_codes(
        "0 trace written (whatever the verdict: analyze exits by it), 2 unusable input, a wrong option, or a "
        "trace that cannot be written or served (--open)"
    )
)
def convert(
    inputs: Inputs,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help="Trace to write: .pftrace (Perfetto) or .json (Chrome), either maybe .gz; - for standard output.",
        ),
    ] = Path("trace.pftrace"),
    full: Annotated[bool, typer.Option("--full", help="Write every op of every rank, however large.")] = False,
    ranks: Annotated[
        str | None,
        typer.Option(
            "--ranks", metavar="RANKS", help="Only these ranks, e.g. 0-7,85 (never folded).", show_default=False
        ),
    ] = None,
    groups: Annotated[
        str | None,
        typer.Option(
            "--groups", metavar="GROUPS", help="Only these groups, by name or desc, e.g. tp,0.", show_default=False
        ),
    ] = None,
    window: Annotated[
        int | None,
        typer.Option(
            "--window",
            min=1,
            metavar="N",
            show_default=False,
            help="Keep the last N ops of each group before its first problem.",
        ),
    ] = None,
    max_size_mb: Annotated[
        float, typer.Option("--max-size", metavar="MB", help="Fold the trace to stay under this many MB.")
    ] = 256,
    open_ui: Annotated[bool, typer.Option("--open", help="Open the trace in ui.perfetto.dev when written.")] = False,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, metavar="PORT", help="Local port for --open.")
    ] = UI_PORT,
    redact: Redact = False,
    keep_names: KeepNames = False,
    jobs: Jobs = 0,
    quiet: Quiet = False,
    max_dump_mb: MaxDumpSize = 1024,
    logs: Logs = None,
    run: RunName = None,
) -> None:
    """Write one Perfetto trace of every rank: a process per rank, a track per process group.

    A job whose trace would pass --max-size is folded: identical ranks share a process and old
    history is summarised, never what the findings name. --full writes everything.
    """
    try:
        rank_ranges = parse_ranks(ranks) if ranks is not None else None
    except ValueError as error:
        _error(f"--ranks: {error}")
        raise typer.Exit(EXIT_UNUSABLE) from None
    max_bytes = _megabytes(max_size_mb, "--max-size")
    refused = refuse_output(str(output), [*inputs, *(logs or [])])
    if refused:
        _error(f"{output}: {refused}")
        raise typer.Exit(EXIT_UNUSABLE)
    to_stdout = str(output) == STDOUT
    if to_stdout and open_ui:
        _error("--open needs a trace file, not standard output (-o -)")
        raise typer.Exit(EXIT_UNUSABLE)
    quiet = quiet or to_stdout
    with gc_paused():
        job = _load(inputs, jobs, quiet, redact, max_dump_mb, keep_names, logs, run)
        chosen_ranks = _chosen_ranks(rank_ranges, job)
        chosen_groups = _chosen_groups(groups, job)
        report = api.analyze(job, inputs=_as_given(inputs, redact, job))
        analysis = report._analysis
        assert analysis is not None  # analyze() always keeps it: said for type checkers
        _keep_until_exit(job, report)
        try:
            stats, view = api.write_trace(
                job, str(output), report=report, full=full, ranks=chosen_ranks, groups=chosen_groups,
                window=window, max_size_mb=max_size_mb, jobs=jobs or (os.cpu_count() or 1),
            )  # fmt: skip
        except OSError as error:
            _error(f"{output}: cannot write the trace ({error.strerror or error})")
            raise typer.Exit(EXIT_UNUSABLE) from None
    size = 0 if to_stdout else os.path.getsize(output)
    if size > max_bytes and not full:
        _warning(
            f"{output}: {_human_size(size)}, over --max-size {max_size_mb:g} MB by {_human_size(size - max_bytes)}: "
            "what the findings are about is never folded away; choose less with --ranks, --groups or --window"
        )
    hidden = left_out(analysis, chosen_ranks, chosen_groups)
    if hidden is not None:  # as the size warning: what the trace lacks is said whatever --quiet asks
        _warning(hidden)
    if not quiet:
        verdict = analysis.diagnosis.verdict
        out.print(
            f"Wrote {shown(str(output))} ({_human_size(size)}): {count(len(job.ranks), 'rank')} in "
            f"{count(stats.processes, 'process', 'processes')}, {count(len(job.groups), 'group')}, "
            f"{count(stats.tracks, 'track')}, {count(stats.slices, 'op')}, {count(stats.flows, 'flow')}, "
            f"{count(stats.markers, 'marker')}, {count(len(analysis.diagnosis.findings), 'finding')}."
        )
        if job.run:
            out.print(shown(which_run(job.runs, job.run)))
        out.print(f"Verdict: {shown(verdict.summary)}")
        if view.to_fit:
            out.print(
                f"Folded to stay under {max_size_mb:g} MB (everything: about {_human_size(view.full_bytes)}): "
                + shown("; ".join(view.notes))
                + ". Use --full for everything, or --ranks, --groups, --window to choose."
            )
        elif view.folded:
            out.print("Shown: " + shown("; ".join(view.notes)) + ".")
        if not open_ui:
            out.print(f"Open it: fr2perfetto open {shown(str(output))}  (or drop it on https://ui.perfetto.dev)")
    if open_ui:
        _open(str(output), quiet, port)


def _open(path: str, quiet: bool, port: int = UI_PORT) -> None:
    # Only what sshd sets says the shell is remote (and its browser elsewhere): a local shell with no
    # display (a container, a console) is no remote shell, and told to forward a port it would be misled.
    remote = any(os.environ.get(name) for name in ("SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY"))

    def announce(link: str, opened: bool) -> None:
        if opened and not quiet:
            out.print("Opening the trace in your browser; serving it once from 127.0.0.1 (Ctrl-C stops).")
        elif not opened and remote:
            served = link.split("127.0.0.1:", 1)[1].split("/", 1)[0] if "127.0.0.1:" in link else port
            out.print(
                f"This is a remote shell. On your own machine, forward the port first:\n"
                f"  ssh -L {served}:127.0.0.1:{served} {socket.gethostname()}",
                soft_wrap=True,
            )
            out.print(f"Open this link in a browser there (Ctrl-C stops):\n{link}", soft_wrap=True)
        elif not opened:
            out.print(
                f"No browser could be opened here: open this link in a browser on this machine (Ctrl-C stops):\n{link}",
                soft_wrap=True,
            )

    try:
        fetched = serve_once(path, port=port, announce=announce,
                             open_browser=(lambda _: False) if remote else None)  # fmt: skip
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            holder = " (another fr2perfetto open, or trace_processor --httpd?)" if port == UI_PORT else ""
            _error(f"cannot serve {path}: port {port} on 127.0.0.1 is in use{holder}: stop what holds it, or choose "
                   "another port with --port PORT")  # fmt: skip
        else:
            _error(f"cannot serve {path} on 127.0.0.1:{port} ({error.strerror or error})")
        raise typer.Exit(EXIT_UNUSABLE) from None
    if not quiet:
        out.print("The UI fetched the trace; server stopped." if fetched else "Stopped.")


@app.command("open", epilog="Examples:\n\n  fr2perfetto open crash.pftrace\n\n"
             "  fr2perfetto open crash.pftrace --url https://example.org/traces/crash.pftrace\n\n"
             + _exit_codes("0 the UI fetched the trace (with --url: the link printed), 2 no trace there, a wrong "
                           "option, or the port in use"))  # fmt: skip
def open_command(
    trace: Annotated[
        Path, typer.Argument(help="A trace written by fr2perfetto convert.", metavar="TRACE", show_default=False)
    ],
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, metavar="PORT", help="Local port (the UI fetches from 9001).")
    ] = UI_PORT,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only errors and the link to open.")] = False,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            metavar="URL",
            help="Where the trace is served already (by a server that lets ui.perfetto.dev fetch it): print "
            "the link that opens it there, at its first problem, and serve nothing.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Open a trace in ui.perfetto.dev at its first problem: serve it once from 127.0.0.1 and open the
    browser at it (over SSH: print the port forwarding to set up, and the link)."""
    if not trace.is_file():
        _error(f"{trace}: no such file")
        raise typer.Exit(EXIT_UNUSABLE)
    refused = refuse_to_open(str(trace))
    if refused:
        _error(f"{trace}: {refused}")
        raise typer.Exit(EXIT_UNUSABLE)
    if url is not None:
        if not url.startswith(("https://", "http://")):
            _error(f"--url: {url!r} is not an http(s) address")
            raise typer.Exit(EXIT_UNUSABLE)
        out.print(link_to(url, str(trace)), soft_wrap=True)
        return
    _open(str(trace), quiet, port)


RIGHT_ALIGNED = {"rank", "entries", "size"}


def _table_width(widths: list[int]) -> int:
    """How wide a table is whose columns hold ``widths`` characters: a bar and two spaces beside each."""
    return 1 + sum(3 + width for width in widths)


def _kept_columns(
    columns: list[str], natural: dict[str, int], room: int, droppable: tuple[str, ...], then: tuple[str, ...]
) -> list[str]:
    """The columns a table keeps in ``room`` characters: the ``droppable`` ones are left out, in that
    order, while the table would wrap a cell; then, while even each whole header on one line would not
    fit, those in ``then`` and after them the others from the right. The first column kept (what a row
    is of) stays, however narrow the room."""
    kept = list(columns)
    for candidate in droppable:
        if _table_width([natural[c] for c in kept]) <= room:
            break
        if candidate in kept:
            kept.remove(candidate)
    for candidate in [*then, *reversed(kept[1:])]:
        if _table_width([cell_len(c) for c in kept]) <= room:
            break
        if candidate in kept[1:]:
            kept.remove(candidate)
    return kept


def _column_widths(kept: list[str], natural: dict[str, int], room: int) -> dict[str, int]:
    """The width of each kept column: its widest cell where the table fits ``room``; else the widest
    columns narrowed first (their cells wrap), none below its header, which stays whole on one line."""
    widths = {column: natural[column] for column in kept}
    excess = _table_width(list(widths.values())) - room
    while excess > 0:
        narrowable = [c for c in kept if widths[c] > cell_len(c)]
        if not narrowable:
            break  # a room narrower than the first header: rich crops what is left
        widest = max(narrowable, key=lambda c: widths[c])
        widths[widest] -= 1
        excess -= 1
    return widths


def _fitting_table(
    title: str,
    columns: list[str],
    rows: list[list[str | Text]],
    droppable: tuple[str, ...],
    then: tuple[str, ...] = (),
) -> Table:
    """A table that fits the terminal: cells wrap, each header stays whole on one line, and columns are
    left out while it would still be too wide (``droppable``, then ``then``: see ``_kept_columns``; its
    caption names them). Every text cell is ``shown``: it holds names from the dumps."""
    rows = [[cell if isinstance(cell, Text) else shown(cell) for cell in row] for row in rows]
    # the width each column takes unwrapped: its widest cell (or header)
    natural = {
        column: max([cell_len(column)] + [cell_len(str(row[index])) for row in rows])
        for index, column in enumerate(columns)
    }
    kept = _kept_columns(columns, natural, out.width, droppable, then)
    # rich narrows columns below their headers' width to fit (and then crops the table): the widths are set here
    widths = _column_widths(kept, natural, out.width)
    table = Table(title=title, title_justify="left", caption_justify="left")
    for column in kept:
        justify: JustifyMethod = "right" if column in RIGHT_ALIGNED else "left"
        table.add_column(column, justify=justify, width=widths[column], overflow="fold")
    for row in rows:
        table.add_row(*(cell for column, cell in zip(columns, row, strict=True) if column in kept))
    left_out = [c for c in columns if c not in kept]
    if left_out:
        table.caption = f"left out to fit {out.width} columns: {', '.join(left_out)}"
    return table


@app.command(
    epilog="Example:\n\n  fr2perfetto info dumps/\n\n" + _exit_codes("0 listed, 2 unusable input or a wrong option")
)
def info(
    inputs: Inputs,
    jobs: Jobs = 0,
    max_dump_mb: MaxDumpSize = 1024,
    redact: Redact = False,
    keep_names: KeepNames = False,
    run: RunName = None,
) -> None:
    """A quick look before converting: ranks, hosts, versions, groups, entries, time ranges (and, where
    the dumps hold several runs of the job, the runs: the rest is of one)."""
    with gc_paused():
        job = _load(inputs, jobs, False, redact, max_dump_mb, keep_names, run=run)
        _keep_until_exit(job)
    if job.runs:
        _print_runs(job)
    # each rank's first and last enqueue, read from its columns (no entry made), one rank's times held at once
    created: dict[int, tuple[int, int]] = {}
    for rank, read in job.dumps.items():
        times = distinct_values(read.entries, "time_created_ns")
        if times:
            created[rank] = (min(times), max(times))
    all_times = [first for first, _ in created.values()]
    day = _clock(min(all_times))[:10] if all_times else ""
    with_hosts = any(job.host_of(rank) for rank in job.ranks)
    with_endings = bool(job.endings)
    columns = ["rank", *(["host"] if with_hosts else []), "file", "version", "format", "backend", "entries",
               "first op", "last op", *(["ended"] if with_endings else [])]  # fmt: skip
    rows: list[list[str | Text]] = []
    dumpless: list[int] = []  # ranks in a row without a dump, nor anything else to say: one row for them all

    def say_dumpless() -> None:
        if dumpless:
            host = [""] if with_hosts else []
            ended = [""] if with_endings else []
            rows.append([ranks_label(dumpless), *host, Text("no dump", style="red"), "", "", "", "", "", "", *ended])
            dumpless.clear()

    for rank in job.ranks:
        dump = job.dumps.get(rank)
        host = [job.host_of(rank) or ""] if with_hosts else []
        ended = [job.endings.get(rank, "")] if with_endings else []
        if dump is None:
            if not any(host + ended) and (not dumpless or dumpless[-1] == rank - 1):
                dumpless.append(rank)
                continue
            say_dumpless()
            if not any(host + ended):
                dumpless.append(rank)
                continue
            rows.append([str(rank), *host, Text("no dump", style="red"), "", "", "", "", "", "", *ended])
            continue
        say_dumpless()
        backends = ",".join(sorted(distinct_values(dump.entries, "backend"))) or "-"
        span = created.get(rank)
        first, last = (_clock(span[0])[11:23], _clock(span[1])[11:23]) if span else ("", "")
        rows.append([str(rank), *host, os.path.basename(dump.path), dump.version, dump.file_format, backends,
                     str(len(dump.entries)), first, last, *ended])  # fmt: skip
    say_dumpless()
    title = f"{count(len(job.dumps), 'dump')}, {count(len(job.ranks), 'rank')}, {day} (times UTC)"
    droppable = ("backend", "format", "version", "first op", "host")  # how a rank ended stays: it may be why
    # where even the headers would not fit: the file (or "no dump") says most after the rank and its ending
    out.print(_fitting_table(title, columns, rows, droppable=droppable, then=("entries", "last op", "file")))
    group_rows: list[list[str | Text]] = []
    for group in job.groups:
        dumped = sum(1 for r in group.members if r in job.dumps)
        group_rows.append(
            [group.name, group.desc, str(len(group.members)), group.members_label, f"{dumped}/{len(group.members)}"]
        )
    group_columns = ["group", "desc", "size", "members", "with a dump"]
    out.print(_fitting_table(count(len(job.groups), "process group"), group_columns, group_rows, droppable=("size",)))
    missing = job.missing_ranks
    out.print(f"Missing dumps: {'ranks ' + ranks_label(missing) if missing else 'none'}")


def _print_runs(job: Job) -> None:
    """The runs the dumps hold, newest first, the one read marked; what follows is of that one."""
    rows = []
    for place, info in enumerate(job.runs, start=1):
        folders = info.folders[0] if len(info.folders) == 1 else f"{info.folders[0]} and {len(info.folders) - 1} more"
        mark = Text("yes", style="bold") if info.name == job.run else ""
        rows.append([str(place), info.name, ranks_label(info.ranks), str(len(info.files)), folders or ".",
                     info.when, mark])  # fmt: skip
    title = f"{count(len(job.runs), 'run')} in these dumps (newest first); below, run {job.run} (--run picks another)"
    columns = ["#", "run", "ranks", "dumps", "folder", "last op", "read"]
    out.print(_fitting_table(title, columns, rows, droppable=("folder", "#")))


def _clock(ns: int) -> str:
    """Wall-clock time of a timestamp, UTC, to the microsecond."""
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


@app.command(
    epilog="Example:\n\n  fr2perfetto trigger /tmp/fr_dumps\n\n"
    + _exit_codes("0 at least one rank asked, 2 no rank to ask there or a wrong option")
)
def trigger(
    folder: Annotated[
        Path,
        typer.Argument(help="The folder given to fr2perfetto.capture.configure.", metavar="FOLDER", show_default=False),
    ],
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=100, metavar="N", help="How many times to ask.")] = 3,
    every: Annotated[
        float, typer.Option("--every", min=0.0, max=3600.0, metavar="SECONDS", help="Seconds between rounds.")
    ] = 2.0,
) -> None:
    """Ask every running rank to dump now: the ranks of a job set up with fr2perfetto.capture on this host
    (by their dump signal; each also writes where its threads are), and NCCL ranks anywhere through
    PyTorch's debug pipes in FOLDER. Several rounds, seconds apart, so that the stack snapshots show
    which rank stays where."""
    problems: list[str] = []
    signalled: set[int] = set()
    written: set[str] = set()
    for number in range(rounds):
        signalled.update(signal_ranks(str(folder), None, problems))
        written.update(trigger_dumps(str(folder), problems))
        if number == 0 and not signalled and not written:
            break
        if number + 1 < rounds:
            time.sleep(every)
    for problem in dict.fromkeys(problems):
        _warning(problem)
    if not signalled and not written:
        _error(
            f"{folder}: no rank to ask there: no rank file of a running capture on this host, and no NCCL rank's "
            "debug pipe open (is the job running with fr2perfetto.capture?)"
        )
        raise typer.Exit(EXIT_UNUSABLE)
    asked = len(signalled) + len(written)
    times = f", {rounds} times {every:g} s apart" if rounds > 1 else ""
    out.print(f"Asked {asked} {'rank' if asked == 1 else 'ranks'} to dump into {shown(str(folder))}{times}.")


# PyTorch's own warning (torch/distributed/debug/__init__.py, start_debug_server), repeated where it matters.
_TRUSTED_NETWORKS = (
    "WARNING (PyTorch's): the debug server is intended to be used only in trusted network environments. It is "
    "not designed to be secure and should not be exposed to the public internet."
)
_WATCH_HELP = (
    "Watch a running job and name the stuck rank while it still hangs, long before a watchdog fires.\n\n"
    "Every --every seconds each rank's Flight Recorder is read from PyTorch's debug server "
    "(torch.distributed.debug.start_debug_server, in the training script after init_process_group), and a live "
    "line says how many ranks answer, the groups, ops per second, the rank furthest behind and how long since "
    "the job last moved; a rank that stops answering is said at once. When no rank has moved for --stall "
    "seconds, every rank's Flight Recorder and stacks are taken twice, a few seconds apart, into --out (in the "
    "names analyze reads), the verdict is printed as analyze prints it, and the trace is written beside it. "
    "Only read-only requests, at most 4 at once, each bounded in time and size; nothing an answer says is run.\n\n"
    + _TRUSTED_NETWORKS
)


@app.command(
    "watch",
    help=_WATCH_HELP,
    epilog="Examples:\n\n  fr2perfetto watch http://node0:25999\n\n"
    "  fr2perfetto watch http://node0:25999 --stall 120 --json --out /shared/hang\n\n"
    "  fr2perfetto watch /shared/debug_dumps --keep-going --on-hang 'notify-oncall --report'\n\n"
    + _exit_codes(
        "0 the job ended (its servers went away, or every rank's .ended file says exit), 1 a hang caught (its "
        "verdict printed, its evidence kept), or a rank that ended on an error of its own, 2 not a debug server, "
        "a job that never started, or a wrong option"
    ),
)
def watch_command(
    targets: Annotated[
        list[str],
        typer.Argument(
            metavar="TARGET",
            show_default=False,
            help="The debug server's address (http://HOST:25999, its frontend on rank 0), or its workers' "
            "addresses (rank order, or RANK=URL), or a folder it writes its periodic dumps into (dump_dir).",
        ),
    ],
    stall: Annotated[
        float,
        typer.Option(
            "--stall",
            min=0.5,
            max=86400.0,
            metavar="SECONDS",
            help="Take the evidence once no rank has moved for this long: longer than the job ever goes without "
            "a collective (a checkpoint, an evaluation).",
        ),
    ] = 60.0,
    every: Annotated[
        float,
        typer.Option(
            "--every",
            min=0.2,
            max=3600.0,
            metavar="SECONDS",
            help="Ask each rank where it stands this often (a request per rank, at most 4 at once).",
        ),
    ] = 5.0,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            max=600.0,
            metavar="SECONDS",
            help="Give each request this long, all of it: a rank slower than that is said not to answer.",
        ),
    ] = 10.0,
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            min=0.0,
            max=86400.0,
            metavar="SECONDS",
            help="Wait this long for a job that is not up yet (its debug server, or its folder).",
        ),
    ] = 120.0,
    out_folder: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="FOLDER",
            show_default=False,
            help="Where a hang's evidence, report and trace go (default: fr2perfetto-hang-YYYYmmdd-HHMMSS here).",
        ),
    ] = None,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", help="After a hang, watch on: the next one once the job moves again.")
    ] = False,
    max_answer_mb: Annotated[
        float,
        typer.Option("--max-answer", metavar="MB", help="Read at most this much of any answer (a rank's recorder)."),
    ] = 256,
    on_hang: Annotated[
        str | None,
        typer.Option(
            "--on-hang",
            metavar="CMD",
            show_default=False,
            help=(
                "Run this command on each hang, the report's path appended (its words split as a shell splits"
                " them, then run without a shell)."
            ),
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a hang's report as JSON (as analyze --json), nothing else.")
    ] = False,
    output_format: Annotated[
        str, typer.Option("--format", metavar="FORMAT", help="The verdict as text, markdown or json (as --json).")
    ] = "text",
) -> None:
    from .live import Hang, Settings, Status, WatchError, watch_job
    from .live.show import LiveLine, run_hook, show_hang

    output_format = _chosen_format(as_json, output_format)
    command: list[str] = []
    if on_hang is not None:
        try:
            command = shlex.split(on_hang)
        except ValueError as error:
            _error(f"--on-hang: {error}")
            raise typer.Exit(EXIT_UNUSABLE) from None
        if not command:
            _error("--on-hang: no command given")
            raise typer.Exit(EXIT_UNUSABLE)
    gc.enable()  # a watch runs for days: what it no longer needs is freed as it goes
    line = LiveLine(err)

    def status(shown_status: Status) -> None:
        line.show(shown_status)

    def caught(hang: Hang) -> None:
        line.stop()
        show_hang(hang, output_format, out, err)
        if command:
            run_hook(command, hang, err)

    settings = Settings(stall=stall, every=every, timeout=timeout, wait=wait, keep_going=keep_going,
                        out=str(out_folder) if out_folder is not None else None,
                        max_bytes=_megabytes(max_answer_mb, "--max-answer"))  # fmt: skip
    try:
        outcome = watch_job(targets, settings, on_status=status, on_event=line.say, on_hang=caught)
    except WatchError as error:
        line.stop()
        _error(str(error))
        raise typer.Exit(EXIT_UNUSABLE) from None
    finally:
        line.stop()
    (err if output_format != "text" else out).print(Text(shown(outcome.summary)), soft_wrap=True)
    raise typer.Exit(outcome.code)


def _rank_ranges(text: str | None) -> list[tuple[int, int]] | None:
    """``--ranks`` as ranges of ranks (None: not given); one line and exit 2 where it is no list of ranks."""
    if text is None:
        return None
    try:
        return parse_ranks(text)
    except ValueError as error:
        _error(f"--ranks: {error}")
        raise typer.Exit(EXIT_UNUSABLE) from None


def _narrowed(findings: list[Finding], ranks: set[int] | None, groups: set[str] | None) -> list[tuple[int, Finding]]:
    """The findings (each with its number among them, from 1) that involve or blame one of ``ranks`` and
    lie in one of ``groups`` (by name or description); None: that does not narrow them. A finding about
    no rank, or in no group, is then about none of those asked for."""
    numbered = list(enumerate(findings, start=1))
    if ranks is not None:
        numbered = [(n, f) for n, f in numbered if ranks.intersection(f.ranks) or ranks.intersection(f.culprit_ranks)]
    if groups is not None:
        numbered = [(n, f) for n, f in numbered if f.group is not None and {f.group.name, f.group.desc} & groups]
    return numbered


def _scope(ranks: set[int] | None, groups: set[str] | None) -> str:
    """What narrowed the findings, for the report to say: ``findings of ranks 2-3 in group tp only (--ranks,
    --groups)``; empty where nothing did."""
    if ranks is None and groups is None:
        return ""
    words = ["findings"]
    if ranks is not None:
        words.append("of " + ranks_text(sorted(ranks)))
    if groups is not None:
        words.append(("in group " if len(groups) == 1 else "in groups ") + ", ".join(sorted(groups)))
    flags = ", ".join(flag for flag, given in (("--ranks", ranks), ("--groups", groups)) if given is not None)
    return " ".join(words) + f" only ({flags})"


@app.command(
    epilog="Examples:\n\n  fr2perfetto analyze dumps/\n\n  fr2perfetto analyze dumps/ --json > report.json\n\n"
    "  fr2perfetto analyze dumps/ --ranks 4-7 --all\n\n"
    + _exit_codes(
        "0 healthy, 1 a problem found (hang, mismatch, crash or slow), 2 unusable input or a wrong option, "
        "3 undecided (what is missing to decide is said)"
    )
)
def analyze(
    inputs: Inputs,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (schema: proto/) and nothing else.")
    ] = False,
    output_format: Annotated[
        str,
        typer.Option(
            "--format",
            metavar="FORMAT",
            help="text (for a terminal), markdown (to paste into an issue) or json (the same as --json).",
        ),
    ] = "text",
    redact: Redact = False,
    keep_names: KeepNames = False,
    jobs: Jobs = 0,
    quiet: QuietVerdict = False,
    max_dump_mb: MaxDumpSize = 1024,
    logs: Logs = None,
    run: RunName = None,
    ranks: Annotated[
        str | None,
        typer.Option(
            "--ranks",
            metavar="RANKS",
            show_default=False,
            help="Only the findings that involve these ranks, e.g. 0-7,85 (the verdict and exit code stay the job's).",
        ),
    ] = None,
    groups: Annotated[
        str | None,
        typer.Option(
            "--groups",
            metavar="GROUPS",
            show_default=False,
            help="Only the findings in these groups, by name or desc, e.g. tp,0.",
        ),
    ] = None,
    everything: Annotated[
        bool, typer.Option("--all", help="Every finding, not only the first 12 (20 with --format markdown).")
    ] = False,
) -> None:
    """Name the rank, the process group and the op that hung the job, with the evidence."""
    output_format = _chosen_format(as_json, output_format)
    as_json = output_format == "json"
    plain = as_json or output_format == "markdown"
    rank_ranges = _rank_ranges(ranks)
    with gc_paused():
        job = _load(inputs, jobs, quiet or plain, redact, max_dump_mb, keep_names, logs, run)
        chosen_ranks = _chosen_ranks(rank_ranges, job)
        chosen_groups = _chosen_groups(groups, job)
        given = _as_given(inputs, redact, job)
        report = api.analyze(job, inputs=given)
        _keep_until_exit(job, report)
    analysis = report._analysis
    assert analysis is not None
    diagnosis = analysis.diagnosis
    listed = Listed(
        _narrowed(diagnosis.findings, chosen_ranks, chosen_groups),
        len(diagnosis.findings),
        _scope(chosen_ranks, chosen_groups),
        everything,
    )
    if output_format == "markdown":
        asked = [("--ranks", ranks), ("--groups", groups), ("--all", "" if everything else None)]
        narrowing = [f"{flag} {shlex.quote(value)}".strip() for flag, value in asked if value is not None]
        command = " ".join(["fr2perfetto analyze", *given, "--format markdown", *(["--redact"] if redact else []),
                            *narrowing])  # fmt: skip
        sys.stdout.write(render_markdown(job, analysis.ops, diagnosis, command, listed))
    elif as_json:
        # Narrowed as the other formats are: --ranks and --groups choose what is reported, in any format. The
        # verdict stays the job's; the schema has no field to say so, and whoever passed the flags knows.
        shown_only = dataclasses.replace(diagnosis, findings=[finding for _, finding in listed.numbered])
        sys.stdout.write(report_json(build_report(job, analysis.ops, shown_only)) + "\n")
    elif not quiet:
        render_analysis(out, job, diagnosis, len(analysis.ops), listed)
    else:
        out.print(shown(diagnosis.verdict.summary))
    raise typer.Exit(exit_code(report.status))


def _human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size} B"


def _version(value: bool) -> None:
    """The version, whether the C speed-ups are on and, where they are off, why and how to get them."""
    if not value:
        return
    if SPEEDUPS is not None or OFF_BECAUSE == TURNED_OFF:
        out.print(f"fr2perfetto {__version__} (C speed-ups {'on' if SPEEDUPS is not None else 'off: ' + TURNED_OFF})")
        raise typer.Exit()
    out.print(f"fr2perfetto {__version__} (C speed-ups off: {shown(OFF_BECAUSE)})")
    # Not built is by far the usual case; and a wheel that pip built without a compiler stays in its cache,
    # to be installed again once one is there.
    how = (
        "They build at install time where a C compiler and Python's headers are present, unless pip reuses a "
        "wheel it cached from an install without them. With both present:"
        if OFF_BECAUSE == NOT_BUILT
        else "They were built for another Python or system. With a C compiler and Python's headers present, "
        "build them again:"
    )
    out.print(
        f"Pure Python gives the same results, slower. {how}\n  {_rebuild_command()}",
        soft_wrap=True,  # the command stays on one line, to copy
    )
    raise typer.Exit()


def _rebuild_command() -> str:
    """The pip command that builds fr2perfetto again, from source and into this Python, from where it was
    installed (PEP 610's direct_url.json: a folder, a VCS, an sdist), else from the package index; never
    from a wheel in pip's cache. Paths in it are ``shown``: they come from the installed metadata."""
    import importlib.metadata
    import json

    command = [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir"]
    source = ["--no-binary", "fr2perfetto", f"fr2perfetto=={__version__}"]
    with contextlib.suppress(Exception):  # metadata that cannot be read: the index's sdist, as above
        origin = json.loads(importlib.metadata.distribution("fr2perfetto").read_text("direct_url.json") or "{}")
        url = str(origin.get("url", ""))
        if "dir_info" in origin and url.startswith("file://"):
            from urllib.parse import unquote, urlparse

            folder = unquote(urlparse(url).path)
            source = ["-e", folder] if origin["dir_info"].get("editable") else [folder]
        elif "vcs_info" in origin:
            vcs = origin["vcs_info"]
            source = [f"{vcs['vcs']}+{url}@{vcs['commit_id']}"]
        elif url.endswith((".tar.gz", ".zip")):  # an sdist (a wheel from there would be the one built without)
            source = [url]
    return shown(shlex.join([*command, *source]))


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """fr2perfetto: Flight Recorder dumps to Perfetto traces and a verdict."""
    if os.environ.get(FORCE_INTERNAL_ERROR, "") not in ("", "0"):
        raise RuntimeError(f"{FORCE_INTERNAL_ERROR} is set: the internal error it asks for, to test how one ends")


def _stopped(signum: int, _frame: object) -> None:
    """SIGTERM (Slurm, ``timeout``), SIGHUP or Ctrl-C: remove partial files, kill the workers, and end
    at once (a signal can land where an exception would be ignored, so nothing waits for unwinding)."""
    cleanup.abandon()
    with contextlib.suppress(Exception):
        message = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    os._exit(128 + signum)


class _OutputFailed(Exception):
    """Standard output could not be written: a full disk, a pipe closed by its reader."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        # `fr2perfetto analyze dumps | head` is not a failure worth a line: the reader has what it wanted
        self.reader_left = isinstance(error, BrokenPipeError)


class _Guarded:
    """Standard output (text or its binary ``buffer``) whose write failures end the command in one line,
    exit 2, rather than as an OSError a command might take for its own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        try:
            return self._stream.write(data)  # type: ignore[no-any-return]
        except OSError as error:
            raise _OutputFailed(error) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            raise _OutputFailed(error) from None

    @property
    def buffer(self) -> _Guarded:
        return _Guarded(self._stream.buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _usage_error(error: Exception) -> int:
    """A command-line mistake (an unknown option, a value of the wrong type) in one line; the help
    when no command was given."""
    message = error.format_message() if hasattr(error, "format_message") else str(error)
    if type(error).__name__ == "NoArgsIsHelpError":
        sys.stdout.write(message + "\n")
        return EXIT_UNUSABLE
    command = getattr(getattr(error, "ctx", None), "command_path", "fr2perfetto")
    _error(f"{' '.join(message.split())} (see {command} --help)")
    return EXIT_UNUSABLE


def _internal_error(error: BaseException) -> int:
    """A bug: one line on standard error that says where to report it and where its traceback is, never
    the traceback itself (a person reading a verdict needs one line, the report needs it all)."""
    if isinstance(error, typer.Abort) and error.__cause__ is not None:
        error = error.__cause__  # typer's stand-in for an EOFError: the EOFError is the bug
    try:
        saved = f"with the traceback saved in {shown(_save_traceback(error))}"
    except Exception as failed:  # a full or read-only temp folder: the line still says what happened
        reason = failed.strerror if isinstance(failed, OSError) and failed.strerror else type(failed).__name__
        saved = f"the traceback could not be saved ({shown(reason)}): set TMPDIR to a writable folder and run it again"
    err.print(f"fr2perfetto {__version__}: internal error ({shown(type(error).__name__)}): please report it at "
              f"{ISSUES_URL}, {saved}")  # fmt: skip
    return EXIT_INTERNAL_ERROR


def _save_traceback(error: BaseException) -> str:
    """Write what a bug report needs (version, Python, platform, command line, traceback) to a new file in
    the temp folder, and return its path. ``mkstemp`` makes it private (mode 0600: paths and names from
    the dumps may be in it) and never opens an existing file or a link planted under its name."""
    import platform

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    handle, path = tempfile.mkstemp(prefix=f"fr2perfetto-crash-{stamp}-", suffix=".txt")
    speedups = "on" if SPEEDUPS is not None else f"off: {OFF_BECAUSE}"
    lines = [
        f"fr2perfetto {__version__}: internal error, {stamp} UTC; please report it at {ISSUES_URL}",
        "(it may hold paths and names from the dumps: look before sharing it)",
        "",
        f"command: {shlex.join(['fr2perfetto', *sys.argv[1:]])}",
        f"python: {sys.version.split()[0]} ({sys.executable}) on {platform.platform()}",
        f"C speed-ups: {speedups}",
        "",
        *"".join(traceback.format_exception(error)).splitlines(),
    ]
    with os.fdopen(handle, "w", encoding="utf-8", errors="backslashreplace") as file:
        # escaped as on a terminal: whoever runs `cat` on it gets no control sequence from an exception's text
        file.write("\n".join(shown(line) for line in lines) + "\n")
    return path


def main() -> None:
    """Entry point of the console script: every ending is an exit code and at most one line on stderr.

    A command is one run over what can be millions of long-lived objects: the cyclic collector stays
    off for the whole process (turned back on, its first pass would walk every one of them), and the
    process ends without tearing the interpreter down (freeing them one by one takes a second or
    more that the system does at once).
    """
    global _kept_until_exit
    gc.disable()
    _kept_until_exit = []
    for stop in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(stop, _stopped)
    tolerate_any_encoding(sys.stdout)
    tolerate_any_encoding(sys.stderr)
    sys.stdout = _Guarded(sys.stdout)
    code: int
    try:
        try:
            result = app(standalone_mode=False)
            code = result if isinstance(result, int) else 0
        except KeyboardInterrupt:
            err.print("interrupted")
            code = 130
        except _OutputFailed:
            raise
        except Exception as error:
            # a click exception has an exit code; anything else is a bug
            code = _usage_error(error) if hasattr(error, "exit_code") else _internal_error(error)
        sys.stdout.flush()
    except _OutputFailed as failed:
        if failed.reader_left:
            code = EXIT_READER_LEFT
        else:
            _error(f"cannot write to standard output ({failed})")
            code = EXIT_UNUSABLE
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)
