"""Write NCCL Flight Recorder dumps, laid out exactly as PyTorch's writer lays them out.

CPU-only torch cannot run NCCL, so the fields only NCCL fills in (start and completion times,
``duration_ms``, send/recv, coalesced groups, ``started`` states, a real ``pg_config``) come from
this simulator. Its layout follows PyTorch 2.13's ``FlightRecorder::getCollectiveTrace``,
``getPgConfig`` and ``getPgStatus`` (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp) key by
key and in the same order, with version "2.10"; p2p and coalescing follow ProcessGroupNCCL
(a batch shares one p2p seq and ends in ``nccl:coalesced``); JSON follows ``dump_json`` (0 for unset
times, string ``pg_status`` values, no frames, no ``entries`` key when empty).

    python samples/nccl_layout.py OUT_DIR [SCENARIO ...]
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

T0 = 1_796_000_000_000_000_000  # a fixed wall-clock origin (ns) so that samples are reproducible
FRAMES = {
    "train": [
        {
            "name": "all_reduce",
            "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
            "line": 3245,
        },
        {
            "name": "wrapper",
            "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
            "line": 83,
        },
        {"name": "train_step", "filename": "/job/train.py", "line": 118},
        {"name": "main", "filename": "/job/train.py", "line": 204},
    ],
}


def entry_dict(
    *,
    frames: list[dict[str, Any]] | None,
    record_id: int,
    pg_id: int,
    group: tuple[str, str],
    thread_id: str,
    collective_seq: int,
    p2p_seq: int,
    op_id: int,
    profiling_name: str,
    created: int,
    duration_ms: float | None,
    input_sizes: list[list[int]],
    input_dtypes: list[str],
    output_sizes: list[list[int]],
    output_dtypes: list[str],
    started: int | None,
    completed: int | None,
    timeout_ms: int,
    is_p2p: bool,
    thread_name: str = "pt_main_thread",
) -> dict[str, Any]:
    """One entry, its keys in the order ``getCollectiveTrace`` writes them; the state follows from the times
    (``completed`` if the end event was seen, else ``started`` if the start event was, else ``scheduled``) and
    ``retired`` from completion, as for a work the watchdog retired."""
    entry: dict[str, Any] = {}
    if frames:
        entry["frames"] = frames
    entry["record_id"] = record_id
    entry["pg_id"] = pg_id
    entry["process_group"] = group
    entry["thread_name"] = thread_name
    entry["thread_id"] = thread_id
    entry["collective_seq_id"] = collective_seq
    entry["p2p_seq_id"] = p2p_seq
    entry["op_id"] = op_id
    entry["profiling_name"] = profiling_name
    entry["time_created_ns"] = created
    if duration_ms is not None and completed is not None:
        entry["duration_ms"] = duration_ms
    entry["input_sizes"] = input_sizes
    entry["input_dtypes"] = input_dtypes
    entry["output_sizes"] = output_sizes
    entry["output_dtypes"] = output_dtypes
    entry["state"] = "completed" if completed else "started" if started else "scheduled"
    entry["time_discovered_started_ns"] = started
    entry["time_discovered_completed_ns"] = completed
    entry["retired"] = completed is not None
    entry["timeout_ms"] = timeout_ms
    entry["is_p2p"] = is_p2p
    return entry


def dump_bytes(
    entries: list[dict[str, Any]],
    pg_config: dict[str, dict[str, str]],
    pg_status: dict[str, list[int]],
    *,
    as_json: bool = False,
) -> bytes:
    """A whole dump as PyTorch writes it: a protocol-2 pickle, or ``dump_json`` (0 for unset times, string
    ``pg_status`` values, no frames, no ``entries`` key when there are none)."""
    if as_json:
        doc: dict[str, Any] = {
            "version": "2.10",
            "comm_lib_version": "2.27.5",
            "pg_config": pg_config,
            "pg_status": {k: _status_dict(v, str) for k, v in pg_status.items()},
        }
        if entries:
            doc["entries"] = [_json_entry(e) for e in entries]
        doc["nccl_comm_state"] = {}
        return json.dumps(doc, sort_keys=True).encode()
    doc = {
        "version": "2.10",
        "pg_config": pg_config,
        "comm_lib_version": "2.27.5",
        "pg_status": {k: _status_dict(v, int) for k, v in pg_status.items()},
        "entries": entries,
    }
    return pickle.dumps(doc, protocol=2)


@dataclass
class Rank:
    """What one simulated rank's Flight Recorder holds."""

    rank: int
    entries: list[dict[str, Any]] = field(default_factory=list)
    next_record: int = 0
    next_op: int = 0
    collective_seq: dict[str, int] = field(default_factory=dict)
    p2p_seq: dict[str, int] = field(default_factory=dict)
    pg_status: dict[str, list[int]] = field(default_factory=dict)


class Job:
    """A simulated NCCL job: call its ops in program order, then ``dump``."""

    def __init__(
        self,
        world: int,
        groups: dict[str, tuple[str, list[int]]] | None = None,
        buffer: int = 2000,
        stacks: bool = True,
    ) -> None:
        self.world = world
        self.buffer = buffer
        self.stacks = stacks
        # name -> (desc, ranks); pg ids are per process, in creation order, as in PyTorch.
        self.groups: dict[str, tuple[str, list[int]]] = {"0": ("default_pg", list(range(world)))}
        self.groups.update(groups or {})
        self.ranks = [Rank(r) for r in range(world)]
        self.clock = T0

    def _pg_id(self, rank: int, name: str) -> int:
        mine = [n for n, (_, members) in self.groups.items() if rank in members]
        return mine.index(name)

    def _local(self, name: str, rank: int) -> int:
        return sorted(self.groups[name][1]).index(rank)

    def _record(
        self,
        rank: int,
        name: str,
        profiling: str,
        *,
        sizes: list[list[int]],
        dtype: str,
        created: int,
        started: int | None,
        completed: int | None,
        p2p: bool = False,
        seq: int | None = None,
        p2p_seq: int | None = None,
        duration: float | None = None,
        out_sizes: list[list[int]] | None = None,
        new_op: bool = True,
        timeout_ms: int = 600_000,
    ) -> dict[str, Any]:
        r = self.ranks[rank]
        if new_op:
            r.next_op += 1
        outputs = out_sizes if out_sizes is not None else sizes
        entry = entry_dict(
            frames=FRAMES["train"] if self.stacks else None,
            record_id=r.next_record,
            pg_id=self._pg_id(rank, name),
            group=(name, self.groups[name][0]),
            thread_id=str(140_000_000_000_000 + rank),
            collective_seq=seq if seq is not None else r.collective_seq.get(name, 0),
            p2p_seq=p2p_seq if p2p_seq is not None else r.p2p_seq.get(name, 0),
            op_id=r.next_op,
            profiling_name=profiling,
            created=created,
            duration_ms=duration if completed is not None else None,
            input_sizes=sizes,
            input_dtypes=[dtype] * len(sizes),
            output_sizes=outputs,
            output_dtypes=[dtype] * len(outputs),
            started=started,
            completed=completed,
            timeout_ms=timeout_ms,
            is_p2p=p2p,
        )
        r.next_record += 1
        r.entries.append(entry)
        return entry

    def _status(self, rank: int, name: str) -> list[int]:
        return self.ranks[rank].pg_status.setdefault(str(self._pg_id(rank, name)), [-1, -1, -1])

    def collective(
        self,
        op: str = "all_reduce",
        group: str = "0",
        *,
        numel: int = 1024,
        dtype: str = "Float",
        skip: tuple[int, ...] = (),
        hang: bool = False,
        late: dict[int, int] | None = None,
        sizes: dict[int, int] | None = None,
        dtypes: dict[int, str] | None = None,
        ops: dict[int, str] | None = None,
        duration_ms: float = 0.4,
    ) -> None:
        """One collective on ``group``: ranks in ``skip`` never issue it; ``hang``: nobody completes it."""
        members = [r for r in self.groups[group][1] if r not in skip]
        late = late or {}
        created = {r: self.clock + 5_000 * (r % 7) + late.get(r, 0) for r in members}
        start = max(created.values()) + 20_000
        missing = len(members) < len(self.groups[group][1])
        complete = None if (hang or missing) else start + int(duration_ms * 1e6)
        # reduce_scatter's input holds one output's worth per member (all_gather the other way round)
        scale_in = len(self.groups[group][1]) if op in ("_reduce_scatter_base", "reduce_scatter") else 1
        for r in members:
            seq = self.ranks[r].collective_seq[group] = self.ranks[r].collective_seq.get(group, 0) + 1
            numel_r = (sizes or {}).get(r, numel)
            self._record(
                r,
                group,
                f"nccl:{(ops or {}).get(r, op)}",
                sizes=[[numel_r * scale_in]],
                out_sizes=[[numel_r]],
                dtype=(dtypes or {}).get(r, dtype),
                created=created[r],
                started=start if (complete or hang or missing) else None,
                completed=complete,
                duration=duration_ms if complete else None,
            )
            status = self._status(r, group)
            status[0] = seq
            status[1] = seq
            if complete:
                status[2] = seq
        self.clock = (complete or start) + 50_000

    def coalesced(
        self, group: str = "0", ops: tuple[str, ...] = ("all_reduce", "all_reduce", "all_reduce"), numel: int = 256
    ) -> None:
        """A coalesced collective: one entry per op sharing a seq, closed by ``nccl:coalesced``."""
        start = self.clock + 40_000
        complete = start + 600_000
        for r in self.groups[group][1]:
            seq = self.ranks[r].collective_seq[group] = self.ranks[r].collective_seq.get(group, 0) + 1
            for i, op in enumerate(ops):
                self._record(
                    r,
                    group,
                    f"nccl:{op}",
                    sizes=[[numel]],
                    dtype="Float",
                    created=self.clock + 1_000 * i,
                    started=None,
                    completed=None,
                )
            self._record(
                r,
                group,
                "nccl:coalesced",
                sizes=[],
                dtype="Float",
                created=self.clock + 1_000 * len(ops),
                started=start,
                completed=complete,
                duration=0.6,
                new_op=False,
            )
            status = self._status(r, group)
            status[:] = [seq, seq, seq]
        self.clock = complete + 50_000

    def send_recv(self, src: int, dst: int, group: str = "0", *, numel: int = 4096, drop_recv: bool = False) -> None:
        """``send`` on ``src`` and ``recv`` on ``dst``; with ``drop_recv`` the receiver never posts its recv."""
        ls, ld = self._local(group, src), self._local(group, dst)
        start = self.clock + 30_000
        complete = None if drop_recv else start + 300_000
        for r, name in ((src, f"nccl:send {ls}->{ld}"), (dst, f"nccl:recv {ld}<-{ls}")):
            if drop_recv and r == dst:
                continue
            seq = self.ranks[r].p2p_seq[group] = self.ranks[r].p2p_seq.get(group, 0) + 1
            self._record(
                r,
                group,
                name,
                sizes=[[numel]],
                dtype="BFloat16",
                created=self.clock + (0 if r == src else 7_000),
                started=start,
                completed=complete,
                p2p=True,
                p2p_seq=seq,
                duration=0.3 if complete else None,
            )
        self.clock = (complete or start) + 50_000

    def batch_send_recv(self, pairs: list[tuple[int, int]], group: str = "0", numel: int = 512) -> None:
        """``batch_isend_irecv``: per rank, its sends and recvs share one p2p seq, closed by ``nccl:coalesced``."""
        per_rank: dict[int, list[str]] = {}
        for src, dst in pairs:
            ls, ld = self._local(group, src), self._local(group, dst)
            per_rank.setdefault(src, []).append(f"nccl:send {ls}->{ld}")
            per_rank.setdefault(dst, []).append(f"nccl:recv {ld}<-{ls}")
        start = self.clock + 40_000
        complete = start + 500_000
        for r, names in sorted(per_rank.items()):
            seq = self.ranks[r].p2p_seq[group] = self.ranks[r].p2p_seq.get(group, 0) + 1
            for i, name in enumerate(names):
                self._record(
                    r,
                    group,
                    name,
                    sizes=[[numel]],
                    dtype="Float",
                    created=self.clock + 1_000 * i,
                    started=None,
                    completed=None,
                    p2p=True,
                    p2p_seq=seq,
                )
            self._record(
                r,
                group,
                "nccl:coalesced",
                sizes=[],
                dtype="Float",
                created=self.clock + 1_000 * len(names),
                started=start,
                completed=complete,
                # endCoalescing's work is recorded by initWork with isP2POp(OpType::COALESCED), which is false,
                # and with the group's current collective seq: the batch bumped only seqP2P_.
                p2p=False,
                p2p_seq=seq,
                duration=0.5,
                new_op=False,
            )
        self.clock = complete + 50_000

    def dump(
        self,
        out_dir: str,
        *,
        json_ranks: tuple[int, ...] = (),
        skip_ranks: tuple[int, ...] = (),
        prefix: str = "nccl_trace_rank_",
    ) -> list[str]:
        """Write each rank's last ``buffer`` entries as PyTorch would; return the paths."""
        os.makedirs(out_dir, exist_ok=True)
        paths = []
        for r in self.ranks:
            if r.rank in skip_ranks:
                continue
            kept = r.entries[-self.buffer :]
            pg_config = {
                name: {"name": name, "desc": desc, "ranks": str(sorted(members))}
                for name, (desc, members) in self.groups.items()
                if r.rank in members
            }
            as_json = r.rank in json_ranks
            path = os.path.join(out_dir, f"{prefix}{r.rank}" + (".json" if as_json else ""))
            data = dump_bytes(kept, pg_config, r.pg_status, as_json=as_json)
            with open(path, "wb") as f:
                f.write(data)
            paths.append(path)
        return paths


def _status_dict(values: list[int], kind: Callable[[int], Any]) -> dict[str, Any]:
    keys = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
    return {k: kind(v) for k, v in zip(keys, values, strict=True)}


def _json_entry(entry: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in entry.items() if k != "frames"}
    out["process_group"] = list(entry["process_group"])
    for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
        out[key] = out[key] or 0
    return out


def _train_steps(job: Job, steps: int, *, tp: list[str], dp: list[str]) -> None:
    for _ in range(steps):
        for g in tp:
            job.collective("all_reduce", g, numel=4096)
        for g in dp:
            job.collective("_reduce_scatter_base", g, numel=8192, dtype="BFloat16")
        job.collective("all_reduce", "0", numel=1)


def tp_dp_groups(world: int, tp_size: int) -> dict[str, tuple[str, list[int]]]:
    """tp groups of ``tp_size`` consecutive ranks and dp groups across them, named like PyTorch (counters)."""
    groups: dict[str, tuple[str, list[int]]] = {}
    n = 1
    for start in range(0, world, tp_size):
        groups[str(n)] = ("tp", list(range(start, start + tp_size)))
        n += 1
    for offset in range(tp_size):
        groups[str(n)] = ("dp", list(range(offset, world, tp_size)))
        n += 1
    return groups


def scenario_demo() -> Job:
    """8 ranks, tp=4 x dp=2: steps with send/recv, a batch, a coalesced op; rank 5 never joins the last all_reduce."""
    job = Job(8, tp_dp_groups(8, 4))
    _train_steps(job, 3, tp=["1", "2"], dp=["3", "4", "5", "6"])
    job.send_recv(0, 4)
    job.batch_send_recv([(1, 5), (5, 1)])
    job.coalesced("1")
    job.collective("all_reduce", "2", skip=(5,))
    return job


def scenario_stuck() -> Job:
    """Every rank enters all_reduce #4 and it never completes: a GPU, NCCL or network hang."""
    job = Job(4)
    for _ in range(3):
        job.collective("all_reduce")
    job.collective("all_reduce", hang=True)
    return job


def scenario_send_without_recv() -> Job:
    """Rank 0 sends to rank 1, which never posts the recv."""
    job = Job(2)
    job.collective("all_reduce")
    job.send_recv(0, 1)
    job.send_recv(0, 1, drop_recv=True)
    return job


def scenario_straggler() -> Job:
    """Rank 6 enqueues every collective 40 ms late; everything completes."""
    job = Job(8)
    for _ in range(30):
        job.collective("all_reduce", late={6: 40_000_000})
    return job


def scenario_missing_dump() -> Job:
    """Rank 3 hangs before all_reduce #6 and leaves no dump; the others wait in it."""
    job = Job(4)
    for _ in range(5):
        job.collective("all_reduce")
    job.collective("all_reduce", skip=(3,))
    return job


def scenario_wrap() -> Job:
    """Ring buffer of 50: rank 0 issues many more dp ops than rank 1, so their histories start at different seqs."""
    job = Job(2, {"1": ("dp", [0])}, buffer=50)
    for _ in range(20):
        job.collective("all_reduce")
        for _ in range(3):
            job.collective("all_reduce", "1")
    job.collective("all_reduce", skip=(1,))
    return job


def scenario_mixed_formats() -> Job:
    """Ranks 1 and 3 dump JSON, 0 and 2 pickle; rank 2 passes a different size in the last all_reduce."""
    job = Job(4)
    for _ in range(3):
        job.collective("all_reduce")
    job.collective("all_reduce", sizes={2: 2048}, hang=True)
    return job


def scenario_victim() -> Job:
    """tp {0, 1} and dp {1, 2}: rank 2 never joins dp all_reduce #3, so rank 1 waits there and never
    joins tp all_reduce #3, where rank 0 waits. Rank 1 is a victim; rank 2 is the culprit."""
    job = Job(3, {"1": ("tp", [0, 1]), "2": ("dp", [1, 2])})
    for _ in range(2):
        job.collective("all_reduce", "1")
        job.collective("all_reduce", "2")
    job.collective("all_reduce", "2", skip=(2,))
    job.collective("all_reduce", "1", skip=(1,))
    return job


SCENARIOS: dict[str, tuple[Callable[[], Job], dict[str, Any]]] = {
    "demo": (scenario_demo, {}),
    "stuck": (scenario_stuck, {}),
    "send_without_recv": (scenario_send_without_recv, {}),
    "straggler": (scenario_straggler, {}),
    "missing_dump": (scenario_missing_dump, {"skip_ranks": (3,)}),
    "wrap": (scenario_wrap, {}),
    "victim": (scenario_victim, {}),
    "mixed_formats": (scenario_mixed_formats, {"json_ranks": (1, 3)}),
}


def write_scenario(name: str, out_dir: str) -> list[str]:
    """Build scenario ``name`` and dump it into ``out_dir``."""
    make, options = SCENARIOS[name]
    return make().dump(out_dir, **options)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for scenario in sys.argv[2:] or list(SCENARIOS):
        print(scenario, len(write_scenario(scenario, os.path.join(sys.argv[1], scenario))), "dumps")
