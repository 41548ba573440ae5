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
- ``healthy``: healthy, and no finding but stragglers (none expected).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "samples"))

import nccl_sim as sim

from fr2perfetto.base.model import Finding, RankDump
from fr2perfetto.convert import Analysis, analyse
from fr2perfetto.read.job import build_job
from fr2perfetto.read.reader import normalise

from .agreement import disagreements

FAULTS = ("healthy", "stop", "lost_dump", "skip", "size", "dtype", "op", "kernel_hang", "gpu_hang", "late")
MISMATCH_FAULTS = {"size": "size_mismatch", "dtype": "dtype_mismatch", "op": "type_mismatch"}


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

    def describe(self) -> str:
        g = self.train.grid
        parts = [
            f"seed {self.seed}: {self.fault}" + (f" on rank {self.culprit}" if self.culprit is not None else ""),
            f"tp{g.tp} pp{g.pp} dp{g.dp}",
            f"{self.train.chunks} chunk(s)", "batched" if self.train.batched_p2p else "single p2p",
            f"{self.train.microbatches} microbatches x {self.train.steps} steps",
            "timing" if self.options.timing else "no timing", f"buffer {self.options.buffer}",
        ]  # fmt: skip
        if self.options.clock_offset:
            parts.append("clocks offset")
        if self.options.legacy_batch_seq:
            parts.append("legacy batch seqs")
        return ", ".join(parts + self.notes)


def generate(seed: int, fault: str | None = None) -> Scenario:
    """A random program with ``fault`` (or a random one), simulated, ready to dump."""
    rng = random.Random(seed)
    fault = fault or rng.choice(FAULTS)
    for _ in range(50):
        grid = sim.Grid(tp=rng.choice([1, 2, 2, 4]), pp=rng.choice([1, 2, 2, 3, 4]), dp=rng.choice([1, 2, 2, 3]))
        if 2 <= grid.world <= 16:
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
    if rng.random() < 0.3 and scenario.fault != "late":
        scenario.wrap = rng.uniform(0.3, 0.8)
    return scenario


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
    if fault in ("stop", "lost_dump"):
        at = comm[rng.randrange(len(comm) // 4, len(comm))]
        job.stop_at[rank] = at
        scenario.notes.append(f"stops before action {at}")
        if fault == "lost_dump":
            scenario.lost = (rank,)
        return
    plain = [i for i in comm if program[i].kind == sim.COLLECTIVE and not program[i].parts
             and len(job.groups[program[i].group][1]) >= 2]  # fmt: skip
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


def analyse_documents(documents: dict[int, dict[str, object]], json_ranks: tuple[int, ...] = ()) -> Analysis:
    """fr2perfetto's analysis of dump documents, read as the reader reads an unpickled (or JSON) file."""
    read: dict[int, RankDump] = {}
    for rank, doc in documents.items():
        raw = {k: v for k, v in doc.items() if k not in ("pg_status_lists", "dumped_at")}
        if rank in json_ranks:
            raw = _as_json(raw)
        read[rank] = normalise(raw, rank=rank, path=f"/dumps/nccl_trace_rank_{rank}", host=None,
                               file_format="json" if rank in json_ranks else "pickle")  # fmt: skip
    return analyse(build_job(read))


def _as_json(raw: dict[str, object]) -> dict[str, object]:
    import json

    from nccl_layout import _json_entry  # the layout dump_json writes

    doc = dict(raw)
    doc["entries"] = [_json_entry(e) for e in raw["entries"]]  # type: ignore[union-attr]
    doc["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in raw["pg_status"].items()}  # type: ignore[union-attr]
    return json.loads(json.dumps(doc))


RIGHT, UNDECIDED, WRONG = "right", "undecided", "wrong"


def judge(scenario: Scenario, analysis: Analysis) -> tuple[str, str]:
    """Whether fr2perfetto's verdict is the one the scenario calls for (``RIGHT``), an honest "cannot
    tell" where the dumps of two ranks are symmetric (``UNDECIDED``), or ``WRONG``; and what it said."""
    verdict = analysis.diagnosis.verdict
    kinds = [f.kind for f in analysis.diagnosis.findings]
    said = f"{verdict.status} culprits={list(verdict.culprit_ranks)} kinds={kinds}: {verdict.summary}"
    contradictions = disagreements(analysis.diagnosis)
    if contradictions:  # right or not, words that contradict each other mislead
        return WRONG, f"{said}\n  its words disagree: {'; '.join(contradictions)}"
    fault, culprit = scenario.fault, scenario.culprit
    top = _top_finding(analysis)
    top_kind = top.kind if top is not None else None
    first = verdict.culprit_ranks[:1] == (culprit,)

    def outcome(right: bool, undecided: bool = False) -> tuple[str, str]:
        return (RIGHT if right else UNDECIDED if undecided else WRONG), said

    if fault == "healthy":
        return outcome(verdict.status == "healthy" and not kinds)
    if fault == "late":
        return outcome(verdict.status == "slow" and set(kinds) == {"straggler"} and first)
    if fault == "gpu_hang":
        return outcome(verdict.status == "hang" and top_kind == "stuck" and not verdict.culprit_ranks)
    if fault == "kernel_hang":
        if scenario.options.timing:
            return outcome(first and top_kind == "not_started")
        # without start events nothing tells a hung kernel from a queued one: nobody may be blamed
        return outcome(verdict.status in ("hang", "undecided") and not verdict.culprit_ranks)
    two_members = scenario.group is not None and len(scenario.job.groups[scenario.group][1]) == 2
    if fault in MISMATCH_FAULTS and two_members:
        # which of two members is wrong nobody can tell: saying so, of that mismatch, is the right verdict
        return outcome(
            verdict.status == "undecided" and not verdict.culprit_ranks and top_kind == MISMATCH_FAULTS[fault]
        )
    if verdict.status == "undecided" and not verdict.culprit_ranks:
        return outcome(False, undecided=True)  # says it cannot tell: no rank is wrongly blamed
    if fault in ("stop", "lost_dump"):
        expected = {"no_dump"} if fault == "lost_dump" else {"missing", "p2p"}
        return outcome(first and top_kind in expected)
    if fault in MISMATCH_FAULTS:
        return outcome(first and top_kind == MISMATCH_FAULTS[fault])
    if fault == "skip":
        # A rank that skipped an op may be seen first where its stream stalls: its kernel never started.
        allowed = {"missing", "deadlock", "p2p", "not_started", *MISMATCH_FAULTS.values()}
        undecided = (
            top is not None
            and top_kind == "deadlock"
            and culprit in top.culprit_ranks
            and any("cannot say which side" in line for line in top.evidence)
        )
        return outcome(first and top_kind in allowed and not undecided, undecided)
    raise ValueError(fault)


def _top_finding(analysis: Analysis) -> Finding | None:
    """The finding the verdict leads with."""
    verdict = analysis.diagnosis.verdict
    for finding in analysis.diagnosis.findings:
        if verdict.summary.endswith(finding.summary):
            return finding
    return None


def run(seed: int, fault: str | None = None) -> tuple[Scenario, str, str]:
    """Generate, simulate, analyse and judge one scenario: (scenario, RIGHT/UNDECIDED/WRONG, what it said)."""
    scenario = generate(seed, fault)
    analysis = analyse_documents(dumps(scenario), scenario.json_ranks)
    outcome, said = judge(scenario, analysis)
    return scenario, outcome, said
