"""Random parallel training programs, each with at most one fault, and the verdict each one calls for.

A program is a tp x pp x dp layout (with an expert group laid over dp at times) running some steps
of a pipeline schedule (1F1B or interleaved, single or batched send/recv) or plain forward/backward,
with tp all_reduces in every pass, uneven all_to_all in expert layers, scatter/gather/broadcast from a
non-zero root, coalesced gradient all_reduces, a ring buffer that may drop history, hosts whose
clocks are offset by tens of milliseconds, dumps in pickle or JSON. ``samples/nccl_sim.py`` runs it
the way NCCL and PyTorch would and writes the dumps; ``judge`` checks fr2perfetto's verdict on them.

Faults, and what a right verdict says:
- ``stop``: a rank's CPU stops between two ops (a data loader, a checkpoint write): it is the first
  culprit, as the rank that never issued what the others wait for (missing or p2p), or, with
  ``lost_dump``, as the rank that left no dump.
- ``skip``: a rank skips one collective and goes on: it is the first culprit (missing, a mismatch
  where the next op differs, the first of a deadlock, or not_started where its stream stalls first).
  Undecided (not wrong) where two ranks each issued the other's op second and nothing else in the
  dumps says which order is the program's: a deadlock that names both and says it cannot tell.
- ``size``, ``dtype``, ``op``: a rank passes another size, dtype or op: that mismatch, that rank (with
  three members or more; with two, nobody can tell which side is wrong: undecided, of that mismatch,
  is the right verdict).
- ``kernel_hang``: a compute kernel of one rank never finishes: with timing on, that rank, whose next
  kernel never started (not_started); without, a hang nobody can be blamed for (stuck, or undecided).
- ``gpu_hang``: one collective never completes on any member: stuck, nobody to blame.
- ``late``: a rank enqueues one group's collectives late: slow, that rank a straggler.
- ``dead_rank``: a rank dies between two ops and leaves no dump; the others wait in an op it belongs
  to, in dumps that say little of it (no timing, or gloo's entries: no states, only ``retired`` and
  ``pg_status``): a hang, that rank first, for want of its dump (no_dump). Or it died after its last
  op, when nobody needed it any more: undecided (nobody named) or a hang that names it first; never
  healthy, since a lost dump may hide anything.
- ``late_timeout``: a rank's CPU is stuck (I/O) for longer than the op's timeout before it enters one
  collective, which then completes: every dump holds every op, nothing is missing, yet the peers had
  given up on it: a hang, that rank first, entered after the timeout (after_timeout).
- ``sibling_skip``: a rank skips one collective of a 2-member group that has siblings of its shape (a
  tp or dp pair) and goes on into an op of a larger group: a hang, that rank first (undecided only as
  for ``skip``). Its sibling pairs show the order the program has.
- ``two_runs``: the dumps of two runs (an older and a newer one, one of them or both with a fault),
  written into one folder (``attempt_1/`` and ``attempt_2/``, or side by side under two prefixes)
  minutes apart and read back with ``load_job``: the verdict of the newest run read alone, with no
  dump of the older one in it.
- ``healthy``: healthy, and no finding but stragglers (none expected).

Whatever the fault, the verdict is also made of the same dumps redacted (as ``--redact`` does), and
must come out the same (status, culprits, kinds of findings); a faulty program is never healthy, and
the exit code is 0 for ``healthy`` alone.
"""

from __future__ import annotations

import copy
import itertools
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "samples"))

import nccl_sim as sim

from fr2perfetto.base.model import Finding, RankDump
from fr2perfetto.convert import Analysis, analyse
from fr2perfetto.diagnose.verdict import exit_code
from fr2perfetto.read.columns import JobTables, column_bytes, from_entries
from fr2perfetto.read.job import build_job, load_job
from fr2perfetto.read.reader import normalise
from fr2perfetto.read.redact import redact_dumps

from .agreement import disagreements

# The faults every seed drew from before the newer ones came: a seed that draws one of them still makes
# the program it always made (``_draw_fault``), so that seeds quoted in tests keep their meaning.
FIRST_FAULTS = ("healthy", "stop", "lost_dump", "skip", "size", "dtype", "op", "kernel_hang", "gpu_hang", "late")
FAULTS = (*FIRST_FAULTS, "dead_rank", "late_timeout", "sibling_skip")  # the default mix
# Left out of the default mix: one writes, reads and analyses three folders of files, five times what a
# program costs otherwise. Asked for by name (``--fault``), or with every fault (``--all``).
ALONE_FAULTS = ("two_runs",)
ALL_FAULTS = FAULTS + ALONE_FAULTS
MISMATCH_FAULTS = {"size": "size_mismatch", "dtype": "dtype_mismatch", "op": "type_mismatch"}
SKIP_KINDS = {"missing", "deadlock", "p2p", "not_started", *MISMATCH_FAULTS.values()}


@dataclass
class Scenario:
    """A generated program, how its dumps were taken, the fault in it and what a right verdict says."""

    seed: int
    fault: str
    train: sim.Training
    job: sim.SimJob
    options: sim.DumpOptions
    culprit: int | None = None
    group: str | None = None  # the group the fault is in
    lost: tuple[int, ...] = ()
    json_ranks: tuple[int, ...] = ()
    wrap: float | None = None  # the ring buffer keeps this share of the shortest rank's entries
    notes: list[str] = field(default_factory=list)
    # dead_rank: "waited" or "ended"; two_runs: "attempts" or "flat"
    variant: str = ""
    older: Scenario | None = None  # two_runs: the older run (this scenario is the newer one)
    inner: str = ""  # two_runs: the newer run's own fault
    later_ns: int = 0  # two_runs: how long after the older run's last dump the newer one starts

    @property
    def faulty(self) -> bool:
        """Whether the dumps analysed hold a fault (for two runs: the newer run does)."""
        return (self.inner if self.fault == "two_runs" else self.fault) != "healthy"

    def describe(self) -> str:
        g = self.train.grid
        fault = self.fault + (f" ({self.variant})" if self.variant else "")
        if self.fault == "two_runs" and self.older is not None:
            fault += f": newer {self.inner}, older {self.older.fault}"
            if self.older.culprit is not None:
                fault += f" on rank {self.older.culprit}"
            if self.older.train.grid != g:
                og = self.older.train.grid
                fault += f" (older tp{og.tp} pp{og.pp} dp{og.dp})"
            fault += "; newer"
        parts = [
            f"seed {self.seed}: {fault}" + (f" on rank {self.culprit}" if self.culprit is not None else ""),
            f"tp{g.tp} pp{g.pp} dp{g.dp}",
            f"{self.train.chunks} chunk(s)", "batched" if self.train.batched_p2p else "single p2p",
            f"{self.train.microbatches} microbatches x {self.train.steps} steps",
            "timing" if self.options.timing else "no timing", f"buffer {self.options.buffer}",
        ]  # fmt: skip
        if self.options.clock_offset:
            parts.append("clocks offset")
        if self.options.legacy_batch_seq:
            parts.append("legacy batch seqs")
        if self.options.backend != "nccl":
            parts.append(f"{self.options.backend} recorder")
        return ", ".join(parts + self.notes)


def generate(seed: int, fault: str | None = None, mix: tuple[str, ...] = FAULTS) -> Scenario:
    """A random program with ``fault`` (or one drawn from ``mix``), simulated, ready to dump."""
    rng = random.Random(seed)
    fault = fault or _draw_fault(seed, rng, mix)
    if fault == "two_runs":
        return _two_runs(seed, rng)
    # a dead rank's dumps are often gloo's, which record no send or recv: a layout without a pipeline
    no_pipeline = fault == "dead_rank" and rng.random() < 0.35
    for _ in range(50):
        grid = sim.Grid(tp=rng.choice([1, 2, 2, 4]), pp=rng.choice([1, 2, 2, 3, 4]), dp=rng.choice([1, 2, 2, 3]))
        if 2 <= grid.world <= 16 and _fits(fault, grid) and not (no_pipeline and grid.pp > 1):
            break
    chunks = rng.choice([1, 1, 2]) if grid.pp >= 2 else 1
    train = sim.Training(
        grid,
        steps=rng.choice([1, 2, 2, 3]),
        microbatches=rng.randint(max(1, grid.pp), 2 * grid.pp + 1),
        chunks=chunks,
        batched_p2p=rng.random() < 0.5,
        tp_ops=rng.choice([1, 2]),
        moe=grid.dp >= 2 and rng.random() < 0.3,
        data_ops=grid.tp >= 2 and rng.random() < 0.3,
        coalesced_grads=grid.dp >= 2 and rng.random() < 0.3,
        pp_all_reduce=grid.pp >= 2 and rng.random() < 0.3,
        sync_p2p=rng.random() < 0.5,
        compute_ns=rng.choice([5, 20, 50]) * sim.MS,
        seed=seed,
    )
    groups = sim.grid_groups(grid, ep=train.moe)
    programs = sim.training_programs(train, groups)
    job = sim.SimJob(groups, programs, start_ns={r: rng.randrange(2 * sim.MS) for r in programs})
    options = sim.DumpOptions(
        timing=rng.random() < 0.7,
        poll_ns=rng.choice([2, 10, 50, 100]) * sim.MS,
        legacy_batch_seq=train.batched_p2p and rng.random() < 0.2,
        seed=seed,
    )
    if rng.random() < 0.5:
        host_size = rng.choice([2, 4, 8])
        offsets = {h: rng.randint(-50, 50) * sim.MS for h in range(grid.world)}
        options.clock_offset = {r: offsets[r // host_size] if r >= host_size else 0 for r in programs}
    scenario = Scenario(seed, fault, train, job, options)
    scenario.json_ranks = tuple(r for r in programs if rng.random() < 0.15)
    _inject(scenario, rng)
    # a fault read from when ops began (a straggler's lag, an entry after the timeout) needs them all
    if rng.random() < 0.3 and scenario.fault not in ("late", "late_timeout"):
        scenario.wrap = rng.uniform(0.3, 0.8)
    return scenario


def _draw_fault(seed: int, rng: random.Random, mix: tuple[str, ...]) -> str:
    """The fault of a seed: the draw from ``FIRST_FAULTS`` every seed has always made, unless a draw of
    its own gives the seed one of the newer faults of ``mix`` (in their share of ``mix``)."""
    fault = rng.choice(FIRST_FAULTS)
    newer = [f for f in mix if f not in FIRST_FAULTS]
    draw = random.Random(f"newer fault {seed}")
    if newer and draw.random() < len(newer) / len(mix):
        return draw.choice(newer)
    return fault


def _fits(fault: str, grid: sim.Grid) -> bool:
    """Whether a layout can hold the fault: a straggler needs a group with a dozen collectives or more
    (tp groups have them; else it would mostly fall back to a healthy program); a sibling skip needs
    2-rank groups (tp or dp pairs) that have siblings, and a larger group to go on into."""
    if fault == "late":
        return grid.tp >= 2
    if fault == "sibling_skip":
        pairs = (grid.tp == 2 and grid.pp * grid.dp >= 2) or (grid.dp == 2 and grid.tp * grid.pp >= 2)
        return pairs and grid.world >= 3
    return True


def _comm_indices(program: list[sim.Action]) -> list[int]:
    return [i for i, a in enumerate(program) if a.kind not in (sim.COMPUTE, sim.SYNC)]


def _inject(scenario: Scenario, rng: random.Random) -> None:
    """Put the scenario's fault into its programs (and dumps)."""
    fault, job = scenario.fault, scenario.job
    if fault == "healthy":
        return
    rank = rng.choice(sorted(job.programs))
    program = job.programs[rank]
    comm = _comm_indices(program)
    scenario.culprit = rank
    newer = {"dead_rank": _inject_dead_rank, "late_timeout": _inject_late_timeout, "sibling_skip": _inject_sibling_skip}
    if fault in newer:
        newer[fault](scenario, rank, rng)
        return
    if fault in ("stop", "lost_dump"):
        at = comm[rng.randrange(len(comm) // 4, len(comm))]
        job.stop_at[rank] = at
        scenario.notes.append(f"stops before action {at}")
        if fault == "lost_dump":
            scenario.lost = (rank,)
        return
    plain = _plain_collectives(job, program)
    if fault in ("skip", "size", "dtype", "op"):
        if fault == "size":
            plain = [i for i in plain if program[i].op in ("all_reduce", "broadcast", "_reduce_scatter_base")]
        if not plain:
            scenario.fault, scenario.culprit = "healthy", None
            return
        at = rng.choice(plain[len(plain) // 4 :])
        action = program[at]
        scenario.group = action.group
        scenario.notes.append(f"{fault} at action {at} ({action.op} on group {action.group})")
        if fault == "skip":
            del program[at]
            _shift_needs(program, at)
        elif fault == "size":
            program[at] = replace(action, inputs=tuple((s[0] * 2, *s[1:]) for s in action.inputs))
        elif fault == "dtype":
            program[at] = replace(action, dtype="Float" if action.dtype != "Float" else "BFloat16")
        else:
            program[at] = replace(action, op="broadcast" if action.op != "broadcast" else "all_reduce")
        return
    if fault == "kernel_hang":
        at = comm[rng.randrange(len(comm) // 4, len(comm))]
        program.insert(at, sim.compute(1_000_000, site="forward", hang=True))
        _shift_needs(program, at, by=1)
        scenario.notes.append(f"a kernel hangs before action {at + 1}")
        return
    if fault == "gpu_hang":
        at = rng.choice(plain[len(plain) // 4 :]) if plain else None
        if at is None:
            scenario.fault, scenario.culprit = "healthy", None
            return
        name = program[at].group
        ordinal = sum(1 for a in program[:at] if a.kind == sim.COLLECTIVE and a.group == name)
        scenario.culprit, scenario.group = None, name
        for member in job.groups[name][1]:
            member_program = job.programs[member]
            seen = -1
            for i, a in enumerate(member_program):
                if a.kind == sim.COLLECTIVE and a.group == name:
                    seen += 1
                    if seen == ordinal:
                        member_program[i] = replace(a, hang=True)
                        break
        scenario.notes.append(f"collective #{ordinal + 1} of group {name} never completes")
        return
    if fault == "late":
        counts: dict[str, int] = {}
        for i in plain:
            counts[program[i].group] = counts.get(program[i].group, 0) + 1
        names = sorted(name for name, count in counts.items() if count >= 12)
        if not names:
            scenario.fault, scenario.culprit = "healthy", None
            return
        name = rng.choice(names)
        scenario.group = name
        lag = rng.randint(150, 300) * sim.MS
        new: list[sim.Action] = []
        mapping = {}
        for i, a in enumerate(program):
            if a.kind == sim.COLLECTIVE and a.group == name:
                new.append(sim.Action(sim.COMPUTE, cpu_ns=lag, gpu_ns=0, site="load_batch"))
            mapping[i] = len(new)
            new.append(a)
        job.programs[rank] = [replace(a, needs=tuple(mapping[n] for n in a.needs)) if a.needs else a for a in new]
        scenario.notes.append(f"{lag // sim.MS} ms late in group {name}")
        return
    raise ValueError(fault)


def _inject_dead_rank(scenario: Scenario, rank: int, rng: random.Random) -> None:
    """The rank dies and leaves no dump. Mostly between two ops, with the others waiting for it in dumps
    that carry no start events (gloo's, where the job has no send or recv for gloo to leave out, carry
    no state at all); else after its last op (``ended``), once nobody needed it.

    gloo's pg_config names no member once subgroups exist, so that a lost dump of the job's last rank
    leaves no trace of that rank at all: with gloo, the rank that dies is one below the last."""
    job, options = scenario.job, scenario.options
    if rng.random() < 0.25:
        scenario.lost = (rank,)
        scenario.variant = "ended"
        scenario.notes.append("dies after its last op")
        return
    scenario.variant = "waited"
    options.timing = False
    if scenario.train.grid.pp == 1 and rng.random() < 0.8:
        options.backend = "gloo"
        for member, program in job.programs.items():
            job.programs[member] = _blocking_collectives(program)
        if rank == job.world - 1:
            rank = scenario.culprit = rng.randrange(job.world - 1)
    scenario.lost = (rank,)
    comm = _comm_indices(job.programs[rank])
    at = comm[rng.randrange(len(comm) // 4, len(comm))]
    job.stop_at[rank] = at
    scenario.notes.append(f"dies before action {at}")


def _blocking_collectives(program: list[sim.Action]) -> list[sim.Action]:
    """The program as gloo runs it: a collective called without ``async_op`` returns once it is done, so
    the CPU waits for it (a sync after it, as far as the simulation goes)."""
    new: list[sim.Action] = []
    mapping = {}
    for i, action in enumerate(program):
        mapping[i] = len(new)
        new.append(action)
        if action.kind == sim.COLLECTIVE and not action.async_op and not action.parts:
            new.append(sim.sync(site=action.site))
    return [replace(a, needs=tuple(mapping[n] for n in a.needs)) if a.needs else a for a in new]


TIMEOUTS_MS = (1_000, 2_000, 5_000)


def _inject_late_timeout(scenario: Scenario, rank: int, rng: random.Random) -> None:
    """The rank's CPU is stuck (I/O) for 2 to 3 times the ops' timeout before one collective, which it
    then enters more than the timeout after its first peer did. The dumps are taken once the job is over,
    so that every one holds every op, completed. The timeout is set above twice the widest natural spread
    of any op's entries, so that only the ops the stuck rank held up were entered after it."""
    job, options = scenario.job, scenario.options
    program = job.programs[rank]
    plain = _plain_collectives(job, program)
    if not plain:
        scenario.fault, scenario.culprit = "healthy", None
        return
    at = rng.choice(plain[len(plain) // 4 :])
    action = program[at]
    scenario.group = action.group
    times = sim.simulate(job)
    spread = _widest_spread(job, times)
    timeout_ms = max(rng.choice(TIMEOUTS_MS), -(-2 * spread // (1_000 * sim.MS)) * 1_000)
    ordinal = _ordinal(program, at)
    first_peer = min(
        times[m][_nth_collective(job.programs[m], action.group, ordinal)].issued
        for m in job.groups[action.group][1]
        if m != rank
    )
    behind = times[rank][at].issued - first_peer  # below 0 where the rank would have entered first
    delay = int(rng.uniform(2, 3) * timeout_ms * sim.MS) + max(0, -behind)
    program.insert(at, sim.Action(sim.COMPUTE, cpu_ns=delay, gpu_ns=0, site="load_batch"))
    _shift_needs(program, at, by=1)
    options.timeout_ms = timeout_ms
    options.dump_on_timeout = False
    scenario.notes.append(
        f"CPU stuck {delay // sim.MS} ms before {action.op} #{ordinal + 1} of group {action.group}, "
        f"timeout {timeout_ms} ms"
    )


def _inject_sibling_skip(scenario: Scenario, rank: int, rng: random.Random) -> None:
    """The rank skips a collective of a 2-rank group with siblings of its kind (another tp or dp pair)
    whose next op, on that rank, is in a larger group."""
    job = scenario.job
    program = job.programs[rank]
    kinds: dict[tuple[str, int], int] = {}
    for desc, members in job.groups.values():
        kinds[(desc, len(members))] = kinds.get((desc, len(members)), 0) + 1
    following = dict(itertools.pairwise(_comm_indices(program)))
    candidates = []
    for i in _plain_collectives(job, program):
        desc, members = job.groups[program[i].group]
        after = following.get(i)
        larger = after is not None and len(job.groups[program[after].group][1]) > 2
        if len(members) == 2 and kinds[(desc, 2)] >= 2 and larger:
            candidates.append(i)
    if not candidates:
        scenario.fault, scenario.culprit = "healthy", None
        return
    at = rng.choice(candidates[len(candidates) // 4 :])
    action = program[at]
    scenario.group = action.group
    after = program[following[at]]
    scenario.notes.append(
        f"skips action {at} ({action.op} on group {action.group}), goes on to {after.op} on group {after.group}"
    )
    del program[at]
    _shift_needs(program, at)


def _plain_collectives(job: sim.SimJob, program: list[sim.Action]) -> list[int]:
    """Indices of the program's single collectives (no coalesced group) of groups of two ranks or more."""
    return [i for i, a in enumerate(program) if a.kind == sim.COLLECTIVE and not a.parts
            and len(job.groups[a.group][1]) >= 2]  # fmt: skip


def _ordinal(program: list[sim.Action], at: int) -> int:
    """The place (from 0) of the collective at ``at`` among the collectives of its group."""
    name = program[at].group
    return sum(1 for a in program[:at] if a.kind == sim.COLLECTIVE and a.group == name)


def _nth_collective(program: list[sim.Action], name: str, ordinal: int) -> int:
    """The index of the ``ordinal``-th collective (from 0) of group ``name`` in the program."""
    seen = -1
    for i, a in enumerate(program):
        if a.kind == sim.COLLECTIVE and a.group == name:
            seen += 1
            if seen == ordinal:
                return i
    raise IndexError(f"no collective #{ordinal} of group {name}")


def _widest_spread(job: sim.SimJob, times: dict[int, list[sim.Timing]]) -> int:
    """The widest gap, in ns, between the first and the last member to enter one collective, or between
    the two ends of one send/recv, as the job runs."""
    entered: dict[tuple[object, ...], list[int]] = {}
    for rank, program in job.programs.items():
        counts: dict[tuple[object, ...], int] = {}
        for action, timing in zip(program, times[rank], strict=True):
            if action.kind == sim.COLLECTIVE:
                keys: list[tuple[object, ...]] = [(action.group,)]
            elif action.kind in (sim.SEND, sim.RECV, sim.BATCH):
                keys = [
                    (action.group, rank, part.peer) if part.kind == sim.SEND else (action.group, part.peer, rank)
                    for part in action.parts or (action,)
                ]
            else:
                continue
            for key in keys:
                n = counts[key] = counts.get(key, 0) + 1
                entered.setdefault((*key, n), []).append(timing.issued)
    return max((max(t) - min(t) for t in entered.values() if len(t) > 1), default=0)


def _shift_needs(program: list[sim.Action], at: int, by: int = -1) -> None:
    """Keep compute's references to earlier actions right after an action is removed (-1) or inserted."""
    for i, action in enumerate(program):
        if action.needs and i >= at:
            needs = tuple(n + by if n >= at else n for n in action.needs if not (by < 0 and n == at))
            program[i] = replace(action, needs=needs)


def dumps(scenario: Scenario) -> dict[int, dict[str, object]]:
    """Simulate the scenario and return each rank's dump document (lost ones left out).

    A wrapping ring buffer drops history, never the ops still in flight when the job was dumped: a
    rank blocks soon after the first op it waits in, so the buffer real jobs use (2000 entries by
    default) keeps them; a smaller one would leave nothing to diagnose."""
    times = sim.simulate(scenario.job)
    documents = sim.dump_documents(scenario.job, times, scenario.options)
    if scenario.wrap is not None:
        live = 0  # the most entries any rank issued from its first op still in flight on
        for rank, doc in documents.items():
            dumped = doc["dumped_at"]
            count = 0
            for action, timing in zip(reversed(scenario.job.programs[rank]), reversed(times[rank]), strict=True):
                if timing.issued <= dumped:
                    count += sim.entries_of(action)
                    if action.kind not in (sim.COMPUTE, sim.SYNC) and timing.completed > dumped:
                        live = max(live, count)
        shortest = min(len(doc["entries"]) for doc in documents.values())
        buffer = max(live + 8, 64, int(shortest * scenario.wrap))
        scenario.options.buffer = buffer
        for doc in documents.values():
            doc["entries"] = doc["entries"][-buffer:]
    return {rank: doc for rank, doc in documents.items() if rank not in scenario.lost}


def read_documents(
    documents: dict[int, dict[str, object]], json_ranks: tuple[int, ...] = (), as_columns: bool = True
) -> dict[int, RankDump]:
    """Dump documents read as the reader reads an unpickled (or JSON) file: each rank's entries made from its
    columns, ids into one set of tables, as ``load_job`` gives them (``as_columns=False``: held as a list,
    as ``read_dump`` gives a JSON file's)."""
    read: dict[int, RankDump] = {}
    tables = JobTables({})
    for rank, doc in documents.items():
        raw = {k: v for k, v in doc.items() if k not in ("pg_status_lists", "dumped_at")}
        if rank in json_ranks:
            raw = _as_json(raw)
        dump = read[rank] = normalise(raw, rank=rank, path=f"/dumps/nccl_trace_rank_{rank}", host=None,
                                      file_format="json" if rank in json_ranks else "pickle")  # fmt: skip
        if as_columns:
            made = from_entries(rank, dump.entries)
            tables.fill(dump, column_bytes(made), made.tables)
    return read


def analyse_documents(documents: dict[int, dict[str, object]], json_ranks: tuple[int, ...] = ()) -> Analysis:
    """fr2perfetto's analysis of dump documents, read as the reader reads an unpickled (or JSON) file."""
    return analyse(build_job(read_documents(documents, json_ranks)))


def analyse_twice(read: dict[int, RankDump]) -> tuple[Analysis, Analysis]:
    """The analysis of dumps as read, and of the same dumps redacted as ``load_job(..., redact=True)``
    redacts them. Redaction replaces a dump's fields rather than changing them, so the redacted copies
    are shallow (the list that matching appends to excepted): reading the files once serves both."""
    copies = {}
    for rank, dump in read.items():
        copies[rank] = copy.copy(dump)
        copies[rank].renumbered_groups = list(dump.renumbered_groups)
    problems = redact_dumps(copies, [], keep_names=False)
    return analyse(build_job(read)), analyse(build_job(copies, problems))


def _as_json(raw: dict[str, object]) -> dict[str, object]:
    import json

    from nccl_layout import _json_entry  # the layout dump_json writes

    doc = dict(raw)
    doc["entries"] = [_json_entry(e) for e in raw["entries"]]  # type: ignore[union-attr]
    doc["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in raw["pg_status"].items()}  # type: ignore[union-attr]
    return json.loads(json.dumps(doc))


# ---------------------------------------------------------------------------------------------------
# Two runs in one folder


def _two_runs(seed: int, rng: random.Random) -> Scenario:
    """Two runs of one job, the newer one started minutes after the older one was dumped: one of them
    healthy and the other faulty, or both faulty. Mostly the same program (a restart), else another
    layout (a resized job). The faults are those whose verdicts stand alone, and the lost dump that
    an older run's dump of the same rank could stand in for: what is judged is which dumps are read."""
    faults = [*FIRST_FAULTS[1:], "dead_rank"]
    fault = rng.choice(faults)
    newer_fault, older_fault = rng.choice([("healthy", fault), (fault, "healthy"), (fault, rng.choice(faults))])
    base = rng.randrange(1 << 30)
    older = generate(base if rng.random() < 0.75 else base + 1, older_fault)
    newer = generate(base, newer_fault)
    newer.inner, newer.fault, newer.seed, newer.older = newer.fault, "two_runs", seed, older
    newer.variant = rng.choice(["attempts", "flat"])
    newer.later_ns = rng.randint(2, 30) * 60_000 * sim.MS
    newer.notes.append(f"started {newer.later_ns // (60_000 * sim.MS)} min after the older run's dumps")
    return newer


RUN_PREFIXES = (("old_nccl_trace_rank_", "nccl_trace_rank_"), ("nccl_trace_rank_", "retry_nccl_trace_rank_"))


def _write_runs(scenario: Scenario, folder: str, rng: random.Random) -> tuple[str, list[str]]:
    """Write both runs' dumps into ``folder`` (as ``scenario.variant`` says), and the newer run's alone
    into a folder beside it; the files' times are the runs' own, minutes apart. Returns the newer run's
    folder and the paths of its files in ``folder``."""
    assert scenario.older is not None
    older, newer = scenario.older, scenario
    older_docs = dumps(older)
    start = max(int(doc["dumped_at"]) for doc in older_docs.values()) + newer.later_ns  # type: ignore[call-overload]
    newer.options.clock_offset = {r: newer.options.clock_offset.get(r, 0) + start for r in newer.job.programs}
    newer_docs = dumps(newer)
    if newer.variant == "attempts":
        old_dir, new_dir = os.path.join(folder, "attempt_1"), os.path.join(folder, "attempt_2")
        old_prefix = new_prefix = "nccl_trace_rank_"
    else:
        old_dir = new_dir = folder
        old_prefix, new_prefix = rng.choice(RUN_PREFIXES)
    _write_run(older, older_docs, old_dir, old_prefix)
    paths = _write_run(newer, newer_docs, new_dir, new_prefix)
    alone = folder + "_newest"
    _write_run(newer, newer_docs, alone, new_prefix)
    return alone, paths


def _write_run(scenario: Scenario, documents: dict[int, dict[str, object]], folder: str, prefix: str) -> list[str]:
    """Write a run's dumps, each file dated when its rank was dumped."""
    paths = sim.write_dumps(documents, folder, json_ranks=scenario.json_ranks, prefix=prefix)
    offsets = scenario.options.clock_offset
    for path in paths:
        rank = int(path.rsplit("_", 1)[1].removesuffix(".json"))
        when = sim.T0 + offsets.get(rank, 0) + int(documents[rank]["dumped_at"])  # type: ignore[call-overload]
        os.utime(path, ns=(when, when))
    return paths


# ---------------------------------------------------------------------------------------------------
# Judging


RIGHT, UNDECIDED, WRONG = "right", "undecided", "wrong"


class Judged(NamedTuple):
    """One program judged: the program, RIGHT/UNDECIDED/WRONG, what fr2perfetto said, its status, and what
    it said of the same dumps redacted where that differs in status, culprits or kinds ("" where not)."""

    scenario: Scenario
    outcome: str
    said: str
    status: str
    redaction_differs: str


def judge(
    scenario: Scenario, analysis: Analysis, redacted: Analysis | None = None, alone: Analysis | None = None
) -> tuple[str, str]:
    """Whether fr2perfetto's verdict is the one the scenario calls for (``RIGHT``), an honest "cannot
    tell" where the dumps of two ranks are symmetric (``UNDECIDED``), or ``WRONG``; and what it said.

    Whatever the fault, a verdict is wrong where its words contradict each other, where the same dumps
    redacted (``redacted``) get another status, other culprits or other kinds of findings, where the exit
    code is 0 for anything but healthy (or not 0 for healthy), or where a faulty program is called
    healthy. ``alone``: for two runs, the analysis of the newer run's dumps read alone."""
    verdict = analysis.diagnosis.verdict
    said = verdict_line(analysis)
    contradictions = disagreements(analysis.diagnosis)
    if contradictions:  # right or not, words that contradict each other mislead
        return WRONG, f"{said}\n  its words disagree: {'; '.join(contradictions)}"
    if redacted is not None and _gist(redacted) != _gist(analysis):
        return WRONG, f"{said}\n  redacted, it says: {verdict_line(redacted)}"
    if (exit_code(verdict.status) == 0) != (verdict.status == "healthy"):
        return WRONG, f"{said}\n  exit code {exit_code(verdict.status)}"
    if scenario.faulty and verdict.status == "healthy":
        return WRONG, f"{said}\n  a faulty program called healthy"
    if scenario.fault == "two_runs":
        return _judge_two_runs(scenario, analysis, alone), said
    right, undecided = _contract(scenario, analysis)
    return (RIGHT if right else UNDECIDED if undecided else WRONG), said


def verdict_line(analysis: Analysis) -> str:
    """The verdict's status, culprits and summary, and the kinds of the findings in order, on one line."""
    verdict = analysis.diagnosis.verdict
    kinds = [f.kind for f in analysis.diagnosis.findings]
    return f"{verdict.status} culprits={list(verdict.culprit_ranks)} kinds={kinds}: {verdict.summary}"


def _gist(analysis: Analysis) -> tuple[object, ...]:
    """What redaction must leave as it was: status, culprits, the kinds of the findings in order."""
    verdict = analysis.diagnosis.verdict
    return verdict.status, tuple(verdict.culprit_ranks), tuple(f.kind for f in analysis.diagnosis.findings)


def _judge_two_runs(scenario: Scenario, analysis: Analysis, alone: Analysis | None) -> str:
    """Right where the verdict is the newer run's read alone (status and culprits) and every dump it was
    made of is the newer run's."""
    assert alone is not None
    mine, theirs = analysis.diagnosis.verdict, alone.diagnosis.verdict
    newer = {os.path.basename(d.path) for d in alone.job.dumps.values()}
    mixed = any(os.path.basename(d.path) not in newer or "attempt_1" in d.path for d in analysis.job.dumps.values())
    same = (mine.status, mine.culprit_ranks) == (theirs.status, theirs.culprit_ranks)
    return RIGHT if same and not mixed else WRONG


def _contract(scenario: Scenario, analysis: Analysis) -> tuple[bool, bool]:
    """(right, undecided) by the fault's own contract (the module's docstring)."""
    verdict = analysis.diagnosis.verdict
    kinds = [f.kind for f in analysis.diagnosis.findings]
    fault, culprit = scenario.fault, scenario.culprit
    top = _top_finding(analysis)
    top_kind = top.kind if top is not None else None
    first = verdict.culprit_ranks[:1] == (culprit,)
    if fault == "healthy":
        return verdict.status == "healthy" and not kinds, False
    if fault == "late":
        return verdict.status == "slow" and set(kinds) == {"straggler"} and first, False
    if fault == "gpu_hang":
        return verdict.status == "hang" and top_kind == "stuck" and not verdict.culprit_ranks, False
    if fault == "kernel_hang":
        if scenario.options.timing:
            return first and top_kind == "not_started", False
        # without start events nothing tells a hung kernel from a queued one: nobody may be blamed
        return verdict.status in ("hang", "undecided") and not verdict.culprit_ranks, False
    if fault == "dead_rank" and scenario.variant == "ended":
        # nobody waited for it, yet its dump is lost: undecided, or a hang of that rank; never healthy
        return (verdict.status == "undecided" and not verdict.culprit_ranks) or (
            verdict.status == "hang" and first
        ), False
    two_members = scenario.group is not None and len(scenario.job.groups[scenario.group][1]) == 2
    if fault in MISMATCH_FAULTS and two_members:
        # which of two members is wrong the op alone cannot tell: saying so, of that mismatch, is right; so
        # is naming the member that differs from what the group's siblings agree on
        said_undecided = verdict.status == "undecided" and not verdict.culprit_ranks
        return (said_undecided or first) and top_kind == MISMATCH_FAULTS[fault], False
    if verdict.status == "undecided" and not verdict.culprit_ranks:
        return False, True  # says it cannot tell: no rank is wrongly blamed
    if fault in ("stop", "lost_dump"):
        expected = {"no_dump"} if fault == "lost_dump" else {"missing", "p2p"}
        return first and top_kind in expected, False
    if fault == "dead_rank":
        return verdict.status == "hang" and first and top_kind == "no_dump", False
    if fault == "late_timeout":
        return verdict.status == "hang" and first and top_kind == "after_timeout", False
    if fault in MISMATCH_FAULTS:
        return first and top_kind == MISMATCH_FAULTS[fault], False
    if fault in ("skip", "sibling_skip"):
        # A rank that skipped an op may be seen first where its stream stalls: its kernel never started.
        undecided = (
            top is not None
            and top_kind == "deadlock"
            and culprit in top.culprit_ranks
            and any("cannot say which side" in line for line in top.evidence)
        )
        hang = fault == "skip" or verdict.status == "hang" or top_kind in MISMATCH_FAULTS.values()
        return first and top_kind in SKIP_KINDS and hang and not undecided, undecided
    raise ValueError(fault)


def _top_finding(analysis: Analysis) -> Finding | None:
    """The finding the verdict leads with."""
    verdict = analysis.diagnosis.verdict
    for finding in analysis.diagnosis.findings:
        if verdict.summary.endswith(finding.summary):
            return finding
    return None


def examine(seed: int, fault: str | None = None, mix: tuple[str, ...] = FAULTS) -> Judged:
    """Generate, simulate, analyse (as read and redacted) and judge one scenario."""
    scenario = generate(seed, fault, mix)
    if scenario.fault == "two_runs":
        return _examine_two_runs(scenario)
    analysis, redacted = analyse_twice(read_documents(dumps(scenario), scenario.json_ranks))
    outcome, said = judge(scenario, analysis, redacted)
    return _judged(scenario, outcome, said, analysis, redacted)


def _judged(scenario: Scenario, outcome: str, said: str, analysis: Analysis, redacted: Analysis) -> Judged:
    differs = verdict_line(redacted) if _gist(redacted) != _gist(analysis) else ""
    return Judged(scenario, outcome, said, analysis.diagnosis.verdict.status, differs)


def _examine_two_runs(scenario: Scenario) -> Judged:
    """Write both runs into a folder, read it as ``fr2perfetto analyze FOLDER`` reads it (and redacted),
    and judge it against the newer run read alone."""
    with tempfile.TemporaryDirectory(prefix="fr2perfetto-runs-") as root:
        folder = os.path.join(root, "dumps")
        alone, _ = _write_runs(scenario, folder, random.Random(scenario.seed))
        analysis = analyse(load_job([folder], jobs=1))
        redacted = analyse(load_job([folder], jobs=1, redact=True))
        reference = analyse(load_job([alone], jobs=1))
        outcome, said = judge(scenario, analysis, redacted, reference)
    if outcome == WRONG and "\n" not in said:
        said += f"\n  the newer run alone: {verdict_line(reference)}"
    return _judged(scenario, outcome, said, analysis, redacted)


def run(seed: int, fault: str | None = None) -> tuple[Scenario, str, str]:
    """Generate, simulate, analyse and judge one scenario: (scenario, RIGHT/UNDECIDED/WRONG, what it said)."""
    judged = examine(seed, fault)
    return judged.scenario, judged.outcome, judged.said
