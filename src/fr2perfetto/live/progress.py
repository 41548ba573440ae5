"""Whether a running job moves: per rank and per process group, the last op enqueued, started and completed
and when each last moved; from that, the line the watch shows and whether the job stands still.

Pure state: the clock is a number the caller passes (``now``, in seconds), and nothing here reads a
file, a socket or the time. What a rank said comes in as a ``Sample`` (``sample_of_dump`` from its
Flight Recorder, ``sample_of_stacks`` from a stack snapshot) or a ``Failure`` (it did not answer).

What counts as a move: any group's last enqueued, started or completed op of any rank changing (the
Flight Recorder's ``pg_status``, else its entries), the rank's newest record id changing (sends and
recvs, which ``pg_status`` does not count), or, where only stack snapshots are read, the place its main
thread is at changing. Stacks alone say less: a job stands still by them when no rank's place changed
for the stall and at least one rank sat in a communication call in every snapshot since.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..base.model import COMPLETED, STARTED, RankDump, StackSnapshot, ranks_label
from ..base.text import shown
from ..base.words import count
from ..read.stacks import main_thread, where

RATE_WINDOW = 10.0  # seconds over which ops per second are counted


@dataclass(frozen=True, slots=True)
class Mark:
    """Where one rank stands in one group: the sequence numbers of the last collective it enqueued,
    started and completed (-1: none, or not recorded: gloo records no start), and that op's name."""

    enqueued: int
    started: int
    completed: int
    op: str = ""

    def moves(self) -> tuple[int, int, int]:
        return self.enqueued, self.started, self.completed


@dataclass(frozen=True, slots=True)
class Sample:
    """What one answer of one rank says. ``marks`` and ``labels`` by group name (a label: the group's
    description, ``tp``); ``records``: its newest Flight Recorder record id (-1: none); ``place``: where
    its main thread is, from a stack snapshot (None: no snapshot), and ``in_collective`` whether it
    waits in a communication call there."""

    marks: Mapping[str, Mark] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    records: int = -1
    place: tuple[str, ...] | None = None
    in_collective: bool = False

    @property
    def from_recorder(self) -> bool:
        return bool(self.marks) or self.records >= 0


@dataclass(frozen=True, slots=True)
class Failure:
    """A rank that did not answer: why, in one line (never the server's own words), and whether its
    server is gone (the connection refused: the process ended) rather than slow."""

    reason: str
    gone: bool = False


def sample_of_dump(dump: RankDump) -> Sample:
    """Where a rank stands by its Flight Recorder: ``pg_status`` for each group it lists (the counts the
    process group itself keeps), else the entries (the last collective seq enqueued, started, completed)."""
    marks: dict[str, Mark] = {}
    labels: dict[str, str] = {}
    last_op: dict[tuple[str, int], str] = {}
    from_entries: dict[str, list[int]] = {}
    records = -1
    for entry in dump.entries:
        records = max(records, entry.record_id)
        name = entry.group_name
        if entry.group_desc:
            labels[name] = entry.group_desc
        if entry.is_p2p:
            continue
        seq = entry.collective_seq
        last_op[(name, seq)] = entry.op
        seen = from_entries.setdefault(name, [-1, -1, -1])
        seen[0] = max(seen[0], seq)
        if entry.state in (STARTED, COMPLETED):
            seen[1] = max(seen[1], seq)
        if entry.state == COMPLETED:
            seen[2] = max(seen[2], seq)
    for name, (enqueued, started, completed) in dump.pg_status.items():
        marks[name] = Mark(enqueued, started, completed, last_op.get((name, enqueued), ""))
    for name, (enqueued, started, completed) in from_entries.items():
        if name not in marks:
            marks[name] = Mark(enqueued, started, completed, last_op.get((name, enqueued), ""))
    for name, config in dump.pg_config.items():
        if config.desc and name not in labels:
            labels[name] = config.desc
    return Sample(marks, labels, records)


def sample_of_stacks(snapshot: StackSnapshot) -> Sample:
    """Where a rank is by a stack snapshot: its main thread's frames, and whether it waits in a
    communication call (``read.stacks.where``)."""
    thread = main_thread(snapshot)
    if thread is None:
        return Sample(place=())
    _, in_collective = where(thread)
    place = tuple(f"{frame.filename}:{frame.line}:{frame.name}" for frame in thread.frames)
    return Sample(place=place, in_collective=in_collective)


def merge(samples: list[Sample]) -> Sample:
    """One rank's samples of several recorders (NCCL's and gloo's) as one: where both name a group, each
    keeps it under the group's name and its recorder's place (``0 #2``)."""
    if len(samples) == 1:
        return samples[0]
    marks: dict[str, Mark] = {}
    labels: dict[str, str] = {}
    for number, sample in enumerate(samples, start=1):
        for name, mark in sample.marks.items():
            key = name if name not in marks else f"{name} #{number}"
            marks[key] = mark
            if name in sample.labels:
                labels[key] = sample.labels[name]
    return Sample(marks, labels, max(s.records for s in samples))


@dataclass(frozen=True, slots=True)
class Behind:
    """The rank furthest behind: by how many ops, in which group (its label), after which op."""

    rank: int
    by: int
    group: str
    op: str


@dataclass(frozen=True, slots=True)
class Status:
    """What the watch shows after a poll: ranks known and answering, the groups, ops per second (None:
    not known yet, or not from stacks), the rank furthest behind, seconds since the job last moved
    (None: before its first op), what happened since the last poll (``events``), and whether progress
    is told by stack snapshots alone. ``line()`` is the live line."""

    ranks: int
    answering: int
    silent: tuple[int, ...]
    groups: int
    ops: int
    ops_per_second: float | None
    behind: Behind | None
    outside: tuple[int, ...]  # by stacks: ranks outside a collective while others wait in one
    since_progress: float | None
    stalled: bool
    from_stacks: bool
    events: tuple[str, ...] = ()

    def line(self) -> str:
        """One line, every name in it ``shown``: ``4/4 ranks answering, 1 group, 4.9 ops/s, ...``."""
        if not self.ranks:
            return "waiting for the job's first answer"
        parts = [f"{self.answering}/{count(self.ranks, 'rank')} answering"]
        if self.silent:
            parts[0] += f" (not {ranks_label(list(self.silent))})"
        if not self.from_stacks:
            parts.append(count(self.groups, "group"))
            parts.append(f"{self.ops_per_second:.1f} ops/s" if self.ops_per_second is not None else "- ops/s")
        if self.behind is not None:
            behind = self.behind
            after = f", after {shown(behind.op[:40])}" if behind.op else ""
            group = behind.group if len(behind.group) <= 60 else behind.group[:59] + "…"
            parts.append(f"furthest behind: rank {behind.rank}, {count(behind.by, 'op')} behind in "
                         f"{shown(group)}{after}")  # fmt: skip
        elif self.outside:
            parts.append(f"outside a collective: rank{'s' if len(self.outside) > 1 else ''} "
                         f"{ranks_label(list(self.outside))}")  # fmt: skip
        elif not self.from_stacks and self.ops:
            parts.append("no rank behind")
        moved = "stacks last changed" if self.from_stacks else "last progress"
        if self.since_progress is None:
            parts.append("waiting for the first op" if not self.from_stacks else "waiting for a rank in a collective")
        else:
            parts.append(f"{moved} {_seconds(self.since_progress)} ago" + (" (stalled)" if self.stalled else ""))
        return ", ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks_label(ranks)}"


def _plural(verb: str, number: int) -> str:
    """``stopped answering``, ``does not answer`` / ``do not answer``, ``answers`` / ``answer`` for ``number`` ranks."""
    if number == 1:
        return verb
    return {"does not answer": "do not answer", "answers": "answer"}.get(verb, verb)


def _seconds(value: float) -> str:
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    return f"{value / 60:.0f} min"


@dataclass(slots=True)
class _Rank:
    sample: Sample | None = None
    answering: bool | None = None  # None: never heard from
    failure: Failure | None = None
    failed_at: float | None = None
    moved_at: float | None = None
    waited_throughout: bool = False  # by stacks: in a collective in every snapshot since it last moved


class Progress:
    """The job's progress as the answers of its ranks show it, poll after poll. ``observe`` takes what
    some ranks said at ``now`` (ranks with no news are left out) and returns what to say at once (a rank
    that stopped answering, or answers again); ``status`` is the line to show; ``stalled`` says whether
    the job stood still for ``stall`` seconds."""

    def __init__(self, stall: float, now: float) -> None:
        self.stall = stall
        self.started = now
        self.ranks: dict[int, _Rank] = {}
        self.last_progress: float | None = None  # when any rank last moved, once the job's first op is seen
        self.armed = False  # an op was seen (or, by stacks, a rank in a collective): a stall can be told
        self._rates: deque[tuple[float, int]] = deque()
        self._events: list[str] = []

    def known(self, ranks: list[int]) -> None:
        """Ranks the job has, whether they answered yet or not (the debug server's list)."""
        for rank in ranks:
            self.ranks.setdefault(rank, _Rank())

    def observe(self, now: float, answers: Mapping[int, Sample | Failure]) -> list[str]:
        stopped: dict[tuple[str, str], list[int]] = {}  # (what, why) -> ranks: said once for all of them
        again: list[int] = []
        for rank in sorted(answers):
            answer = answers[rank]
            state = self.ranks.setdefault(rank, _Rank())
            if isinstance(answer, Failure):
                if state.answering is not False:
                    said = "stopped answering" if state.answering else "does not answer"
                    stopped.setdefault((said, answer.reason), []).append(rank)
                    state.failed_at = now
                state.answering, state.failure = False, answer
                continue
            if state.answering is False and state.failure is not None:
                again.append(rank)
            state.answering, state.failure, state.failed_at = True, None, None
            self._take(rank, state, answer, now)
        events = [f"{_ranks(ranks)} {_plural(what, len(ranks))}: {why}" for (what, why), ranks in stopped.items()]
        if again:
            events.append(f"{_ranks(again)} {_plural('answers', len(again))} again")
        self._count_ops(now)
        self._events = events
        return events

    def _take(self, rank: int, state: _Rank, sample: Sample, now: float) -> None:
        before = state.sample
        if sample.from_recorder:
            if sample.records >= 0 or any(mark.enqueued > 0 for mark in sample.marks.values()):
                self.armed = True
            moved = before is not None and before.from_recorder and _recorder_moved(before, sample)
        elif before is not None and before.from_recorder:
            return  # a rank its recorder is read for: its moves are told by that, not by where it stands
        else:
            moved = before is not None and before.place != sample.place
            keeps_waiting = state.waited_throughout and before is not None and not moved
            state.waited_throughout = sample.in_collective and (keeps_waiting or before is None or moved)
            if sample.in_collective:
                self.armed = True
        state.sample = sample
        if before is None or moved:
            state.moved_at = now  # a rank's first answer is where it stands, not a move of the job
        if self.armed and (moved or self.last_progress is None):
            self.last_progress = now

    def _count_ops(self, now: float) -> None:
        self._rates.append((now, self.ops()))
        while len(self._rates) > 2 and self._rates[1][0] <= now - RATE_WINDOW:
            self._rates.popleft()

    def ops(self) -> int:
        """Ops of the job so far: for each group, the last op any member enqueued (each op once, not once per
        member), summed over the groups."""
        top: dict[str, int] = {}
        for state in self.ranks.values():
            if state.sample is None:
                continue
            for name, mark in state.sample.marks.items():
                top[name] = max(top.get(name, -1), mark.enqueued)
        return sum(value for value in top.values() if value > 0)

    def from_stacks(self) -> bool:
        """Whether where the ranks stand is known from stack snapshots alone (no Flight Recorder read)."""
        samples = [s.sample for s in self.ranks.values() if s.sample is not None]
        return bool(samples) and not any(sample.from_recorder for sample in samples)

    def behind(self) -> Behind | None:
        """The answering rank furthest behind its groups' front (the most ops behind in one group; of
        equals, the one that moved longest ago); None where no rank is behind."""
        top: dict[str, int] = {}
        answering = {r: s for r, s in self.ranks.items() if s.answering and s.sample is not None}
        for state in answering.values():
            assert state.sample is not None
            for name, mark in state.sample.marks.items():
                top[name] = max(top.get(name, -1), mark.enqueued)
        best: Behind | None = None
        best_key: tuple[int, float, int] | None = None
        for rank, state in answering.items():
            assert state.sample is not None
            for name, mark in state.sample.marks.items():
                by = top[name] - mark.enqueued
                key = (by, -(state.moved_at or 0.0), -rank)  # of equals, the one that moved longest ago
                if by <= 0 or (best_key is not None and key <= best_key):
                    continue
                label = state.sample.labels.get(name, "")
                group = f"{label} (pg {name})" if label and label != name else f"pg {name}"
                best, best_key = Behind(rank, by, group, mark.op), key
        return best

    def outside(self) -> tuple[int, ...]:
        """By stacks: the answering ranks not in a collective, where at least one other waits in one."""
        answering = [(r, s.sample) for r, s in self.ranks.items() if s.answering and s.sample is not None]
        waiting = [r for r, sample in answering if sample.in_collective]
        if not waiting:
            return ()
        return tuple(sorted(r for r, sample in answering if not sample.in_collective))

    def since_progress(self, now: float) -> float | None:
        return None if self.last_progress is None else max(0.0, now - self.last_progress)

    def stalled(self, now: float) -> bool:
        """No rank moved for ``stall`` seconds since the job's first op, while some rank answers; by stacks
        alone, also one rank at least sat in a communication call all that time."""
        since = self.since_progress(now)
        if since is None or since < self.stall or not self.armed:
            return False
        answering = [s for s in self.ranks.values() if s.answering]
        if not answering:
            return False
        if self.from_stacks():
            return any(s.waited_throughout for s in answering)
        return True

    def ops_per_second(self) -> float | None:
        if len(self._rates) < 2 or self.from_stacks():
            return None
        (t0, n0), (t1, n1) = self._rates[0], self._rates[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def gone(self) -> list[int]:
        """The ranks whose server went away (answered once, then refused)."""
        return sorted(r for r, s in self.ranks.items() if s.failure is not None and s.failure.gone)

    def gone_times(self) -> dict[int, float]:
        """When each rank whose server went away was first found gone."""
        return {r: s.failed_at for r, s in self.ranks.items()
                if s.failure is not None and s.failure.gone and s.failed_at is not None}  # fmt: skip

    def heard(self) -> list[int]:
        """The ranks that answered at least once."""
        return sorted(r for r, s in self.ranks.items() if s.sample is not None)

    def status(self, now: float) -> Status:
        groups = {name for s in self.ranks.values() if s.sample is not None for name in s.sample.marks}
        answering = [r for r, s in self.ranks.items() if s.answering]
        silent = tuple(sorted(r for r, s in self.ranks.items() if not s.answering))
        stacks = self.from_stacks()
        return Status(
            ranks=len(self.ranks),
            answering=len(answering),
            silent=silent,
            groups=len(groups),
            ops=self.ops(),
            ops_per_second=self.ops_per_second(),
            behind=None if stacks else self.behind(),
            outside=self.outside() if stacks else (),
            since_progress=self.since_progress(now),
            stalled=self.stalled(now),
            from_stacks=stacks,
            events=tuple(self._events),
        )


def _recorder_moved(before: Sample, after: Sample) -> bool:
    if before.records != after.records or set(before.marks) != set(after.marks):
        return True
    return any(before.marks[name].moves() != mark.moves() for name, mark in after.marks.items())
