"""fr2perfetto from Python: what the command line does, for a program that acts on a verdict.

A job manager that wants to drain the culprit's host, or restart the job without it, reads the dumps,
asks for the verdict and decides::

    import fr2perfetto

    job = fr2perfetto.load(["/shared/fr_dumps"])
    report = fr2perfetto.analyze(job)
    if report.status == "hang":
        drain(report.culprit_hosts)            # the hosts the dumps, or the capture helper, name
    fr2perfetto.write_trace(job, "hang.pftrace")

Nothing here prints; a file that cannot be read is in ``Job.problems`` (and ``Report.problems``), and
only when no dump at all could be read does ``load`` raise ``NoDumps``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from .base.model import Finding as _Finding
from .base.model import LoadProblem
from .convert import Analysis, analyse
from .convert import write_trace as _write_trace
from .diagnose.next_steps import next_steps
from .diagnose.verdict import HEALTHY
from .layout.fold import DEFAULT_MAX_BYTES, View, plan_view
from .read.job import Job, load_job
from .render.perfetto import TraceStats

__all__ = ["Culprit", "Job", "NoDumps", "Report", "ReportFinding", "TraceStats", "analyze", "load", "write_trace"]


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
    first is the verdict's headline)."""

    status: str
    summary: str
    root_cause: str
    culprits: tuple[Culprit, ...]
    findings: tuple[ReportFinding, ...]
    next_steps: tuple[str, ...]
    problems: tuple[str, ...]  # the inputs that could not be read, or only in part, one line each
    run: str = ""  # the run analysed, where the inputs held several (``Job.runs``); "" where one
    _analysis: Analysis | None = field(default=None, repr=False, compare=False)

    @property
    def healthy(self) -> bool:
        """Nothing is wrong in the dumps, and nothing beside them says otherwise."""
        return self.status == HEALTHY and not self.findings

    @property
    def culprit_hosts(self) -> list[str]:
        """The hosts of the culprits whose host is known, most likely first, each once."""
        return list(dict.fromkeys(c.host for c in self.culprits if c.host))


def load(
    paths: str | os.PathLike[str] | list[str | os.PathLike[str]],
    *,
    jobs: int | None = None,
    logs: list[str] | None = None,
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
    names none). A single path may be passed as it is."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]  # one path, not a sequence of one-letter paths
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise TypeError(f"load() takes a path or a list of paths, not {type(paths).__name__}")
    paths = [os.fspath(p) for p in paths]
    job = load_job(paths, jobs=jobs, progress=progress, max_dump_bytes=max(1, int(max_dump_mb * 2**20)),
                   redact=redact, keep_names=keep_names, logs=logs, run=run)  # fmt: skip
    if not job.dumps:
        raise NoDumps(job.problems)
    return job


def analyze(job: Job, *, inputs: list[str] | None = None) -> Report:
    """The verdict on a loaded job. ``inputs``: how the dumps were named, for the commands in the next
    steps (default: a placeholder)."""
    if not isinstance(job, Job):
        raise TypeError(f"analyze() takes the Job that load() returns, not {type(job).__name__}")
    analysis = analyse(job)
    diagnosis = analysis.diagnosis
    diagnosis.next_steps = next_steps(job, diagnosis, inputs or [])
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
    )


def write_trace(
    job: Job,
    path: str,
    *,
    report: Report | None = None,
    full: bool = False,
    ranks: set[int] | None = None,
    groups: set[str] | None = None,
    window: int | None = None,
    max_size_mb: float = DEFAULT_MAX_BYTES / 2**20,
    jobs: int = 1,
) -> tuple[TraceStats, View]:
    """Write the trace of ``job`` to ``path`` (``.pftrace`` or ``.json``, either maybe ``.gz``; ``-``:
    standard output): a process per rank, folded to stay under ``max_size_mb`` unless ``full``;
    ``ranks``, ``groups`` (by name or description), ``window`` (ops kept before each group's first
    problem) choose by hand. ``report``: the job's ``analyze`` result, reused rather than made again.
    ``jobs`` > 1 writes in that many forked processes (Linux). Returns what was written, and what was
    shown (``View.notes``: what was folded, and why)."""
    analysis = report._analysis if report is not None and report._analysis is not None else analyse(job)
    view = plan_view(job, analysis.ops, analysis.diagnosis.findings, max_bytes=max(1, int(max_size_mb * 2**20)),
                     full=full, ranks=ranks, groups=groups, window=window)  # fmt: skip
    return _write_trace(analysis, path, view, jobs=jobs), view


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
