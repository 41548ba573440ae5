"""fr2perfetto from Python: what the command line does, for a program that acts on a verdict.

A job manager that wants to drain the culprit's host, or restart the job without it, reads the dumps,
asks for the verdict and decides::

    import fr2perfetto

    job = fr2perfetto.load("/shared/fr_dumps")
    report = fr2perfetto.analyze(job, inputs="/shared/fr_dumps")
    if report.status == "hang":
        drain(report.culprit_hosts)            # the hosts the dumps, or the capture helper, name
    fr2perfetto.write_trace(job, "hang.pftrace", report=report)
    Path("report.json").write_text(report.to_json())   # what ``fr2perfetto analyze --json`` prints

Nothing here prints; a file that cannot be read is in ``Job.problems`` (and ``Report.problems``), and
only when no dump at all could be read does ``load`` raise ``NoDumps``. Paths may be given as ``str``
or ``pathlib.Path``, one alone or a list of them.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .base.gcpause import gc_paused
from .base.model import Finding as _Finding
from .base.model import LoadProblem
from .convert import Analysis, analyse
from .convert import write_trace as _write_trace
from .diagnose.next_steps import next_steps
from .diagnose.verdict import HEALTHY
from .layout.fold import DEFAULT_MAX_BYTES, View, plan_view
from .proto import fr2perfetto_report_pb2 as _report_pb2
from .read.job import Job, load_job
from .read.runs import run_argument
from .render.perfetto import TraceStats
from .render.report import build_report, report_json

if TYPE_CHECKING:  # the watch imports this module: imported where it is called
    from .live.progress import Status

__all__ = [
    "Culprit", "Job", "NoDumps", "Report", "ReportFinding", "TraceStats", "analyze", "load", "watch", "write_trace",
]  # fmt: skip

# What the functions take for a path, or for several: ``load("dumps")`` and ``load(["a", Path("b")])``.
# A list is invariant to type checkers (a ``list[str]`` is no ``list[str | PathLike[str]]``): the usual
# lists are each named, so that a caller's list of paths type-checks as it runs.
_Path = str | os.PathLike[str]
PathOrPaths = _Path | list[str] | list[pathlib.Path] | list[os.PathLike[str]] | list[_Path] | tuple[_Path, ...]


class NoDumps(ValueError):
    """None of the inputs held a dump that could be read; ``problems`` says why, input by input."""

    def __init__(self, problems: list[LoadProblem]) -> None:
        lines = [str(problem) for problem in problems]
        super().__init__("no dump could be read" + (": " + "; ".join(lines[:3]) if lines else ""))
        self.problems = problems


@dataclass(frozen=True)
class Culprit:
    """A rank to blame, where it runs (None: nothing read says), and why (its first finding's summary)."""

    rank: int
    host: str | None
    why: str


@dataclass(frozen=True)
class ReportFinding:
    """One thing wrong with the job: its kind (``missing``, ``p2p``, ``deadlock``, ``size_mismatch``, ...,
    ``straggler``), its one-line summary, the evidence, the ranks to blame, and the op it is about."""

    kind: str
    summary: str
    evidence: tuple[str, ...]
    culprit_ranks: tuple[int, ...]
    group: str | None  # the process group's description, e.g. ``tp``; its name where it has none
    op: str  # e.g. ``all_reduce``; empty where the finding is about no single op
    seq: int


@dataclass(frozen=True)
class Report:
    """The verdict on a job. ``status``: ``hang``, ``mismatch``, ``crash``, ``slow``, ``undecided`` or
    ``healthy``; ``culprits`` most likely first; ``findings`` in the order the verdict weighs them (the
    first is the verdict's headline).

    ``to_dict()`` and ``to_json()`` give the whole report exactly as ``fr2perfetto analyze DUMPS --json``
    prints it (schema: ``proto/fr2perfetto_report.proto``), which holds more than these attributes do
    (the verdict's evidence, stacks, log events, the job's summary, its runs). Where each attribute is
    in it, for ``d = report.to_dict()`` (protobuf's JSON mapping leaves out a field at its default:
    ``d["verdict"].get("culprit_ranks", [])``, ``d.get("job", {}).get("run", "")``)::

        status             d["verdict"]["status"]
        summary            d["verdict"]["summary"]
        root_cause         d["verdict"]["category"]
        culprits[i].rank   d["verdict"]["culprit_ranks"][i]
        culprits[i].why    the "summary" of the first of d["findings"] whose "culprit_ranks" hold it
        culprits[i].host   not in the JSON: from the dumps, or the capture helper's rank files
        findings[i]        d["findings"][i], in the same order: kind, summary, evidence, culprit_ranks,
                           op and seq alike; .group is ["group"]["desc"], or ["group"]["name"] where
                           the group has no description
        next_steps         d["next_steps"]
        problems[i]        f'{p["path"]}: {p["reason"]}' for p = d["input_problems"][i]
        run                d["job"]["run"]
    """

    status: str
    summary: str
    root_cause: str
    culprits: tuple[Culprit, ...]
    findings: tuple[ReportFinding, ...]
    next_steps: tuple[str, ...]
    problems: tuple[str, ...]  # the inputs that could not be read, or only in part, one line each
    run: str = ""  # the run analysed, where the inputs held several (``Job.runs``); "" where one
    _analysis: Analysis | None = field(default=None, repr=False, compare=False)
    # The message the CLI prints, made with the rest, so that it is of the job as analysed whatever is
    # done with the job afterwards (it costs well under a millisecond for a thousand ranks).
    _message: _report_pb2.Report | None = field(default=None, repr=False, compare=False)

    @property
    def healthy(self) -> bool:
        """Nothing is wrong in the dumps, and nothing beside them says otherwise."""
        return self.status == HEALTHY and not self.findings

    @property
    def culprit_hosts(self) -> list[str]:
        """The hosts of the culprits whose host is known, most likely first, each once."""
        return list(dict.fromkeys(c.host for c in self.culprits if c.host))

    def to_json(self) -> str:
        """The report as JSON: the text ``fr2perfetto analyze DUMPS --json`` prints, less its final newline
        (protobuf's JSON mapping of ``proto/fr2perfetto_report.proto``, indented by 2, with the schema's
        field names; a field at its default is left out, and int64 fields such as ``time_ns`` are strings).
        Its next steps name the dumps as ``analyze`` was given them in ``inputs``: the paths given to
        ``load`` give the very text of the command line. Raises ``ValueError`` for a ``Report`` that
        ``analyze`` did not make (one built by hand has no report behind it)."""
        if self._message is None:
            raise ValueError("only a Report made by fr2perfetto.analyze() holds the whole report")
        return report_json(self._message)

    def to_dict(self) -> dict[str, Any]:
        """The report as ``json.loads`` reads what ``fr2perfetto analyze DUMPS --json`` prints: the same keys
        and values (see ``to_json``), a new object at each call."""
        # Parsed from the very text the CLI prints, rather than made by protobuf's MessageToDict, so that
        # the two cannot drift apart.
        report: dict[str, Any] = json.loads(self.to_json())
        return report


def _paths(given: PathOrPaths, what: str) -> list[str]:
    """A path, or a list or tuple of paths (``str`` or ``os.PathLike``), as a list of strings; ``TypeError``
    naming ``what`` for anything else."""
    if isinstance(given, (str, os.PathLike)):
        given = [given]  # one path, not a sequence of one-letter paths
    if not isinstance(given, (list, tuple)) or not all(isinstance(p, (str, os.PathLike)) for p in given):
        raise TypeError(f"{what} takes a path or a list of paths, not {type(given).__name__}")
    return [os.fspath(p) for p in given]


def load(
    paths: PathOrPaths,
    *,
    jobs: int | None = None,
    logs: PathOrPaths | None = None,
    redact: bool = False,
    keep_names: bool = False,
    max_dump_mb: float = 1024,
    progress: Callable[[int, int], None] | None = None,
    run: str | None = None,
) -> Job:
    """Read every dump the ``paths`` name (files, folders searched through, archives, globs), with the
    stack snapshots and logs among them and in ``logs``. ``jobs``: reading processes (None: one per
    core); ``redact``: names replaced by placeholders, to share (``keep_names``: the training script's
    function and file names kept); ``progress(done, total)`` as files are read. Where the paths hold
    several runs of the job, the newest is read, or the one ``run`` names (its name in ``Job.runs``,
    its place there from 1, or its folder); ``Job.run`` says which. What could not be read, and each
    run left out, is in ``Job.problems``; raises ``NoDumps`` when no dump could be read (or ``run``
    names none). ``paths`` and ``logs``: a path (``str`` or ``pathlib.Path``) or a list of them;
    ``TypeError`` for anything else."""
    inputs = _paths(paths, "load()")
    log_paths = _paths(logs, "load(logs=...)") if logs is not None else None
    job = load_job(inputs, jobs=jobs, progress=progress, max_dump_bytes=max(1, int(max_dump_mb * 2**20)),
                   redact=redact, keep_names=keep_names, logs=log_paths, run=run)  # fmt: skip
    if not job.dumps:
        raise NoDumps(job.problems)
    return job


@gc_paused()
def analyze(job: Job, *, inputs: PathOrPaths | None = None) -> Report:
    """The verdict on a loaded job. ``inputs``: how the dumps were named (a path or a list, as given to
    ``load``), for the commands in the next steps (default: the placeholder ``<dumps>``, as
    ``analyze --redact`` shows them); where the job is one of several runs, ``--run`` and the run are
    added to them, as the command line does. With the paths given to ``load``, ``to_dict()`` and
    ``to_json()`` are what ``fr2perfetto analyze PATHS --json`` prints."""
    if not isinstance(job, Job):
        raise TypeError(f"analyze() takes the Job that load() returns, not {type(job).__name__}")
    given = _paths(inputs, "analyze(inputs=...)") if inputs is not None else []
    analysis = analyse(job)
    diagnosis = analysis.diagnosis
    diagnosis.next_steps = next_steps(job, diagnosis, _with_run(job, given))
    verdict = diagnosis.verdict
    culprits = tuple(Culprit(rank, job.host_of(rank), _why(diagnosis.findings, rank)) for rank in verdict.culprit_ranks)
    return Report(
        status=verdict.status,
        summary=verdict.summary,
        root_cause=verdict.category,
        culprits=culprits,
        findings=tuple(_finding(f) for f in diagnosis.findings),
        next_steps=tuple(diagnosis.next_steps),
        problems=tuple(str(problem) for problem in job.problems),
        run=job.run,
        _analysis=analysis,
        _message=build_report(job, analysis.ops, diagnosis),
    )


@gc_paused()
def write_trace(
    job: Job,
    path: str | os.PathLike[str],
    *,
    report: Report | None = None,
    full: bool = False,
    ranks: Iterable[int] | None = None,
    groups: str | Iterable[str] | None = None,
    window: int | None = None,
    max_size_mb: float = DEFAULT_MAX_BYTES / 2**20,
    jobs: int = 1,
) -> tuple[TraceStats, View]:
    """Write the trace of ``job`` to ``path`` (``str`` or ``pathlib.Path``; ``.pftrace`` or ``.json``,
    either maybe ``.gz``; ``-``: standard output): a process per rank, folded to stay under
    ``max_size_mb`` unless ``full``; ``ranks`` (any iterable of ints), ``groups`` (a name or
    description, or several), ``window`` (ops kept before each group's first problem) choose by hand.
    ``report``: the job's ``analyze`` result, reused rather than made again (``ValueError`` for a report
    of another job). ``jobs`` > 1 writes in that many forked processes (Linux). Returns what was
    written, and what was shown (``View.notes``: what was folded, and why)."""
    if not isinstance(job, Job):
        raise TypeError(f"write_trace() takes the Job that load() returns, not {type(job).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"write_trace() takes a path to write, not {type(path).__name__}")
    analysis = report._analysis if report is not None else None
    if analysis is not None and analysis.job is not job:
        raise ValueError("write_trace(): the report is of another job (analyze(job) gives this job's)")
    if analysis is None:
        analysis = analyse(job)
    # A name alone is one group, not the set of its letters (``"tp"`` is not ``{"t", "p"}``).
    chosen_groups = {groups} if isinstance(groups, str) else set(groups) if groups is not None else None
    view = plan_view(job, analysis.ops, analysis.diagnosis.findings, max_bytes=max(1, int(max_size_mb * 2**20)),
                     full=full, ranks=set(ranks) if ranks is not None else None, groups=chosen_groups,
                     window=window)  # fmt: skip
    return _write_trace(analysis, os.fspath(path), view, jobs=jobs), view


def watch(
    target: str | os.PathLike[str] | list[str],
    *,
    stall: float = 60.0,
    on_progress: Callable[[Status], None] | None = None,
    on_hang: Callable[[Report, str], None] | None = None,
    every: float = 5.0,
    timeout: float = 10.0,
    wait: float = 120.0,
    out: str | os.PathLike[str] | None = None,
    keep_going: bool = False,
) -> Report | None:
    """Watch a running job until it ends, or hangs: what ``fr2perfetto watch`` does. ``target``: the address
    of PyTorch's debug server (``http://HOST:25999``, its frontend on rank 0), its workers' addresses (a
    list, in rank order, or ``RANK=URL``), or a folder its periodic dumps (``dump_dir``) go into. Every
    rank is asked where it stands every ``every`` seconds (a few requests at once, each within
    ``timeout``); ``on_progress(status)`` after each round (``status.line()`` is the live line,
    ``status.events`` what changed: a rank that stopped answering). When no rank has moved for ``stall``
    seconds, every rank's Flight Recorder and stacks are taken, twice, into ``out`` (default: a new
    ``fr2perfetto-hang-<time>`` folder here) and analysed as ``analyze`` would: ``on_hang(report,
    folder)``, and the report is returned (None: no rank's Flight Recorder could be taken). With
    ``keep_going``, the watch goes on once the job moves again, and returns the last hang's report when
    the job ends; None when it ended without one. ``ValueError`` (``fr2perfetto.live.WatchError``) for a
    target that is no debug server, or that never answered within ``wait`` seconds.

    The debug server is meant for trusted networks only (PyTorch's warning); the watch sends it read-only
    requests, bounded in number, time and size, and runs nothing it answers."""
    from .live.watcher import Hang, Settings, watch_job

    targets = [os.fspath(t) for t in target] if isinstance(target, list) else [os.fspath(target)]
    for name, value in (("stall", stall), ("every", every), ("timeout", timeout), ("wait", wait)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
            raise ValueError(f"watch(): {name} is {value!r}, not a number of seconds")
    settings = Settings(stall=float(stall), every=max(0.2, float(every)), timeout=max(0.1, float(timeout)),
                        wait=float(wait), out=os.fspath(out) if out is not None else None,
                        keep_going=keep_going)  # fmt: skip

    def caught(hang: Hang) -> None:
        if on_hang is not None and hang.report is not None:
            on_hang(hang.report, hang.folder)

    outcome = watch_job(targets, settings, on_status=on_progress, on_hang=caught)
    reports = [hang.report for hang in outcome.hangs if hang.report is not None]
    return reports[-1] if reports else None


def _with_run(job: Job, inputs: list[str]) -> list[str]:
    """The inputs, with ``--run`` and the run analysed where the job is one of several runs, so that each
    command of the next steps reads that run; as they are where they say it already (the command line
    passes them so)."""
    names = [info.name for info in job.runs]
    if job.run not in names or "--run" in inputs:
        return inputs
    return [*(inputs or ["<dumps>"]), "--run", run_argument(job.runs, names.index(job.run))]


def _why(findings: list[_Finding], rank: int) -> str:
    return next((f.summary for f in findings if rank in f.culprit_ranks), "")


def _finding(finding: _Finding) -> ReportFinding:
    group = finding.group
    return ReportFinding(
        kind=finding.kind,
        summary=finding.summary,
        evidence=tuple(finding.evidence),
        culprit_ranks=tuple(finding.culprit_ranks),
        group=(group.desc or group.name) if group is not None else None,
        op=finding.op,
        seq=finding.seq,
    )
