"""What the stack snapshots and logs found beside the dumps add to the findings.

The dumps say which op a rank never issued; a stack snapshot says where its main thread was instead
(``train_step`` at ``train.py:140``, not in a collective), and a log says what went wrong on it. So:

- a culprit's finding says where its main thread is (in the summary, and with the snapshot's source);
- a rank that waits in a collective and whose stack is inside one corroborates its wait;
- a rank that left no dump but logged a crash (an exception, a CUDA or NCCL error, torchrun's failure
  table) is the culprit of its ``no_dump`` finding, the line quoted as the cause; a rank that logged a
  crash is never called a mere straggler;
- a watchdog timeout in a log is checked against the rank's dump: the seq and op it names.
"""

from __future__ import annotations

import os
from dataclasses import replace

from ..base.model import (
    CRASHES,
    LOG_CHILD_FAILED,
    LOG_CUDA_ERROR,
    LOG_EXCEPTION,
    LOG_NCCL_ERROR,
    LOG_WATCHDOG_TIMEOUT,
    Finding,
    LogEvent,
)
from ..base.text import is_number
from ..base.words import group_called
from ..read.stacks import main_thread, where
from .evidence import Evidence

_CAUSE_ORDER = [LOG_CUDA_ERROR, LOG_NCCL_ERROR, LOG_EXCEPTION, LOG_CHILD_FAILED]

KIND_STRAGGLER, KIND_NO_DUMP = "straggler", "no_dump"
_BLAMING_KINDS = {"missing", "p2p", "no_dump", "not_started", "deadlock"}


def from_ended_file(event: LogEvent) -> bool:
    """Whether ``event`` is the line of a ``.ended`` file rather than of a log. ``capture`` writes one beside
    each dump when its rank's process ends: a file of its own, which a user told of "its log" would look
    for among the job's logs in vain. A log line's source is ``path:line`` (``read.logs``), a ``.ended``
    file's its path alone (redacted: ``<dumps>/log1``)."""
    _, colon, line = event.source.rpartition(":")
    return not (colon and is_number(line))


def quoted(event: LogEvent) -> str:
    """Where a rank's event was read, to quote it by: ``rank 3's log (train.log:12)``, or ``rank 3's .ended
    file (written by fr2perfetto.capture: dumps/nccl_trace_rank_3.ended)``."""
    if from_ended_file(event):
        return f"rank {event.rank}'s .ended file (written by fr2perfetto.capture: {event.source})"
    return f"rank {event.rank}'s log ({event.source})"


def says(event: LogEvent) -> str:
    """``rank 3's log says: `` or ``rank 3's .ended file says: ``, before what it says."""
    return f"rank {event.rank}'s {'.ended file' if from_ended_file(event) else 'log'} says: "


def corroborate(evidence: Evidence, findings: list[Finding]) -> tuple[list[Finding], list[str]]:
    """The findings with what stacks and logs say added, and lines for the verdict's evidence."""
    job = evidence.job
    if not job.stacks and not job.log_events:
        return findings, []
    crashes: dict[int, LogEvent] = {}  # rank -> what it died of: its own error first, the launcher's last
    for event in sorted(job.log_events, key=lambda e: (_CAUSE_ORDER.index(e.kind) if e.kind in _CAUSE_ORDER else 9,
                                                       e.time_ns is None, e.time_ns or 0)):  # fmt: skip
        if event.kind in CRASHES and not stopped_by_launcher(event):
            crashes.setdefault(event.rank, event)
    out = []
    for finding in findings:
        if finding.kind == KIND_STRAGGLER and any(r in crashes for r in finding.culprit_ranks):
            continue  # a rank that crashed is no mere straggler
        if finding.kind == KIND_NO_DUMP:
            finding = _crashed_without_dump(finding, crashes)
        if finding.kind in _BLAMING_KINDS:
            finding = _where_they_are(evidence, finding, crashes)
        out.append(finding)
    return out, [_timeout_line(evidence, e) for e in job.log_events if e.kind == LOG_WATCHDOG_TIMEOUT][:16]


def _location(evidence: Evidence, rank: int) -> tuple[str, bool] | None:
    """``train_step (train.py:140)`` of a rank's main thread, and whether it is inside a collective."""
    snapshot = evidence.job.stacks.get(rank)
    thread = main_thread(snapshot) if snapshot else None
    if thread is None:
        return None
    frame, in_collective = where(thread)
    return f"{frame.name} at {os.path.basename(frame.filename)}:{frame.line}", in_collective


def _where_they_are(evidence: Evidence, finding: Finding, crashes: dict[int, LogEvent]) -> Finding:
    lines = list(finding.evidence)
    summary = finding.summary
    for rank in finding.culprit_ranks:
        location = _location(evidence, rank)
        if location is not None:
            place, in_collective = location
            snapshot = evidence.job.stacks[rank]
            state = "inside a collective" if in_collective else "not in a collective"
            lines.insert(1, f"rank {rank}'s main thread is in {place}, {state} (stack snapshot {snapshot.source}).")
            if rank == finding.culprit_ranks[0]:
                summary += f"; rank {rank} is in {place}" + ("" if in_collective else ", not in a collective")
        if rank in crashes:
            event = crashes[rank]
            line = f"{quoted(event)}: {event.line}"
            if line not in lines:  # a rank without a dump has it quoted as its cause already
                lines.insert(1, line)
    for rank in sorted(set(finding.ranks) - set(finding.culprit_ranks)):
        location = _location(evidence, rank)
        wait = evidence.waits.get(rank)
        if location is not None and location[1] and wait is not None:
            lines.append(f"rank {rank}'s stack is inside a collective ({location[0]}), as its wait says.")
    return replace(finding, evidence=lines, summary=summary)


def _crashed_without_dump(finding: Finding, crashes: dict[int, LogEvent]) -> Finding:
    crashed = [r for r in finding.ranks if r in crashes and r not in finding.culprit_ranks]
    if not crashed and not any(r in crashes for r in finding.culprit_ranks):
        return finding
    culprits = tuple(dict.fromkeys([*finding.culprit_ranks, *crashed]))
    first = crashes[next(r for r in culprits if r in crashes)]
    lines = [f"{quoted(crashes[r])}: {crashes[r].line}" for r in culprits if r in crashes]
    return replace(
        finding,
        culprit_ranks=culprits,
        evidence=[*lines, *(line for line in finding.evidence if line not in lines)],
        summary=f"{finding.summary}; {says(first)}{first.line}",
        time_ns=0,  # the crash comes before what the others do about it
    )


# The signals a launcher stops the ranks that are left with (torchrun: SIGTERM, ``PContext.close``):
# a rank its failure table lists as killed by one of them did not fail of its own.
LAUNCHER_SIGNALS = ("-15", "-1")  # SIGTERM, SIGHUP, as exit codes


def stopped_by_launcher(event: LogEvent) -> bool:
    """Whether a log event is torchrun's line for a rank it stopped itself (its failure table lists every
    rank it sent SIGTERM to after the first one failed)."""
    return event.kind == LOG_CHILD_FAILED and event.details.get("exitcode") in LAUNCHER_SIGNALS


def _timeout_line(evidence: Evidence, event: LogEvent) -> str:
    """A watchdog timeout, checked against the rank's dump: the op of that seq and its state there."""
    seq, op = int(event.details.get("seq", "0")), event.details.get("op", "?")
    head = f"rank {event.rank}'s watchdog timed out in {op} SeqNum={seq} after {event.details.get('ran_ms', '?')} ms"
    dump = evidence.job.dumps.get(event.rank)
    if dump is None:
        return f"{head}; it left no dump to check it against."
    wanted = op.lower().replace("_", "")
    for entry in reversed(dump.entries):
        number = entry.p2p_seq if entry.is_p2p else entry.collective_seq
        if number == seq and entry.op.lower().replace("_", "").startswith(wanted[:6]):
            group = evidence.job.group_of.get((event.rank, entry.group_name))
            name = group_called(group) if group else entry.group_name
            return f"{head}; its dump agrees: {entry.op} #{seq} of {name} is {entry.state} there."
    return f"{head}; its dump holds no {op} #{seq} (its ring buffer may have dropped it)."
