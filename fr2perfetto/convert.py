"""From a loaded job to a written trace: the steps ``fr2perfetto convert`` runs, I/O at the edges."""

from __future__ import annotations

from dataclasses import dataclass

from .job import Job
from .match import match_ops
from .model import MatchedOp
from .output import atomic_output
from .renderers.perfetto import PerfettoWriter, TraceStats
from .timeline import rank_timelines, time_span


@dataclass(slots=True)
class Converted:
    """The result of a conversion: the matched ops and what the trace holds."""

    ops: list[MatchedOp]
    stats: TraceStats
    path: str


def write_trace(job: Job, ops: list[MatchedOp], path: str) -> TraceStats:
    """Write the Perfetto trace of ``job`` to ``path`` (atomically)."""
    span = time_span(job)
    with atomic_output(path) as out:
        writer = PerfettoWriter(out)
        problem_times = [op.first_time_ns for op in ops if op.status != "ok"]
        if problem_times:
            writer.range_of_interest(max(span.start, min(problem_times) - (span.end - span.start) // 10))
        for timeline in rank_timelines(job, ops, span):
            for track in timeline.tracks:
                writer.track(track)
            for track in timeline.tracks:
                writer.slices(track.uuid, track.slices)
    return writer.stats


def convert_job(job: Job, path: str) -> Converted:
    """Match the job's ops and write its trace."""
    ops = match_ops(job)
    return Converted(ops, write_trace(job, ops, path), path)
