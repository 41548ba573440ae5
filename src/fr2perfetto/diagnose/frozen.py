"""Whether the job stopped moving, from the stack snapshots beside its dumps: which ranks wait in
communication and which stay elsewhere, over a window in which nothing moved.

Where snapshots come from: PyTorch's debug server (``torch/distributed/debug/_debug_handlers.py``,
``StacksHandler.dump``; written every ``dump_interval`` seconds by ``_frontend.PeriodicDumper`` as
``stacks_<time.strftime("%Y%m%d_%H%M%S")>.txt``, local time) holds, for each ``i`` of
``range(world_size)``, the answer of the worker that registered under ``rank{i}`` in the store, i.e.
global rank ``i``: a header ``=== Rank i: <address> ===``, then ``faulthandler``'s traceback of every
thread of that process, newest first (the worker server's own thread, ``Current thread``, has no Python
frame; the main thread, the oldest, comes last). py-spy's dumps and the capture helper's give one rank
each. In every one, the main thread (``stacks.main_thread``) is the one judged.

What counts as stuck, and why: a rank *stays* where it is when its main thread's whole stack is the same
in its last ``MIN_SNAPSHOTS`` snapshots or more, spanning ``MIN_SPAN_NS`` or more. That alone is common
in a healthy job (a pipeline stage that waits for its activations most of the time is seen in the same
``_wait_batch_p2p`` in several snapshots in a row), so the job counts as *frozen* only when every rank
with snapshots stays where it is over one common window of that length, and no dump holds an op
enqueued in that window (a job that enqueued a collective then was moving). A healthy job always has a
rank at work whose stack changes from one snapshot to the next; a hung one has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..base.model import Entry, Frame, StackSnapshot, ThreadStack
from ..read.job import Job
from ..read.stacks import communication_call, main_thread, where

MIN_SNAPSHOTS = 3
MIN_SPAN_NS = 3_000_000_000
CLOCK_SLACK_NS = 2_000_000_000  # snapshot file times have whole seconds; hosts' clocks differ a little


@dataclass(frozen=True, slots=True)
class Still:
    """A rank that stayed where it is over the frozen window."""

    rank: int
    waiting: bool  # in a communication call
    frame: Frame  # the communication call it waits in, or its innermost frame in the script's own code
    caller: Frame  # its innermost frame in the script's own code (where it called what it waits in)
    thread: ThreadStack  # its main thread, as the newest snapshot saw it
    snapshots: int  # how many of its snapshots saw it there
    first_ns: int
    last_ns: int
    first_source: str  # the file of the first snapshot that saw it there
    source: str  # the newest snapshot's file


@dataclass(frozen=True, slots=True)
class Freeze:
    """A window in which no rank moved."""

    start_ns: int
    end_ns: int
    ranks: dict[int, Still]

    @property
    def waiting(self) -> list[int]:
        return [rank for rank, still in self.ranks.items() if still.waiting]

    @property
    def elsewhere(self) -> list[int]:
        return [rank for rank, still in self.ranks.items() if not still.waiting]


def find_freeze(job: Job) -> Freeze | None:
    """The window at the end of the snapshots in which every rank with snapshots stayed where it is
    (see the module's docstring), or None: the job moved, or the snapshots cannot tell."""
    stills: dict[int, Still] = {}
    for rank, snapshots in job.snapshots.items():
        still = _staying(rank, [s for s in snapshots if s.time_ns is not None])
        if still is None:
            return None  # a rank that moved, or was not seen often enough: nothing says the job froze
        stills[rank] = still
    if len(stills) < 2:
        return None
    start, end = max(s.first_ns for s in stills.values()), min(s.last_ns for s in stills.values())
    if end - start < MIN_SPAN_NS:
        return None
    if any(_enqueued_after(dump.entries, start + CLOCK_SLACK_NS) for dump in job.dumps.values()):
        return None  # a rank enqueued an op in the window: it was moving
    return Freeze(start, end, dict(sorted(stills.items())))


def _staying(rank: int, snapshots: list[StackSnapshot]) -> Still | None:
    """How long a rank stayed at its newest place: the run of its newest snapshots with the same main
    thread's stack, if it is long enough (``MIN_SNAPSHOTS``, ``MIN_SPAN_NS``)."""
    threads = [(s, t) for s in snapshots if (t := main_thread(s)) is not None]
    if len(threads) < MIN_SNAPSHOTS:
        return None
    newest_snapshot, newest = threads[-1]
    run = 1
    while run < len(threads) and threads[-1 - run][1].frames == newest.frames:
        run += 1
    first_snapshot = threads[-run][0]
    first_ns, last_ns = first_snapshot.time_ns or 0, newest_snapshot.time_ns or 0
    if run < MIN_SNAPSHOTS or last_ns - first_ns < MIN_SPAN_NS:
        return None
    call = communication_call(newest)
    caller, _ = where(newest)
    return Still(rank, call is not None, call or caller, caller, newest, run, first_ns, last_ns,
                 first_snapshot.source, newest_snapshot.source)  # fmt: skip


def _enqueued_after(entries: Sequence[Entry], moment: int) -> bool:
    """Whether any of a rank's entries was enqueued after ``moment`` (its newest are last)."""
    return any(entry.time_created_ns > moment for entry in entries[-16:])
