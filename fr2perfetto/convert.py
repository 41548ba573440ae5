"""The steps behind the commands: analyse a loaded job, write its trace. I/O only at the edges."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from .diagnose import Diagnosis, diagnose
from .fold import View, full_view
from .job import Job
from .match import match_ops
from .model import OK, MatchedOp
from .output import atomic_output
from .renderers.chrome_json import ChromeJsonWriter
from .renderers.perfetto import PerfettoWriter, TraceStats
from .timeline import drawn_counts, findings_tracks, ops_by_rank, rank_timelines, time_span


@dataclass(slots=True)
class Analysis:
    """A job's matched ops and what the diagnosis made of them."""

    job: Job
    ops: list[MatchedOp]
    diagnosis: Diagnosis


def analyse(job: Job) -> Analysis:
    """Match the job's ops across ranks and diagnose them."""
    ops = match_ops(job)
    return Analysis(job, ops, diagnose(job, ops))


def write_trace(analysis: Analysis, path: str, view: View | None = None) -> TraceStats:
    """Write the Perfetto trace of an analysed job to ``path`` (atomically), showing ``view``."""
    job, ops = analysis.job, analysis.ops
    span = time_span(job)
    view = view or full_view(job)
    index = ops_by_rank(ops, {rep for rep, _ in view.processes} if view.folded else None)
    drawn = drawn_counts(index, view) if view.folded else None
    finding_tracks, highlights = findings_tracks(analysis.diagnosis.findings, span, drawn)
    with atomic_output(path) as raw, _maybe_gzip(raw, path) as out:
        writer = ChromeJsonWriter(out) if output_format(path) == "json" else PerfettoWriter(out)
        problem_times = [op.first_time_ns for op in ops if op.status != OK]
        if problem_times:
            # Open the UI on the last tenth of the job before the first problem.
            writer.range_of_interest(max(span.start, min(problem_times) - (span.end - span.start) // 10))
        for track in finding_tracks:
            writer.track(track)
        for track in finding_tracks:
            writer.slices(track.uuid, track.slices)
        for timeline in rank_timelines(job, index, span, highlights, view):
            for track in timeline.tracks:
                writer.track(track)
            for track in timeline.tracks:
                writer.slices(track.uuid, track.slices)
        writer.finish()
    return writer.stats


def output_format(path: str) -> str:
    """``json`` for ``.json`` and ``.json.gz`` (Chrome's format), else ``perfetto``."""
    name = path.lower().removesuffix(".gz")
    return "json" if name.endswith(".json") else "perfetto"


@contextlib.contextmanager
def _maybe_gzip(out: IO[bytes], path: str) -> Iterator[IO[bytes]]:
    if not path.lower().endswith(".gz"):
        yield out
        return
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as compressed:
        yield compressed  # type: ignore[misc]
