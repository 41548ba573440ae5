"""Generate a large NCCL-layout job for benchmarks: N ranks x E entries, tp/dp/default groups, a hang.

Same layout as ``samples/nccl_layout.py`` (PyTorch 2.13's writer, version 2.10), written per rank in
parallel so that 4096 ranks take seconds, not minutes. Every rank runs the same training step
(tp all_reduce, dp _reduce_scatter_base, default all_reduce) with tp groups of 8 consecutive ranks and
dp groups across them; the ring buffer keeps the last E entries; rank N // 3 never issues the last
default all_reduce, in which every other rank waits (started, never completed).

    python bench/generate.py OUT_DIR RANKS ENTRIES
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
SITE = "/opt/conda/lib/python3.11/site-packages/torch/distributed"
FRAMES = [
    {"name": "all_reduce", "filename": f"{SITE}/distributed_c10d.py", "line": 3245},
    {"name": "wrapper", "filename": f"{SITE}/c10d_logger.py", "line": 83},
    {"name": "forward_backward", "filename": "/home/alice/llm/train.py", "line": 311},
    {"name": "train_step", "filename": "/home/alice/llm/train.py", "line": 402},
    {"name": "main", "filename": "/home/alice/llm/train.py", "line": 518},
]  # fmt: skip


def groups_of(rank: int, world: int) -> list[tuple[str, str, list[int]]]:
    """(name, desc, members) of the default, tp and dp groups of ``rank``, named as PyTorch counts them."""
    tp_count = world // TP
    tp_index = rank // TP
    dp_index = rank % TP
    return [
        ("0", "default_pg", list(range(world))),
        (str(1 + tp_index), "tp", list(range(tp_index * TP, (tp_index + 1) * TP))),
        (str(1 + tp_count + dp_index), "dp", list(range(dp_index, world, TP))),
    ]


def rank_dump(rank: int, world: int, entries: int) -> dict[str, Any]:
    """The dump of one rank."""
    hung = world // 3
    groups = groups_of(rank, world)
    frames = FRAMES  # one shared list: PyTorch's pickler memoises frames the same way
    steps = entries // 3 + 2
    ops = []
    seqs = {name: 0 for name, _, _ in groups}
    op_id = 0
    jitter = (rank * 7919) % 20_000
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
            entry = {
                "frames": frames, "record_id": len(ops), "pg_id": [g[0] for g in groups].index(name),
                "process_group": (name, desc), "thread_name": "pt_main_thread",
                "thread_id": str(140_000_000_000 + rank),
                "collective_seq_id": seqs[name], "p2p_seq_id": 0, "op_id": op_id, "profiling_name": f"nccl:{kind}",
                "time_created_ns": created,
            }  # fmt: skip
            if completed:
                entry["duration_ms"] = 0.5
            entry.update({
                "input_sizes": in_size, "input_dtypes": ["BFloat16"],
                "output_sizes": size, "output_dtypes": ["BFloat16"],
                "state": "completed" if completed else "started", "time_discovered_started_ns": started,
                "time_discovered_completed_ns": completed, "retired": completed is not None, "timeout_ms": 600_000,
                "is_p2p": False,
            })  # fmt: skip
            ops.append(entry)
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


def _write(args: tuple[str, int, int, int]) -> None:
    out_dir, rank, world, entries = args
    with open(os.path.join(out_dir, f"nccl_trace_rank_{rank}"), "wb") as f:
        pickle.dump(rank_dump(rank, world, entries), f, protocol=2)


def generate(out_dir: str, world: int, entries: int, processes: int | None = None) -> None:
    """Write ``world`` dumps of ``entries`` entries into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    with Pool(processes or os.cpu_count()) as pool:
        pool.map(_write, [(out_dir, r, world, entries) for r in range(world)], chunksize=16)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    generate(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
