"""What lies beside the dumps decides where the dumps cannot, and keeps a hung job from being called healthy.

The dumps show only what the Flight Recorder records: gloo's records collectives and never a send or
recv, a ring buffer drops old ops, a rank stuck in its own code issues nothing at all. So where the dumps
name no culprit:

- ``rule_stuck_cpu``: the stack snapshots show the job frozen (``frozen``), some ranks waiting in
  communication and some staying in their own code: those are the culprits, the others their victims;
- ``rule_crashed``: a rank's log holds an error of its own (an exception, a CUDA or NCCL error): the
  earliest is the culprit, and the ranks whose collectives then failed are not;
- ``contradictions``: what else says the job failed or stopped (a watchdog timeout, a collective that
  timed out, torchrun's failure table, a job whose every rank waits in communication and none moves),
  each in one sentence: a verdict with any of them is never ``healthy``;
- ``ended_first``: what says a rank that left no dump ended before the others (the launcher's failure
  table, an error in its own log, or the others stopped by a signal while it left only its rank file);
- ``blind_spots``: what this job's dumps cannot show (gloo's unrecorded sends and recvs), and how to see
  it (the command that takes stack snapshots).
"""

from __future__ import annotations

import os
from collections import defaultdict

from ..base.model import (
    CRASHES,
    LOG_CHILD_FAILED,
    LOG_COMM_FAILURE,
    LOG_WATCHDOG_STUCK,
    LOG_WATCHDOG_TIMEOUT,
    OWN_ERRORS,
    Entry,
    Finding,
    Frame,
    LogEvent,
    distinct_values,
)
from ..base.words import ranks_text, verb
from ..read.job import Job
from .corroborate import quoted, stopped_by_launcher
from .frozen import Freeze, Still

KIND_STUCK_CPU = "stuck_cpu"
KIND_CRASH = "crash"
# What takes stack snapshots of a running job, for the verdict's next step.
SNAPSHOT_COMMANDS = (
    "py-spy dump --pid <pid> > pyspy_rank_<rank>.txt (on each rank's host)",
    "torch.distributed.debug.start_debug_server(dump_dir=<dir>, dump_interval=5) in the job (stacks_*.txt every 5 s)",
    "fr2perfetto trigger <dir> with fr2perfetto.capture in the job (stacks beside each dump)",
)


def place(frame: Frame) -> str:
    """``forward at train.py:29``."""
    return f"{frame.name} at {os.path.basename(frame.filename)}:{frame.line}"


def rule_stuck_cpu(job: Job, freeze: Freeze | None) -> list[Finding]:
    """The ranks that stay in their own code while every other rank waits in communication, over a window
    in which the job did not move (``frozen.find_freeze``): they hold the job."""
    if freeze is None or not freeze.waiting or not freeze.elsewhere:
        return []
    culprits = tuple(freeze.elsewhere)
    seconds = (freeze.end_ns - freeze.start_ns) / 1e9
    lines = [_stays_line(freeze.ranks[rank], seconds) for rank in culprits]
    by_call: dict[str, list[Still]] = defaultdict(list)
    for rank in freeze.waiting:
        by_call[place(freeze.ranks[rank].frame)].append(freeze.ranks[rank])
    for call, stills in by_call.items():
        callers = sorted({place(s.caller) for s in stills})
        lines.append(
            f"{verb([s.rank for s in stills], 'waits', 'wait')} in communication all along, in {call} "
            f"(called from {', '.join(callers[:3])}{'…' if len(callers) > 3 else ''}): victims."
        )
    gloo = any(e.backend == "gloo" for d in job.dumps.values() for e in d.entries[-1:])
    lines.append(
        "No rank moved in that window and no dump holds an op enqueued in it: the job is hung in an op the "
        "dumps do not hold" + (" (gloo's Flight Recorder records no send or recv)." if gloo else ".")
    )
    first = freeze.ranks[culprits[0]]
    waiting = freeze.waiting
    calls = ", ".join(sorted({freeze.ranks[r].frame.name for r in waiting}))
    summary = (
        f"{ranks_text(culprits)} {'stays' if len(culprits) == 1 else 'stay'} in {place(first.frame)}, not in "
        f"communication, over {'its' if len(culprits) == 1 else 'their'} last {first.snapshots} stack snapshots "
        f"({seconds:.0f} s); {verb(waiting, 'waits', 'wait')} in communication ({calls}) all along"
    )
    return [
        Finding(
            kind=KIND_STUCK_CPU, group=None, seq=0, op="", ranks=tuple(freeze.ranks), culprit_ranks=culprits,
            evidence=lines, summary=summary, time_ns=freeze.start_ns, culprit_frames=first.thread.frames,
            window=(freeze.start_ns, freeze.end_ns),
        )
    ]  # fmt: skip


def _stays_line(still: Still, seconds: float) -> str:
    return (
        f"rank {still.rank}'s main thread stays in {place(still.frame)}, not in communication, in each of its "
        f"last {still.snapshots} stack snapshots ({os.path.basename(still.first_source)} to "
        f"{os.path.basename(still.source)}, {seconds:.0f} s)."
    )


def rule_crashed(job: Job) -> list[Finding]:
    """The ranks whose logs hold an error of their own (``OWN_ERRORS``: an exception that is no failed
    collective, a CUDA or NCCL error), earliest first: the first of them is the culprit, and the ranks
    whose collectives failed afterwards (``comm_failure``) are not."""
    own: dict[int, LogEvent] = {}
    for event in _in_time_order(job.log_events):
        if event.kind in OWN_ERRORS:
            own.setdefault(event.rank, event)
    if not own:
        return []
    ranks = list(own)  # earliest first
    first = own[ranks[0]]
    lines = [f"{quoted(own[rank])}: {own[rank].line}" for rank in ranks[:8]]
    failed = sorted({e.rank for e in job.log_events if e.kind == LOG_COMM_FAILURE and e.rank not in own})
    if failed:
        lines.append(f"{verb(failed, 'fails', 'fail')} afterwards in communication (a peer went away or timed out).")
    where = first.details.get("where")
    summary = f"rank {first.rank} failed of an error of its own: {first.line}" + (f" (in {where})" if where else "")
    return [
        Finding(
            kind=KIND_CRASH, group=None, seq=0, op="", ranks=tuple(sorted({*ranks, *failed})),
            culprit_ranks=tuple(ranks), evidence=lines, summary=summary, time_ns=first.time_ns or 0,
        )
    ]  # fmt: skip


def _in_time_order(events: list[LogEvent]) -> list[LogEvent]:
    return sorted(events, key=lambda e: (e.time_ns is None, e.time_ns or 0, e.rank))


def contradictions(job: Job, freeze: Freeze | None) -> list[str]:
    """Every sign beside the dumps that the job failed or stopped, earliest first, one sentence each."""
    said: list[str] = []
    if freeze is not None and not freeze.elsewhere:
        calls = ", ".join(sorted({place(s.frame) for s in freeze.ranks.values()})[:3])
        said.append(
            f"in the last stack snapshots every rank waits in communication ({calls}) and none moves for "
            f"{(freeze.end_ns - freeze.start_ns) / 1e9:.0f} s"
        )
    for event in _in_time_order(job.log_events):
        if event.kind == LOG_WATCHDOG_TIMEOUT:
            said.append(
                f"rank {event.rank}'s watchdog timed out in {event.details.get('op', '?')} "
                f"SeqNum={event.details.get('seq', '?')} ({event.source})"
            )
        elif event.kind == LOG_COMM_FAILURE:
            said.append(f"rank {event.rank}'s log says a collective or transfer failed: {event.line[:160]} "
                        f"({event.source})")  # fmt: skip
        elif event.kind == LOG_WATCHDOG_STUCK:
            said.append(f"rank {event.rank}'s log says its watchdog got stuck ({event.source})")
        elif event.kind == LOG_CHILD_FAILED:
            said.append(f"torchrun says {event.line.removesuffix(' [torchrun]')} ({event.source})")
    return said


def stopped_by_signal(job: Job) -> str:
    """The signal that ended every rank whose ending the capture helper recorded (``signal SIGTERM`` in
    its ``.ended`` file: a launcher tearing the job down), or "" where any ended otherwise or none said."""
    endings = {job.endings[rank] for rank in job.dumps if rank in job.endings}
    if len(endings) != 1:
        return ""
    (ending,) = endings
    return ending.removeprefix("signal ") if ending.startswith("signal ") else ""


def ended_first(job: Job, rank: int) -> list[str]:
    """What says that ``rank``, which left no dump, ended before the others, one sentence each (none:
    nothing does): the launcher's failure table (torchrun's ``ChildFailedError``: its exit code or the
    signal that killed it), an error in its own log, or, with the capture helper in the job, its rank
    file left behind with no dump and no ``.ended`` file while every other rank was stopped by a signal.
    A rank that died at once (SIGABRT, SIGKILL) never runs the helper's handlers: its rank file stays,
    and nothing else is written; torchrun then stops the other ranks with SIGTERM
    (``torch/distributed/elastic/agent/server/api.py``, ``_stop_workers``), and they dump."""
    said = []
    for event in _in_time_order(job.log_events):
        if event.rank != rank or event.kind not in CRASHES or stopped_by_launcher(event):
            continue
        said.append(f"{quoted(event)}: {event.line}")  # as ``corroborate`` quotes it
        if len(said) >= 3:
            break
    stopped = stopped_by_signal(job)
    process = job.processes.get(rank)
    if stopped and process is not None and rank not in job.endings:
        host, pid = process
        said.append(
            f"rank {rank} left its rank file (host {host}, pid {pid}) but neither a dump nor a .ended file, "
            f"while every other rank's .ended file says it was stopped by {stopped}: it ended before they were "
            "stopped (a launcher stops the others when one rank fails)."
        )
    return said


def unseen(job: Job, freeze: Freeze | None) -> list[str]:
    """What these dumps cannot show of a job they find nothing wrong with, one clause each with how to
    see it (none: nothing is hidden): a healthy verdict needs positive evidence, so each makes it
    undecided. A job whose every rank ended by itself (the capture helper's ``exit``) hid nothing.

    - dumps taken on request from a running job (``.ended`` says ``running``): an op in flight then may
      yet hang;
    - gloo's unrecorded sends and recvs (``unrecorded_ops``), with no stack snapshot to show where each
      rank is: a hang in one leaves every dump looking well."""
    ended = [job.endings.get(rank) for rank in job.dumps]
    if ended and all(e == "exit" for e in ended):
        return []
    said = []
    running = [rank for rank in job.dumps if job.endings.get(rank) == "running"]
    if running:
        said.append(
            f"{verb(running, 'was', 'were')} dumped on request while running (.ended says running): an op in "
            "flight then may yet hang; dump again a timeout later and compare, or take stack snapshots"
        )
    unrecorded = unrecorded_ops(job)
    if unrecorded is not None and not job.snapshots and freeze is None:
        said.append(
            f"gloo records no send or recv (rank {unrecorded[0]}'s op ids skip {unrecorded[1]} unrecorded ops): a "
            "hang in one would not show in these dumps; take stack snapshots while it runs"
        )
    return said


def unrecorded_ops(job: Job) -> tuple[int, int] | None:
    """(rank, count) of the rank whose gloo op ids skip the most ops no recorded collective accounts for.

    ``ProcessGroupGloo`` counts every op it runs with its group's ``seq_`` (``++seq_`` in ``send``,
    ``recv`` and each collective; ``ProcessGroupGloo.cpp``), which the Flight Recorder writes as the
    entry's ``op_id``, while ``collective_seq_id`` counts collectives only and only collectives are
    recorded. So between two entries of one group, op ids that advance more than collective seqs do
    are ops that were not recorded: sends and recvs."""
    most: tuple[int, int] | None = None
    for rank, dump in job.dumps.items():
        if "gloo" not in distinct_values(dump.entries, "backend"):
            continue  # most jobs: NCCL's, read from its columns without making an entry
        last: dict[str, Entry] = {}
        skipped = 0
        for entry in dump.entries:
            if entry.backend != "gloo":
                continue
            before = last.get(entry.group_name)
            if before is not None:
                skipped += max(0, (entry.op_id - before.op_id) - (entry.collective_seq - before.collective_seq))
            last[entry.group_name] = entry
        if skipped and (most is None or skipped > most[1]):
            most = (rank, skipped)
    return most


def blind_spots(job: Job) -> list[str]:
    """What this job's dumps cannot show, and how to see it, one sentence each (none: nothing known)."""
    unrecorded = unrecorded_ops(job)
    uses_p2p = any(
        "pipelining" in frame.filename or frame.name in ("send", "recv", "isend", "irecv", "batch_isend_irecv")
        for snapshots in job.snapshots.values() for snapshot in snapshots for thread in snapshot.threads
        for frame in thread.frames
    )  # fmt: skip
    gloo = any(e.backend == "gloo" for d in job.dumps.values() for e in d.entries[-1:])
    if not gloo or (unrecorded is None and not uses_p2p):
        return []
    why = (
        f"rank {unrecorded[0]}'s op ids skip {unrecorded[1]} ops that no recorded collective accounts for"
        if unrecorded
        else "the stack snapshots show sends and recvs (pipelining)"
    )
    said = [f"gloo's Flight Recorder records collectives only, never send or recv ({why}): a hang in a send or "
            "recv does not show in these dumps."]  # fmt: skip
    if not job.snapshots:
        commands = "; or ".join(SNAPSHOT_COMMANDS)
        said.append(f"To see where each rank is, take stack snapshots while it hangs: {commands}.")
    return said
