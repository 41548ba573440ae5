"""What ``fr2perfetto watch`` shows and runs: the live line (rich's live display on a terminal, a line per
round otherwise), each event on a line of its own at once, a hang's verdict in the format asked for (the
renderers ``analyze`` uses), and the ``--on-hang`` command. Every string from the job passes ``shown``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..base.text import shown
from ..render.markdown import render_markdown
from ..render.terminal import Listed, render_analysis
from .progress import Status
from .watcher import Hang

HOOK_WAIT = 60.0  # seconds the watch waits for the --on-hang command before it goes on without it


class LiveLine:
    """The watch's live line on ``console`` (standard error): redrawn in place on a terminal, printed once
    a round otherwise, each line with its local time; events above it, each on a line of its own."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None

    def show(self, status: Status) -> None:
        line = status.line()
        if not self.console.is_terminal:
            self.console.print(f"{_clock()} {line}", soft_wrap=True)
            return
        if self.live is None:
            self.live = Live(console=self.console, transient=True, auto_refresh=False, redirect_stdout=False,
                             redirect_stderr=False)  # fmt: skip
            self.live.start()
        self.live.update(Text(line, style="dim", no_wrap=False, overflow="fold"), refresh=True)

    def say(self, event: str) -> None:
        self.console.print(Text(f"{_clock()} {shown(event)}"), soft_wrap=True)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def show_hang(hang: Hang, output_format: str, out: Console, err: Console) -> None:
    """A hang's verdict on standard output, as ``analyze`` prints it (``text``, ``markdown`` or ``json``),
    then where its evidence, report and trace are (on standard error when the output is JSON or Markdown,
    to keep standard output one document)."""
    notes = err if output_format != "text" else out
    report = hang.report
    analysis = report._analysis if report is not None else None
    if report is None or analysis is None:
        err.print(Text(f"no verdict: {shown('; '.join(hang.problems))}"), soft_wrap=True)
    else:
        job, diagnosis = analysis.job, analysis.diagnosis
        listed = Listed.all_of(diagnosis.findings)
        if output_format == "json":
            sys.stdout.write(report.to_json() + "\n")
        elif output_format == "markdown":
            command = f"fr2perfetto analyze {shlex.quote(hang.folder)} --format markdown"
            sys.stdout.write(render_markdown(job, analysis.ops, diagnosis, command, listed))
        else:
            render_analysis(out, job, diagnosis, len(analysis.ops), listed)
        for problem in hang.problems:
            err.print(Text.assemble(("warning", "yellow"), ": ", shown(problem)), soft_wrap=True)
    parts = [f"Evidence: {hang.folder}"]
    if hang.report_path:
        parts.append(f"report: {hang.report_path}")
    if hang.trace_path:
        parts.append(f"trace: {hang.trace_path} (fr2perfetto open {shlex.quote(hang.trace_path)})")
    notes.print(Text(shown("; ".join(parts))), soft_wrap=True)
    sys.stdout.flush()


def run_hook(command: list[str], hang: Hang, err: Console) -> None:
    """Run ``--on-hang``: ``command`` (split as a shell would, run by no shell) with the report's path
    appended (the folder's, where no report was written). Its output goes to standard error; the watch
    waits ``HOOK_WAIT`` seconds for it at most, then leaves it running."""
    argument = hang.report_path or hang.folder
    try:
        process = subprocess.Popen([*command, argument], stdin=subprocess.DEVNULL, stdout=2)
    except OSError as error:
        _warn(err, f"--on-hang: cannot run {command[0]} ({error.strerror or error})")
        return
    try:
        code = process.wait(timeout=HOOK_WAIT)
    except subprocess.TimeoutExpired:
        _warn(err, f"--on-hang: {command[0]} still runs after {HOOK_WAIT:.0f} s: left running")
        return
    if code != 0:
        _warn(err, f"--on-hang: {command[0]} exited with status {code}")


def _warn(err: Console, message: str) -> None:
    err.print(Text.assemble(("warning", "yellow"), ": ", shown(message)), soft_wrap=True)
