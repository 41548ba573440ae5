"""Simulate NCCL training jobs and write the Flight Recorder dumps PyTorch would leave.

CPU-only torch cannot run NCCL, so dumps of pipelines, batched send/recv, uneven all_to_all or hosts
whose clocks differ come from this model of how PyTorch 2.13 (``ProcessGroupNCCL.cpp``) and NCCL run a
job, given one program (a list of ``Action``) per rank:

- CPU: a rank issues its actions in order. Enqueueing a collective or a send/recv never blocks it; a
  ``sync`` (``loss.item()``, an optimizer step) waits until every kernel it issued has finished.
- Streams: kernels of one stream run one after the other. Compute, and collectives called with
  ``async_op=False``, run on the current stream (``collective`` takes ``getCurrentCUDAStream`` when
  ``!asyncOp``); async collectives, coalesced groups and batched send/recv on the group's NCCL stream
  (``ncclStreams_.at(getKeyFromDevice(device))``); a single send/recv on the stream of its pair
  (``getKeySendRecv``). An NCCL stream first waits for what the current stream had queued
  (``syncStream``); compute that uses a received tensor waits for it (``work.wait()``).
- Matching: NCCL pairs the k-th collective of every member of a group, and the k-th send from a to b
  with the k-th recv at b from a. A collective completes once every member's kernel runs, a send or
  recv once both ends run, a batch once each of its sends and recvs has its other end running. Members
  that disagree on the op, a size that must agree, or a dtype never complete.
- Counters (``collective``, ``pointToPoint``, ``endCoalescing``, ``initWork``): per group, seqCollective_
  counts collectives and coalesced groups, seqP2P_ single sends/recvs and batches, op_id_ every op;
  record_id counts a process's entries. The ops inside a coalesced group or batch are recorded with no
  events (``scheduled`` for ever); the entry that closes it carries the state, and is recorded with
  ``isP2POp(OpType::COALESCED)`` (false) and the group's current collective seq, even for a batch.
  ``legacy_batch_seq`` models the older ``startCoalescing``, which bumped seqCollective_ for every batch.
- Flight Recorder: ``started`` once the start event fired (timing on only), ``completed`` once the end
  event did, as the watchdog notices them on its next poll (or the dump queries them). A job that hangs
  is dumped when its first op passes the timeout, every other rank a little later; a job that finishes
  is dumped at its end (``dump_on_timeout=False``: every job is dumped at its end, a timeout or not).
  Each rank records times on its host's clock, which may be offset.
- ``backend="gloo"``: the same job recorded as ProcessGroupGloo records it (collectives only, entries
  without states or times, ``retired`` once done, ``pg_status`` counting op ids, ``comm_lib_version``
  empty, pg_config broken once subgroups exist); the timing model stays NCCL's.

Dumps are written with ``nccl_layout``'s entry and file layout. ``python samples/nccl_sim.py OUT_DIR``
writes the pipeline samples.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nccl_layout import T0, dump_bytes, entry_dict

COMPUTE, COLLECTIVE, SEND, RECV, BATCH, SYNC = "compute", "collective", "send", "recv", "batch", "sync"
STATUS_KEYS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
NEVER = 1 << 62  # a time that never comes
MS = 1_000_000

Sizes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Action:
    """One step of a rank's program."""

    kind: str
    group: str = ""  # the process group's name
    op: str = ""  # collectives: PyTorch's name for it (``all_reduce``, ``_reduce_scatter_base``...)
    peer: int = -1  # send and recv: the global rank at the other end
    inputs: Sizes = ()
    outputs: Sizes = ()
    dtype: str = "BFloat16"
    async_op: bool = False
    parts: tuple[Action, ...] = ()  # a batch's sends and recvs; the ops of a coalesced group
    closing: str = "coalesced"  # a coalesced group: the name of its closing entry
    cpu_ns: int = 30_000  # CPU time to issue it
    gpu_ns: int = 300_000  # kernel time (compute), or transfer time once every end runs
    needs: tuple[int, ...] = ()  # compute: indices of the actions whose results it waits for
    hang: bool = False  # compute: the kernel never finishes
    site: str = "train_step"  # the function of the training script that issued it


def compute(
    gpu_ns: int, needs: Iterable[int] = (), cpu_ns: int = 100_000, site: str = "forward", hang: bool = False
) -> Action:
    return Action(COMPUTE, cpu_ns=cpu_ns, gpu_ns=gpu_ns, needs=tuple(needs), site=site, hang=hang)


def collective(
    op: str, group: str, inputs: Sizes, outputs: Sizes | None = None, *, dtype: str = "BFloat16",
    async_op: bool = False, gpu_ns: int = 300_000, site: str = "train_step",
) -> Action:  # fmt: skip
    return Action(COLLECTIVE, group, op, inputs=inputs, outputs=inputs if outputs is None else outputs,
                  dtype=dtype, async_op=async_op, gpu_ns=gpu_ns, site=site)  # fmt: skip


def coalesced(group: str, parts: Iterable[Action], closing: str = "coalesced", site: str = "train_step") -> Action:
    parts = tuple(parts)
    return Action(COLLECTIVE, group, parts[0].op, parts=parts, closing=closing, async_op=True,
                  gpu_ns=max(p.gpu_ns for p in parts), site=site)  # fmt: skip


def p2p(kind: str, group: str, peer: int, numel: int, *, dtype: str = "BFloat16", site: str = "forward") -> Action:
    return Action(kind, group, kind, peer=peer, inputs=((numel,),), outputs=((numel,),), dtype=dtype, site=site)


def batch(group: str, parts: Iterable[Action], site: str = "forward") -> Action:
    parts = tuple(parts)
    return Action(BATCH, group, "batch_isend_irecv", parts=parts, gpu_ns=max(p.gpu_ns for p in parts), site=site)


def sync(site: str = "train_step") -> Action:
    return Action(SYNC, cpu_ns=50_000, site=site)


def agreement(action: Action) -> tuple[object, ...]:
    """What every member of a collective must pass alike for NCCL to complete it."""
    if action.parts:
        return (action.closing, tuple(agreement(part) for part in action.parts))
    op = action.op
    if op.startswith(("all_to_all", "alltoall")):
        return (op, action.dtype)  # splits may differ from rank to rank
    if op == "gather":
        return (op, action.inputs, action.dtype)  # only the root receives
    if op == "scatter":
        return (op, action.outputs, action.dtype)  # only the root sends
    return (op, action.inputs, action.dtype)


@dataclass(slots=True)
class Timing:
    """When one action was issued, and when its kernel started and finished (NEVER: never)."""

    issued: int
    started: int = NEVER
    completed: int = NEVER


@dataclass
class SimJob:
    """A job to simulate: its process groups and one program per rank."""

    groups: dict[str, tuple[str, tuple[int, ...]]]  # name -> (desc, members), in creation order
    programs: dict[int, list[Action]]
    start_ns: dict[int, int] = field(default_factory=dict)  # when each rank's CPU starts (default 0)
    stop_at: dict[int, int] = field(default_factory=dict)  # rank -> first action its CPU never issues

    @property
    def world(self) -> int:
        return len(self.programs)


class _Graph:
    """Times as a max-plus system: each node's time is the latest of its inputs, each plus a delay."""

    def __init__(self) -> None:
        self.base: list[int] = []
        self.inputs: list[list[tuple[int, int]]] = []
        self.never = self.node(NEVER)

    def node(self, base: int = 0, inputs: Iterable[tuple[int, int]] = ()) -> int:
        self.base.append(base)
        self.inputs.append(list(inputs))
        return len(self.base) - 1

    def solve(self) -> list[int]:
        """Every node's time; nodes in a cycle (ranks waiting for each other) never come."""
        base, all_inputs = self.base, self.inputs
        count = len(base)
        waiting = [len(inputs) for inputs in all_inputs]
        users: list[list[int]] = [[] for _ in range(count)]
        for node, inputs in enumerate(all_inputs):
            for source, _ in inputs:
                users[source].append(node)
        value = [NEVER] * count
        ready = [node for node in range(count) if not waiting[node]]
        pop, push = ready.pop, ready.append
        # the hottest loop of a fuzz run: comparisons written out rather than max() and min() calls
        while ready:
            node = pop()
            time = base[node]
            for source, delay in all_inputs[node]:
                later = value[source] + delay
                if later > time:
                    time = later
            value[node] = time if time < NEVER else NEVER
            for user in users[node]:
                waiting[user] -= 1
                if not waiting[user]:
                    push(user)
        return value


def simulate(job: SimJob) -> dict[int, list[Timing]]:
    """When every action of every rank is issued, starts and completes."""
    graph = _Graph()
    # per rank and action: (issued, started, completed) nodes, or None where it has no kernel
    nodes: dict[int, list[tuple[int, int | None, int | None]]] = {}
    collectives: dict[str, dict[int, list[tuple[int, Action]]]] = defaultdict(lambda: defaultdict(list))
    pairs: dict[tuple[str, int, int], dict[str, list[int]]] = defaultdict(lambda: {SEND: [], RECV: []})
    # completion nodes still to be wired to what they wait for
    waits_on_collective: list[tuple[int, str, int]] = []  # (node, group, ordinal)
    waits_on_pair: list[tuple[int, tuple[str, int, int], int]] = []  # (node, pair, ordinal)
    base, all_inputs = graph.base, graph.inputs

    def node(time: int, inputs: list[tuple[int, int]]) -> int:
        """``graph.node`` for a list of inputs of the caller's own, which it keeps (millions of calls)."""
        base.append(time)
        all_inputs.append(inputs)
        return len(base) - 1

    for rank, program in sorted(job.programs.items()):
        stop = job.stop_at.get(rank, len(program))
        start = job.start_ns.get(rank, 0)
        last_on: dict[object, int] = {}  # stream -> completion node of its last kernel
        issued_prev: int | None = None
        rank_nodes: list[tuple[int, int | None, int | None]] = []
        for index, action in enumerate(program):
            if index >= stop:
                rank_nodes.append((graph.never, None, None))
                continue
            inputs: list[tuple[int, int]] = []
            if issued_prev is not None:
                previous = program[index - 1]
                inputs.append((issued_prev, previous.cpu_ns))
                if previous.kind == SYNC:
                    inputs += [(done, previous.cpu_ns) for done in last_on.values()]
            issued = node(start, inputs)
            issued_prev = issued
            if action.kind == SYNC:
                rank_nodes.append((issued, None, None))
                continue
            stream = _stream(rank, action)
            start_inputs = [(issued, 0)]
            if stream in last_on:
                start_inputs.append((last_on[stream], 0))
            if stream != "current" and "current" in last_on:
                start_inputs.append((last_on["current"], 0))  # syncStream
            for needed in action.needs:
                needed_done = rank_nodes[needed][2]
                if needed_done is not None:
                    start_inputs.append((needed_done, 0))
            started = node(0, start_inputs)
            done = node(NEVER if action.hang else 0, [(started, action.gpu_ns)] if action.kind == COMPUTE else [])
            if action.kind == COLLECTIVE:
                members = collectives[action.group]
                ordinal = len(members[rank])
                members[rank].append((started, action))
                waits_on_collective.append((done, action.group, ordinal))
            elif action.kind != COMPUTE:
                for part in action.parts or (action,):
                    key = (action.group, rank, part.peer) if part.kind == SEND else (action.group, part.peer, rank)
                    ends = pairs[key][part.kind]
                    waits_on_pair.append((done, key, len(ends)))
                    ends.append(started)
            last_on[stream] = done
            rank_nodes.append((issued, started, done))
        nodes[rank] = rank_nodes
    # A collective's time: every member's kernel runs, and they agree.
    collective_done: dict[tuple[str, int], int] = {}
    for name, by_rank in collectives.items():
        members = job.groups[name][1]
        depth = max(len(items) for items in by_rank.values())
        for ordinal in range(depth):
            parts = [by_rank[m][ordinal] if ordinal < len(by_rank[m]) else None for m in members]
            if any(p is None for p in parts) or len({agreement(p[1]) for p in parts if p}) > 1:
                collective_done[(name, ordinal)] = graph.never
                continue
            gpu = max(p[1].gpu_ns for p in parts if p)
            collective_done[(name, ordinal)] = graph.node(0, [(p[0], gpu) for p in parts if p])
    for done, name, ordinal in waits_on_collective:
        graph.inputs[done].append((collective_done[(name, ordinal)], 0))
    for done, key, ordinal in waits_on_pair:
        sends, recvs = pairs[key][SEND], pairs[key][RECV]
        if ordinal < len(sends) and ordinal < len(recvs):
            graph.inputs[done] += [(sends[ordinal], 300_000), (recvs[ordinal], 300_000)]
        else:
            graph.inputs[done].append((graph.never, 0))
    value = graph.solve()
    return {
        rank: [
            Timing(value[i], value[s] if s is not None else NEVER, value[d] if d is not None else NEVER)
            for i, s, d in rank_nodes
        ]
        for rank, rank_nodes in nodes.items()
    }


def entries_of(action: Action) -> int:
    """How many Flight Recorder entries an action leaves: a coalesced group or batch one per op and one
    that closes it; compute and syncs none."""
    if action.kind in (COMPUTE, SYNC):
        return 0
    return len(action.parts) + 1 if action.parts else 1


def _stream(rank: int, action: Action) -> object:
    if action.kind == COMPUTE or (action.kind == COLLECTIVE and not action.async_op and not action.parts):
        return "current"
    if action.kind in (SEND, RECV):
        return ("pair", action.group, min(rank, action.peer), max(rank, action.peer))
    return ("group", action.group)


@dataclass
class DumpOptions:
    """How the job's Flight Recorders were set up, and how their dumps were taken."""

    timing: bool = True  # TORCH_NCCL_ENABLE_TIMING: start events, started states, durations
    buffer: int = 2000  # TORCH_FR_BUFFER_SIZE
    timeout_ms: int = 600_000
    poll_ns: int = 100 * MS  # how often the watchdog looks at its works
    clock_offset: dict[int, int] = field(default_factory=dict)  # rank -> its host's clock minus true time
    dump_spread_ns: int = 2_000 * MS  # other ranks dump up to this long after the first
    stacks: bool = True
    legacy_batch_seq: bool = False  # p2p batches also bump seqCollective_ (older startCoalescing)
    seed: int = 0
    # False: every rank is dumped once the job is over (a debug pipe, an exit handler), not when an op first
    # passes the timeout: an op that ran past it then shows how it ended
    dump_on_timeout: bool = True
    backend: str = "nccl"  # "gloo": recorded as ProcessGroupGloo records (``_gloo_record``)


def dump_documents(job: SimJob, times: dict[int, list[Timing]], options: DumpOptions) -> dict[int, dict[str, Any]]:
    """Each rank's dump, as the dict PyTorch pickles (times on the rank's host clock), with two keys of
    the simulation's own: ``pg_status_lists`` and ``dumped_at`` (when it was dumped, in true time)."""
    rng = random.Random(options.seed)
    timeout = options.timeout_ms * MS
    fired = NEVER
    first = -1
    finished = 0
    for rank, program in job.programs.items():
        for action, timing in zip(program, times[rank], strict=True):
            if action.kind in (COMPUTE, SYNC) or timing.issued >= NEVER:
                continue
            finished = max(finished, timing.completed if timing.completed < NEVER else timing.issued)
            if timing.completed > timing.issued + timeout and timing.issued + timeout < fired:
                fired, first = timing.issued + timeout, rank
    dumped_at = {}
    for rank in job.programs:
        if fired < NEVER and options.dump_on_timeout:
            dumped_at[rank] = fired + (0 if rank == first else rng.randrange(options.dump_spread_ns))
        else:
            dumped_at[rank] = finished + 1_000 * MS
    return {rank: _rank_document(job, rank, times[rank], dumped_at[rank], options, rng) for rank in job.programs}


def write_dumps(
    documents: dict[int, dict[str, Any]], out_dir: str, *, json_ranks: Iterable[int] = (), skip: Iterable[int] = (),
    prefix: str = "nccl_trace_rank_",
) -> list[str]:  # fmt: skip
    """Write the documents as ``<prefix><rank>`` files (JSON for ``json_ranks``)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    json_ranks, skip = set(json_ranks), set(skip)
    for rank, doc in sorted(documents.items()):
        if rank in skip:
            continue
        as_json = rank in json_ranks
        path = os.path.join(out_dir, f"{prefix}{rank}" + (".json" if as_json else ""))
        with open(path, "wb") as out:
            out.write(_document_bytes(doc, as_json))
        paths.append(path)
    return paths


def _document_bytes(doc: dict[str, Any], as_json: bool) -> bytes:
    """A document as its file holds it: ``nccl_layout``'s layout, with the document's library version (gloo
    writes ``""``)."""
    data = dump_bytes(doc["entries"], doc["pg_config"], doc["pg_status_lists"], as_json=as_json)
    if doc["comm_lib_version"] == "2.27.5":
        return data
    if as_json:
        return json.dumps({**json.loads(data), "comm_lib_version": doc["comm_lib_version"]}, sort_keys=True).encode()
    return pickle.dumps({**pickle.loads(data), "comm_lib_version": doc["comm_lib_version"]}, protocol=2)


def _rank_document(
    job: SimJob, rank: int, times: list[Timing], dumped: int, options: DumpOptions, rng: random.Random
) -> dict[str, Any]:
    mine = [(name, desc, members) for name, (desc, members) in job.groups.items() if rank in members]
    pg_ids = {name: index for index, (name, _, _) in enumerate(mine)}
    offset = T0 + options.clock_offset.get(rank, 0)  # times on the host's wall clock
    phase = rng.randrange(options.poll_ns)

    def seen(time: int) -> int | None:
        """When the watchdog (or the dump) noticed an event, on the host's clock; None: not yet."""
        if time > dumped:
            return None
        tick = phase + -(-(time - phase) // options.poll_ns) * options.poll_ns
        return min(tick, dumped) + offset

    seq_collective: dict[str, int] = defaultdict(int)
    seq_p2p: dict[str, int] = defaultdict(int)
    op_ids: dict[str, int] = defaultdict(int)
    status: dict[str, list[int]] = {str(pg_ids[name]): [-1, -1, -1] for name, _, _ in mine}
    entries: list[dict[str, Any]] = []
    for action, timing in zip(job.programs[rank], times, strict=True):
        if action.kind in (COMPUTE, SYNC) or timing.issued > dumped:
            continue
        name = action.group
        desc, members = job.groups[name]
        started = seen(timing.started) if options.timing else None
        completed = seen(timing.completed)
        if options.backend == "gloo":
            _gloo_record(entries, op_ids, seq_collective, status[str(pg_ids[name])], action,
                         _Now(name, desc, pg_ids[name], 0, 0, timing.issued + offset, None, None, completed),
                         rank, options)  # fmt: skip
            continue
        duration = (timing.completed - timing.started) / MS if options.timing and completed else None
        if action.kind == COLLECTIVE:
            seq_collective[name] += 1
        elif action.kind == BATCH:
            seq_p2p[name] += 1
            if options.legacy_batch_seq:
                seq_collective[name] += 1
        else:
            seq_p2p[name] += 1

        now = _Now(name, desc, pg_ids[name], seq_collective[name], seq_p2p[name], timing.issued + offset,
                   duration, started, completed)  # fmt: skip
        if action.kind in (SEND, RECV):
            _record(entries, op_ids, now, action, _p2p_name(action, rank, members), True, rank, options)
        elif action.parts:
            for part in action.parts:
                profiling = _p2p_name(part, rank, members) if part.kind in (SEND, RECV) else f"nccl:{part.op}"
                _record(entries, op_ids, now, part, profiling, False, rank, options)
            closing = "coalesced" if action.kind == BATCH else action.closing
            # the closing entry of a batch is no p2p op to the recorder: isP2P comes from its op type
            _record(entries, op_ids, now, action, f"nccl:{closing}", True, rank, options, new_op=False,
                    inputs=[], outputs=[], input_dtypes=[], output_dtypes=[], is_p2p=False)  # fmt: skip
        else:
            _record(entries, op_ids, now, action, f"nccl:{action.op}", True, rank, options)
        if action.kind == COLLECTIVE:
            row = status[str(pg_ids[name])]
            row[0] = seq_collective[name]
            if started:
                row[1] = seq_collective[name]
            if completed:
                row[2] = seq_collective[name]
    kept = entries[-options.buffer :]
    pg_config = {name: {"name": name, "desc": desc, "ranks": str(sorted(members))} for name, desc, members in mine}
    if options.backend == "gloo":
        # gloo's recorder lists only the groups it recorded in, and its pg_config breaks once subgroups exist
        status = {key: row for key, row in status.items() if row[0] >= 0}
        if len(job.groups) > 1:
            pg_config = {"": {"name": "", "desc": "", "ranks": "[]"}}
    return {
        "version": "2.10",
        "pg_config": pg_config,
        "comm_lib_version": "" if options.backend == "gloo" else "2.27.5",
        "pg_status": {key: dict(zip(STATUS_KEYS, row, strict=True)) for key, row in status.items()},
        "pg_status_lists": status,
        "dumped_at": dumped,
        "entries": kept,
    }


@dataclass(slots=True)
class _Now:
    """What every entry of one action shares: its group, the counters after it, its times."""

    name: str
    desc: str
    pg_id: int
    collective_seq: int
    p2p_seq: int
    created: int
    duration_ms: float | None
    started: int | None
    completed: int | None


# gloo's names for the ops whose profiling name differs from PyTorch's function
_GLOO_OPS = {
    "all_to_all_single": "all_to_all", "_reduce_scatter_base": "all_reduce", "reduce_scatter_tensor": "all_reduce",
}  # fmt: skip


def _gloo_record(
    entries: list[dict[str, Any]], op_ids: dict[str, int], seq_collective: dict[str, int], status: list[int],
    action: Action, now: _Now, rank: int, options: DumpOptions,
) -> None:  # fmt: skip
    """Record an action as ProcessGroupGloo does: collectives only, each one entry (a coalesced group is one
    op over all its tensors; reduce_scatter runs as all_reduce) without states or times, ``retired`` once
    it finished, p2p seq 0; a send or recv is not recorded, yet takes an op id. ``status`` (the group's
    pg_status) counts op ids: gloo sets it from the work's ``seq_``, which its entries' ``op_id`` is."""
    name = now.name
    if action.kind != COLLECTIVE:
        op_ids[name] += len(action.parts) or 1
        return
    seq_collective[name] += 1
    now.collective_seq = seq_collective[name]
    op = _GLOO_OPS.get(action.op, action.op)
    sizes: dict[str, Any] = {}
    if action.parts:
        sizes = {
            "inputs": [list(s) for p in action.parts for s in p.inputs],
            "outputs": [list(s) for p in action.parts for s in p.outputs],
            "input_dtypes": [p.dtype for p in action.parts for _ in p.inputs],
            "output_dtypes": [p.dtype for p in action.parts for _ in p.outputs],
        }
    _record(entries, op_ids, now, action, f"gloo:{op}", True, rank, options, **sizes)
    status[0] = op_ids[name]
    if now.completed is not None:
        status[2] = op_ids[name]


def _record(
    entries: list[dict[str, Any]], op_ids: dict[str, int], now: _Now, part: Action, profiling: str, events: bool,
    rank: int, options: DumpOptions, new_op: bool = True, **sizes: Any,
) -> None:  # fmt: skip
    """Append one entry as the recorder writes it (``events``: whether it carries the work's events)."""
    if new_op:
        op_ids[now.name] += 1
    stateless = options.backend == "gloo"  # no events: the entry stays scheduled, ``retired`` says it ended
    entries.append(
        entry_dict(
            frames=_frames(part) if options.stacks else None,
            record_id=len(entries),
            pg_id=now.pg_id,
            group=(now.name, now.desc),
            thread_id=str(140_000_000_000_000 + rank),
            collective_seq=now.collective_seq,
            p2p_seq=now.p2p_seq,
            op_id=op_ids[now.name],
            profiling_name=profiling,
            created=now.created,
            duration_ms=now.duration_ms if events else None,
            input_sizes=sizes.get("inputs", [list(s) for s in part.inputs]),
            input_dtypes=sizes.get("input_dtypes", [part.dtype] * len(part.inputs)),
            output_sizes=sizes.get("outputs", [list(s) for s in part.outputs]),
            output_dtypes=sizes.get("output_dtypes", [part.dtype] * len(part.outputs)),
            started=now.started if events and not stateless else None,
            completed=now.completed if events and not stateless else None,
            timeout_ms=options.timeout_ms,
            is_p2p=sizes.get("is_p2p", part.kind in (SEND, RECV)),
        )
    )
    if stateless:
        entries[-1]["retired"] = now.completed is not None


def _p2p_name(part: Action, rank: int, members: Iterable[int]) -> str:
    """``nccl:send 0->1`` / ``nccl:recv 1<-0``, in group ranks, as ``pointToPoint`` names its works."""
    local = sorted(members).index
    if part.kind == SEND:
        return f"nccl:send {local(rank)}->{local(part.peer)}"
    return f"nccl:recv {local(rank)}<-{local(part.peer)}"


_SITE_LINES = {"forward": 212, "backward": 248, "train_step": 301, "optimizer_step": 330, "load_batch": 140}
_OP_LINES = {
    "all_reduce": 2950, "broadcast": 2690, "reduce": 3020, "all_gather": 3400, "all_gather_into_tensor": 3520,
    "_allgather_base": 3520, "reduce_scatter_tensor": 4200, "_reduce_scatter_base": 4200, "all_to_all": 4460,
    "all_to_all_single": 4460, "gather": 3780, "scatter": 3880, "send": 2350, "recv": 2400, "batch_isend_irecv": 2580,
    "barrier": 4700,
}  # fmt: skip
_FRAME_CACHE: dict[tuple[str, str], list[dict[str, Any]]] = {}
_TORCH = "/opt/venv/lib/python3.11/site-packages/torch/distributed"


def _frames(action: Action) -> list[dict[str, Any]]:
    """The Python stack that issued an action, innermost first; one list per call site, shared as PyTorch's
    pickler shares it."""
    op = "batch_isend_irecv" if action.kind == BATCH else action.op
    key = (op, action.site)
    frames = _FRAME_CACHE.get(key)
    if frames is None:
        frames = _FRAME_CACHE[key] = [
            {"name": op, "filename": f"{_TORCH}/distributed_c10d.py", "line": _OP_LINES.get(op, 2000)},
            {"name": "wrapper", "filename": f"{_TORCH}/c10d_logger.py", "line": 83},
            {"name": action.site, "filename": "/job/train.py", "line": _SITE_LINES.get(action.site, 100)},
            {"name": "main", "filename": "/job/train.py", "line": 412},
        ]
    return frames


# ---------------------------------------------------------------------------------------------------
# Parallel layouts and training programs


@dataclass(frozen=True)
class Grid:
    """Tensor x pipeline x data parallel, ranks laid out tp fastest, then dp, then pp (Megatron's order)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, t: int, p: int, d: int) -> int:
        return t + self.tp * (d + self.dp * p)

    def coords(self, rank: int) -> tuple[int, int, int]:
        return rank % self.tp, rank // (self.tp * self.dp), (rank // self.tp) % self.dp


def grid_groups(grid: Grid, ep: bool = False) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The default group, then tp, pp, dp (and ep) groups, named by PyTorch's counter in creation order."""
    groups: dict[str, tuple[str, tuple[int, ...]]] = {"0": ("default_pg", tuple(range(grid.world)))}
    kinds = [("tp", grid.tp), ("pp", grid.pp), ("dp", grid.dp)] + ([("ep", grid.dp)] if ep else [])
    for desc, size in kinds:
        if size < 2:
            continue
        seen: set[tuple[int, ...]] = set()
        for rank in range(grid.world):
            members = tuple(sorted(r for r in range(grid.world) if _same_but(grid, rank, r, desc)))
            if members not in seen:
                seen.add(members)
                groups[str(len(groups))] = (desc, members)
    return groups


def _same_but(grid: Grid, a: int, b: int, desc: str) -> bool:
    ta, pa, da = grid.coords(a)
    tb, pb, db = grid.coords(b)
    if desc == "tp":
        return (pa, da) == (pb, db)
    if desc == "pp":
        return (ta, da) == (tb, db)
    return (ta, pa) == (tb, pb)  # dp, and ep laid over dp


def group_of(groups: dict[str, tuple[str, tuple[int, ...]]], desc: str, rank: int) -> str | None:
    for name, (group_desc, members) in groups.items():
        if group_desc == desc and rank in members:
            return name
    return None


@dataclass
class Training:
    """What one training step does; ``training_programs`` turns it into every rank's program."""

    grid: Grid
    steps: int = 2
    microbatches: int = 4
    chunks: int = 1  # model chunks per pipeline stage (more than one: an interleaved schedule)
    batched_p2p: bool = False
    tp_ops: int = 2  # tp all_reduces per forward or backward pass of a chunk
    moe: bool = False  # an expert layer: all_to_all_single with uneven splits over the ep group
    data_ops: bool = False  # scatter, gather and broadcast on the tp group, from a non-zero root
    coalesced_grads: bool = False  # the dp gradient all_reduce as a coalesced group
    default_all_reduce: bool = True  # a global all_reduce (a loss, a grad norm) each step
    pp_all_reduce: bool = False  # an all_reduce over the pipeline group each step (tied weights, a norm)
    sync_p2p: bool = False  # the CPU waits for each transfer it posts (Megatron synchronizes after a batch)
    compute_ns: int = 20 * MS  # GPU time of one pass of one chunk
    seed: int = 0


def training_programs(train: Training, groups: dict[str, tuple[str, tuple[int, ...]]]) -> dict[int, list[Action]]:
    """Every rank's program: steps of a pipeline schedule (or plain forward/backward), tp all_reduces in
    each pass, dp gradient reduction and a sync at the end of each step."""
    grid = train.grid
    schedule = pipeline_schedule(grid.pp, train.chunks, train.microbatches)
    programs = {}
    for rank in range(grid.world):
        rng = random.Random(train.seed * 7919 + rank)
        _, stage, _ = grid.coords(rank)
        program: list[Action] = []
        for _ in range(train.steps):
            _step(train, groups, rank, stage, schedule[stage], program, rng)
        programs[rank] = program
    return programs


def _step(
    train: Training, groups: dict[str, tuple[str, tuple[int, ...]]], rank: int, stage: int,
    events: list[ScheduleEvent], program: list[Action], rng: random.Random,
) -> None:  # fmt: skip
    tp, pp, dp, ep = (group_of(groups, desc, rank) for desc in ("tp", "pp", "dp", "ep"))
    hidden = 4096
    if train.data_ops and tp:
        members = groups[tp][1]
        root = members[-1]
        size = len(members)
        is_root = rank == root
        program.append(collective("scatter", tp, ((size, 1024),) if is_root else (), ((1024,),), site="load_batch"))
        program.append(collective("gather", tp, ((64,),), ((size, 64),) if is_root else (), site="load_batch"))
        program.append(collective("broadcast", tp, ((1024,),), site="load_batch"))
    received: dict[tuple[int, int, str], int] = {}  # (microbatch, chunk, pass) -> index of its recv
    pending_p2p: list[tuple[Action, tuple[int, int, str] | None]] = []

    def flush_p2p() -> None:
        """Issue the transfers due now as one batch_isend_irecv (single ones are issued as they come)."""
        if not pending_p2p:
            return
        program.append(batch(pp or "0", [action for action, _ in pending_p2p]))
        for _, key in pending_p2p:
            if key is not None:
                received[key] = len(program) - 1
        if train.sync_p2p:
            program.append(sync(site=program[-1].site))
        pending_p2p.clear()

    for kind, (micro, chunk), peer, direction in events:
        if kind in (SEND, RECV):
            site = "forward" if direction == "F" else "backward"
            action = p2p(kind, pp or "0", _peer_rank(train.grid, rank, peer), hidden * 8, site=site)
            if not train.batched_p2p:
                program.append(action)
                if kind == RECV:
                    received[(micro, chunk, direction)] = len(program) - 1
                    if train.sync_p2p:
                        program.append(sync(site=site))
            else:
                pending_p2p.append((action, (micro, chunk, direction) if kind == RECV else None))
            continue
        flush_p2p()
        site = "forward" if kind == "F" else "backward"
        wait_for = received.get((micro, chunk, kind))
        needs = [wait_for] if wait_for is not None else []
        for layer in range(train.tp_ops):
            gpu = int(train.compute_ns / (train.tp_ops + 1) * rng.uniform(0.9, 1.1))
            program.append(compute(gpu, needs if layer == 0 else (), site=site))
            if tp:
                program.append(collective("all_reduce", tp, ((hidden * 4,),), site=site))
            if train.moe and ep and layer == 0:
                _moe_all_to_all(groups, ep, rank, program, site, micro, chunk)
        program.append(compute(int(train.compute_ns / (train.tp_ops + 1) * rng.uniform(0.9, 1.1)), site=site))
    flush_p2p()
    if dp:
        grads = ((hidden * 256,), (hidden * 64,), (hidden,))
        if train.coalesced_grads:
            program.append(coalesced(dp, [collective("all_reduce", dp, (g,), site="optimizer_step") for g in grads],
                                     site="optimizer_step"))  # fmt: skip
        else:
            for g in grads:
                program.append(collective("all_reduce", dp, (g,), async_op=True, site="optimizer_step"))
    if train.pp_all_reduce and pp:
        program.append(collective("all_reduce", pp, ((hidden * 16,),), site="optimizer_step"))
    if train.default_all_reduce:
        program.append(collective("all_reduce", "0", ((1,),), dtype="Float", site="train_step"))
    program.append(sync(site="optimizer_step"))


def _moe_all_to_all(
    groups: dict[str, tuple[str, tuple[int, ...]]], ep: str, rank: int, program: list[Action], site: str,
    micro: int, chunk: int,
) -> None:  # fmt: skip
    members = groups[ep][1]
    index = members.index(rank)
    size = len(members)
    # token counts routed from each member to each other one: uneven, but the same table on every rank
    table = [[64 + ((a * 7 + b * 13 + micro * 5 + chunk * 3) % 9) * 16 for b in range(size)] for a in range(size)]
    sent = sum(table[index])
    got = sum(table[a][index] for a in range(size))
    program.append(collective("all_to_all_single", ep, ((sent, 1024),), ((got, 1024),), site=site))


def _next_stage(stage: int, grid: Grid) -> int:
    return (stage + 1) % grid.pp


def _peer_rank(grid: Grid, rank: int, stage: int) -> int:
    t, _, d = grid.coords(rank)
    return grid.rank(t, stage, d)


def pipeline_schedule(stages: int, chunks: int, microbatches: int) -> list[list[ScheduleEvent]]:
    """Per stage, its events in order: ``("F"|"B", (microbatch, chunk), None, pass)`` for a pass and
    ``("send"|"recv", (microbatch, chunk), peer stage, pass)`` for a transfer, where ``chunk`` and
    ``pass`` name the pass at the receiving end.

    Virtual stage v = chunk * stages + stage runs on ``stage``; its forward needs v - 1's, its backward
    v + 1's (and its own forward). Each stage runs one pass at a time, backward first when one is ready,
    then the lowest ready forward, with at most ``stages - stage`` forwards ahead of their backwards
    (1F1B: stage s warms up with stages - s - 1 forwards), ``stages`` more for each further chunk.
    A transfer happens when the pass that makes it ends; both ends list the transfers of one time in
    transfer order, so that the sends and recvs of every pair come in one order on both of its ranks
    (single send/recv of one pair share a stream: opposite orders would deadlock).
    """
    virtual = stages * chunks
    done: dict[tuple[str, int, int], int] = {}  # (F|B, microbatch, virtual stage) -> end time
    busy_until = [0] * stages
    in_flight = [0] * stages  # forwards not yet matched by their backward
    # per stage: (time, 0 for a transfer and 1 for a pass, transfer number, event)
    timeline: list[list[tuple[int, int, int, ScheduleEvent]]] = [[] for _ in range(stages)]
    remaining = {(kind, m, v) for kind in "FB" for m in range(microbatches) for v in range(virtual)}
    transfer = 0
    time = 0
    while remaining:
        if time > 100 * (len(remaining) + virtual * microbatches):
            raise RuntimeError("the pipeline schedule makes no progress")
        for stage in range(stages):
            if busy_until[stage] > time:
                continue
            ready = []
            for kind, m, v in remaining:
                if v % stages != stage:
                    continue
                if kind == "F":
                    if in_flight[stage] >= (stages - stage) + (chunks - 1) * stages:
                        continue
                    deps = [("F", m, v - 1)] if v > 0 else []
                else:
                    deps = [("F", m, v)] + ([("B", m, v + 1)] if v < virtual - 1 else [])
                if all(d in done and done[d] <= time for d in deps):
                    ready.append((kind != "B", m, v if kind == "F" else -v, kind))
            if not ready:
                continue
            _, m, signed, kind = min(ready)
            v = abs(signed)
            remaining.discard((kind, m, v))
            done[(kind, m, v)] = time + 1
            busy_until[stage] = time + 1
            in_flight[stage] += 1 if kind == "F" else -1
            timeline[stage].append((time, 1, 0, (kind, (m, v // stages), None, kind)))
            target = v + 1 if kind == "F" else v - 1
            if 0 <= target < virtual and target % stages != stage:
                transfer += 1
                peer = target % stages
                at = (m, target // stages)
                timeline[stage].append((time + 1, 0, transfer, (SEND, at, peer, kind)))
                timeline[peer].append((time + 1, 0, transfer, (RECV, at, stage, kind)))
        time += 1
    return [[event for *_, event in sorted(items, key=lambda item: item[:3])] for items in timeline]


ScheduleEvent = tuple[str, tuple[int, int], "int | None", str]


def pipeline_sample(batched: bool, stop_stage: int | None = None) -> tuple[SimJob, DumpOptions, dict[int, int]]:
    """The 16-rank sample job: 2 tp x 4 pp x 2 dp running two steps of 1F1B with 6 microbatches, two
    hosts whose clocks differ by 7 ms. ``stop_stage``: the ranks of that stage of the first dp replica
    stop on the CPU in the second step, before the backward pass of microbatch 2 (rank -> action)."""
    grid = Grid(tp=2, pp=4, dp=2)
    train = Training(grid, steps=2, microbatches=6, batched_p2p=batched, seed=1)
    groups = grid_groups(grid)
    programs = training_programs(train, groups)
    job = SimJob(groups, programs, start_ns={r: (r * 37_000) % 900_000 for r in programs})
    options = DumpOptions(poll_ns=10 * MS, clock_offset={r: 7 * MS if r >= 8 else 0 for r in programs}, seed=1)
    stopped = {}
    if stop_stage is not None:
        for t in range(grid.tp):
            rank = grid.rank(t, stop_stage, 0)
            backward = [i for i, a in enumerate(programs[rank]) if a.site == "backward" and a.kind != COMPUTE]
            stopped[rank] = backward[len(backward) // 2 + 2]  # in the second step
        job.stop_at.update(stopped)
    return job, options, stopped


PIPELINE_SAMPLES = {
    "pipeline_1f1b": (False, None),
    "pipeline_batched": (True, None),
    "pipeline_stage_stopped": (False, 2),
}


def write_pipeline_sample(name: str, out_dir: str) -> list[str]:
    """Simulate the sample ``name`` and write its dumps into ``out_dir``."""
    job, options, _ = pipeline_sample(*PIPELINE_SAMPLES[name])
    return write_dumps(dump_documents(job, simulate(job), options), out_dir)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for sample in sys.argv[2:] or list(PIPELINE_SAMPLES):
        print(sample, len(write_pipeline_sample(sample, os.path.join(sys.argv[1], sample))), "dumps")
