"""Generate a large NCCL-layout job for benchmarks: N ranks x E entries, tp/dp/default groups, a hang.

Same layout as ``samples/nccl_layout.py`` (PyTorch 2.13's writer, version 2.10), written per rank in
parallel so that 4096 ranks take seconds, not minutes. Every rank runs the same training step
(tp all_reduce, dp _reduce_scatter_base, default all_reduce) with tp groups of 8 consecutive ranks and
dp groups across them; the ring buffer keeps the last E entries; rank N // 3 never issues the last
default all_reduce, in which every other rank waits (started, never completed).

A pipeline job (``--pipeline p2p`` or ``batched``) adds 4 pipeline stages (pp groups of one rank per
stage, each stage a quarter of the ranks): after its tp all_reduce, each rank sends to the next stage
and receives from the previous one, as single ops (``p2p``: each its own p2p seq) or as one
``batch_isend_irecv`` (``batched``: both under one p2p seq, closed by ``nccl:coalesced``, which holds
the batch's state), laid out as ``samples/nccl_layout.py``'s ``send_recv`` and ``batch_send_recv``.

    python bench/generate.py OUT_DIR RANKS ENTRIES [p2p|batched]
"""

from __future__ import annotations

import os
import pickle
import sys
from multiprocessing import Pool
from typing import Any

T0 = 1_796_000_000_000_000_000
STEP_NS = 3_000_000
TP = 8
PP = 4
PIPELINES = ("", "p2p", "batched")
SITE = "/opt/conda/lib/python3.11/site-packages/torch/distributed"
FRAMES = [
    {"name": "all_reduce", "filename": f"{SITE}/distributed_c10d.py", "line": 3245},
    {"name": "wrapper", "filename": f"{SITE}/c10d_logger.py", "line": 83},
    {"name": "forward_backward", "filename": "/home/alice/llm/train.py", "line": 311},
    {"name": "train_step", "filename": "/home/alice/llm/train.py", "line": 402},
    {"name": "main", "filename": "/home/alice/llm/train.py", "line": 518},
]  # fmt: skip


def groups_of(rank: int, world: int, pipeline: str = "") -> list[tuple[str, str, list[int]]]:
    """(name, desc, members) of the default, tp and dp groups of ``rank`` (and its pp group, in a
    pipeline job), named as PyTorch counts them."""
    tp_count = world // TP
    tp_index = rank // TP
    dp_index = rank % TP
    groups = [
        ("0", "default_pg", list(range(world))),
        (str(1 + tp_index), "tp", list(range(tp_index * TP, (tp_index + 1) * TP))),
        (str(1 + tp_count + dp_index), "dp", list(range(dp_index, world, TP))),
    ]
    if pipeline:
        stage_size = world // PP
        groups.append(
            (str(1 + tp_count + TP + rank % stage_size), "pp", list(range(rank % stage_size, world, stage_size)))
        )
    return groups


def _transfers(rank: int, world: int, pipeline: str) -> list[tuple[str, int]]:
    """(profiling name, p2p seq bump) of the sends and recvs ``rank`` issues in a step of a pipeline job:
    the names count ranks within the pp group, as PyTorch's do."""
    if not pipeline:
        return []
    stage = rank // (world // PP)
    ops = [(f"nccl:send {stage}->{stage + 1}", 1)] if stage + 1 < PP else []
    ops += [(f"nccl:recv {stage}<-{stage - 1}", 1)] if stage > 0 else []
    if pipeline == "batched" and len(ops) == 2:
        return [(ops[0][0], 1), (ops[1][0], 0), ("nccl:coalesced", 0)]  # one p2p seq for the batch
    return ops


def rank_dump(rank: int, world: int, entries: int, pipeline: str = "") -> dict[str, Any]:
    """The dump of one rank."""
    hung = world // 3
    groups = groups_of(rank, world, pipeline)
    frames = FRAMES  # one shared list: PyTorch's pickler memoises frames the same way
    steps = entries // 3 + 2
    ops: list[dict[str, Any]] = []
    seqs = {name: 0 for name, _, _ in groups}
    p2p_seq = 0
    op_id = 0
    jitter = (rank * 7919) % 20_000

    def entry(
        name: str,
        desc: str,
        profiling: str,
        created: int,
        started: int | None,
        completed: int | None,
        sizes: list[list[int]],
        in_sizes: list[list[int]],
        is_p2p: bool,
    ) -> dict[str, Any]:
        made = {
            "frames": frames, "record_id": len(ops), "pg_id": [g[0] for g in groups].index(name),
            "process_group": (name, desc), "thread_name": "pt_main_thread",
            "thread_id": str(140_000_000_000 + rank), "collective_seq_id": seqs[name],
            "p2p_seq_id": p2p_seq if desc == "pp" else 0, "op_id": op_id, "profiling_name": profiling,
            "time_created_ns": created,
        }  # fmt: skip
        if completed:
            made["duration_ms"] = 0.5
        made.update({
            "input_sizes": in_sizes, "input_dtypes": ["BFloat16"] * len(in_sizes),
            "output_sizes": sizes, "output_dtypes": ["BFloat16"] * len(sizes),
            "state": "completed" if completed else "started" if started else "scheduled",
            "time_discovered_started_ns": started, "time_discovered_completed_ns": completed,
            "retired": completed is not None, "timeout_ms": 600_000, "is_p2p": is_p2p,
        })  # fmt: skip
        return made

    for step in range(steps):
        for kind, (name, desc, _) in zip(
            ("all_reduce", "_reduce_scatter_base", "all_reduce"), (groups[1], groups[2], groups[0]), strict=True
        ):
            last = step == steps - 1 and name == "0"
            if last and rank == hung:
                continue
            seqs[name] += 1
            op_id += 1
            created = (
                T0
                + step * STEP_NS
                + jitter
                + (0 if kind == "all_reduce" else 900_000)
                + (1_800_000 if name == "0" else 0)
            )
            started = created + 40_000
            completed = None if last else started + 500_000
            # reduce_scatter: each rank's input holds one output's worth per member
            size = [[4096]] if desc == "tp" else [[8192]] if desc == "dp" else [[1]]
            in_size = [[8192 * len(groups[2][2])]] if desc == "dp" else size
            ops.append(entry(name, desc, f"nccl:{kind}", created, started, completed, size, in_size, False))
            if desc != "tp":
                continue
            # the pipeline's transfers, after the tp all_reduce; a batch's ops wait for its closing entry
            pp_name = groups[-1][0]
            transfers = _transfers(rank, world, pipeline)
            batched = len(transfers) == 3
            for i, (profiling, bump) in enumerate(transfers):
                closing = profiling == "nccl:coalesced"
                p2p_seq += bump
                op_id += not closing
                created = T0 + step * STEP_NS + jitter + 400_000 + 1_000 * i
                started = created + 40_000 if not batched or closing else None
                completed = started + 500_000 if started is not None else None
                sizes = [] if closing else [[8192]]
                ops.append(entry(pp_name, "pp", profiling, created, started, completed, sizes, sizes, not closing))
    kept = ops[-entries:]
    status = {str(i): {"last_enqueued_collective": seqs[name], "last_started_collective": seqs[name],
                       "last_completed_collective": seqs[name] - (1 if name == "0" and rank != hung else 0)}
              for i, (name, _, _) in enumerate(groups)}  # fmt: skip
    return {
        "version": "2.10",
        "pg_config": {name: {"name": name, "desc": desc, "ranks": str(members)} for name, desc, members in groups},
        "comm_lib_version": "2.27.5",
        "pg_status": status,
        "entries": kept,
    }


def _write(args: tuple[str, int, int, int, str]) -> None:
    out_dir, rank, world, entries, pipeline = args
    with open(os.path.join(out_dir, f"nccl_trace_rank_{rank}"), "wb") as f:
        pickle.dump(rank_dump(rank, world, entries, pipeline), f, protocol=2)


def generate(out_dir: str, world: int, entries: int, processes: int | None = None, pipeline: str = "") -> None:
    """Write ``world`` dumps of ``entries`` entries into ``out_dir`` (a pipeline job: ``pipeline``)."""
    if pipeline not in PIPELINES or (pipeline and world % (PP * TP)):
        raise ValueError(f"a pipeline job is p2p or batched, of a multiple of {PP * TP} ranks")
    os.makedirs(out_dir, exist_ok=True)
    with Pool(processes or os.cpu_count()) as pool:
        pool.map(_write, [(out_dir, r, world, entries, pipeline) for r in range(world)], chunksize=16)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    generate(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), pipeline=sys.argv[4] if len(sys.argv) == 5 else "")
