"""The analysis report as the protobuf message defined in ``proto/fr2perfetto_report.proto``."""

from __future__ import annotations

from google.protobuf import json_format

from .. import __version__
from ..base.model import MatchedOp
from ..diagnose.verdict import Diagnosis
from ..proto import fr2perfetto_report_pb2 as report_pb2
from ..read.job import Job
from ..read.stacks import main_thread, where

SCHEMA_VERSION = "4"
_INT32_MAX = 2**31 - 1


def _int32(value: int) -> int:
    return max(-_INT32_MAX, min(value, _INT32_MAX))


def build_report(job: Job, ops: list[MatchedOp], diagnosis: Diagnosis) -> report_pb2.Report:
    """Everything ``analyze`` knows, as a ``Report`` message."""
    report = report_pb2.Report(schema_version=SCHEMA_VERSION, tool_version=__version__)
    verdict = diagnosis.verdict
    report.verdict.status = verdict.status
    report.verdict.culprit_ranks.extend(verdict.culprit_ranks)
    report.verdict.category = verdict.category
    report.verdict.summary = verdict.summary
    report.verdict.evidence.extend(verdict.evidence)
    for finding in diagnosis.findings:
        item = report.findings.add(
            kind=finding.kind,
            seq=_int32(finding.seq),
            op=finding.op,
            ranks=finding.ranks,
            culprit_ranks=finding.culprit_ranks,
            evidence=finding.evidence,
            summary=finding.summary,
            time_ns=finding.time_ns,
        )
        if finding.group is not None:
            item.group.name = finding.group.name
            item.group.desc = finding.group.desc
            item.group.members.extend(finding.group.members)
        for frame in finding.culprit_frames:
            item.culprit_frames.add(name=frame.name, filename=frame.filename, line=_int32(frame.line))
        for ranks, frames in finding.stacks:
            culprit_stack = item.stacks.add(ranks=ranks)
            for frame in frames:
                culprit_stack.frames.add(name=frame.name, filename=frame.filename, line=_int32(frame.line))
        item.lag_ns = finding.lag_ns
    summary = report.job
    summary.ranks = len(job.ranks)
    summary.ranks_with_dump.extend(job.dumps)
    summary.missing_ranks.extend(job.missing_ranks)
    summary.groups = len(job.groups)
    summary.ops = len(ops)
    summary.dump_versions.extend(sorted({d.version for d in job.dumps.values()}))
    summary.has_timing = any(d.has_timing for d in job.dumps.values())
    summary.run = job.run
    for info in job.runs:  # only where the inputs held several runs
        first, last = info.span or (0, 0)
        report.runs.add(name=info.name, ranks=info.ranks, files=info.files, folders=info.folders, first_ns=first,
                        last_ns=last, analysed=info.name == job.run)  # fmt: skip
    for problem in job.problems:
        report.input_problems.add(path=problem.path, reason=problem.reason, fatal=problem.fatal)
    for rank, snapshot in sorted(job.stacks.items()):
        thread = main_thread(snapshot)
        if thread is None:
            continue
        frame, in_collective = where(thread)
        stack = report.stacks.add(rank=rank, time_ns=snapshot.time_ns or 0, source=snapshot.source,
                                  thread=thread.name, in_collective=in_collective)  # fmt: skip
        stack.where.name, stack.where.filename, stack.where.line = frame.name, frame.filename, _int32(frame.line)
        for each in thread.frames:
            stack.frames.add(name=each.name, filename=each.filename, line=_int32(each.line))
    for event in job.log_events:
        report.log_events.add(rank=event.rank, time_ns=event.time_ns or 0, kind=event.kind, line=event.line,
                              source=event.source, details=event.details)  # fmt: skip
    report.next_steps.extend(diagnosis.next_steps)
    return report


def report_json(report: report_pb2.Report) -> str:
    """The report in protobuf's JSON mapping, with the field names of the schema."""
    return json_format.MessageToJson(report, preserving_proto_field_name=True, indent=2)


def parse_report_json(text: str) -> report_pb2.Report:
    """Parse (and so validate) a JSON report against the schema; raises ``json_format.ParseError``."""
    return json_format.Parse(text, report_pb2.Report())
