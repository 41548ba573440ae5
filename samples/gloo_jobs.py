"""Run real torch.distributed gloo jobs on 127.0.0.1 and save every rank's Flight Recorder dump.

Each scenario is a small training-like program in which, at most, one thing goes wrong. Every rank
ends by dumping its buffer with ``torch._C._distributed_c10d._dump_fr_trace()`` (pickle) or
``_dump_fr_trace_json()`` into ``<out>/gloo_trace_rank_<rank>[.json]``: PyTorch's data, with the paths
of the machine that ran it in stack frames made neutral (``_portable``) and written again as such.

    python samples/gloo_jobs.py OUT_DIR SCENARIO [SCENARIO ...]

Needs torch (the ``test`` or ``capture`` extra); fr2perfetto itself never does.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

TIMEOUT = timedelta(seconds=3)


def free_port() -> int:
    """A free port on 127.0.0.1 for a job's store or server to listen on, outside the kernel's ephemeral
    range: a port taken by bind(0) and released can go to another process's outgoing connection before the
    job binds it (gloo opens one per pair of ranks, and tests run side by side), one outside that range
    cannot."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            low = int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    choices = range(10_000, max(low, 11_000))
    for port in random.sample(choices, 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port on 127.0.0.1 below the ephemeral range")


def _try(call: Callable[[], Any]) -> None:
    """Run a collective that may fail because another rank diverged; the failure is the point."""
    with contextlib.suppress(Exception):  # gloo raises RuntimeError or DistBackendError
        call()


# Each scenario: (world size, function(rank, dist, torch, groups)) -> None. Groups made up front,
# the same way on every rank, as torch requires.
def healthy(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Four ranks, a tp pair and a dp pair, a few steps; nothing goes wrong."""
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t, group=g["tp"])
        dist.all_reduce(t, group=g["dp"])
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    out = [torch.zeros(8) for _ in range(4)]
    dist.all_gather(out, t)
    dist.barrier()


def skip(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Rank 2 skips the fourth all_reduce of the default group; the others wait for it."""
    t = torch.ones(8)
    for step in range(4):
        dist.all_reduce(t, group=g["tp"])
        if step == 3 and rank == 2:
            time.sleep(TIMEOUT.total_seconds() + 1)  # stuck in its own code, never reaches the collective
            continue
        _try(lambda: dist.all_reduce(t))


def skip_subgroup(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Rank 1 skips the third all_reduce of its tp group ({0, 1}); rank 0 waits in tp."""
    t = torch.ones(8)
    for step in range(3):
        dist.all_reduce(t)
        if step == 2 and rank == 1:
            time.sleep(TIMEOUT.total_seconds() + 1)
            continue
        if rank in (0, 1):
            _try(lambda: dist.all_reduce(t, group=g["tp"]))


def deadlock(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Rank 0 enters group x then y, rank 1 enters y then x: each waits for the other."""
    t = torch.ones(8)
    dist.all_reduce(t, group=g["x"])
    dist.all_reduce(t, group=g["y"])
    first = g["x"] if rank == 0 else g["y"]
    _try(lambda: dist.all_reduce(t, group=first))


def _diverge(
    rank: int, dist: Any, g: dict[str, Any], odd_rank: int, normal: Callable[[], Any], odd: Callable[[], Any]
) -> None:
    """The odd rank calls ``odd`` where the others call ``normal``, both without waiting.

    gloo aborts the whole process (C++ terminate) when mismatched data arrives, so every rank
    enqueues its op (which is when the Flight Recorder records it) and dumps before any data
    of the odd rank can arrive: the odd rank enqueues only once the others have dumped.
    """
    store = dist.distributed_c10d._get_default_store()
    others = [f"dumped_{r}" for r in range(dist.get_world_size()) if r != odd_rank]
    if rank == odd_rank:
        store.wait(others, timedelta(seconds=120))
        odd()
    else:
        normal()
    g["dump"]()
    store.set(f"dumped_{rank}", "1")
    if rank != odd_rank:
        _try(
            lambda: store.wait([f"dumped_{odd_rank}"], timedelta(seconds=120))
        )  # the store's host may be aborted by then


def size_mismatch(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Rank 3 passes a tensor of 16 elements where the others pass 8."""
    dist.all_reduce(torch.ones(8))
    _diverge(
        rank,
        dist,
        g,
        3,
        lambda: dist.all_reduce(torch.ones(8), async_op=True),
        lambda: dist.all_reduce(torch.ones(16), async_op=True),
    )


def dtype_mismatch(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Rank 1 passes float64 where the others pass float32."""
    dist.all_reduce(torch.ones(8))
    _diverge(
        rank,
        dist,
        g,
        1,
        lambda: dist.all_reduce(torch.ones(8), async_op=True),
        lambda: dist.all_reduce(torch.ones(8, dtype=torch.float64), async_op=True),
    )


def type_mismatch(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Rank 2 calls broadcast where the others call all_reduce."""
    t = torch.ones(8)
    dist.all_reduce(t)
    _diverge(rank, dist, g, 2, lambda: dist.all_reduce(t, async_op=True), lambda: dist.broadcast(t, 0, async_op=True))


def order_swap(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Rank 3 calls broadcast then all_reduce; the others all_reduce then broadcast."""
    t = torch.ones(8)
    dist.all_reduce(t)
    _diverge(
        rank,
        dist,
        g,
        3,
        lambda: (dist.all_reduce(t, async_op=True), dist.broadcast(t, 0, async_op=True)),
        lambda: (dist.broadcast(t, 0, async_op=True), dist.all_reduce(t, async_op=True)),
    )


def data_ops(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Healthy: scatter and gather to a root that is not rank 0 (on the whole job and in a tp pair),
    an all_to_all_single with uneven splits, a broadcast from rank 3. Ranks that are not the root
    record an empty side (no scatter list, no gather list): that is no mismatch."""
    world = dist.get_world_size()
    root = 2
    out = torch.zeros(4)
    dist.scatter(out, [torch.full((4,), float(r)) for r in range(world)] if rank == root else None, src=root)
    dist.gather(out, [torch.zeros(4) for _ in range(world)] if rank == root else None, dst=root)
    tp_root = 1 if rank < 2 else 3  # the second member of each tp pair
    pair = dist.get_process_group_ranks(g["tp"])
    dist.scatter(out, [torch.ones(4) for _ in pair] if rank == tp_root else None, src=tp_root, group=g["tp"])
    dist.gather(out, [torch.zeros(4) for _ in pair] if rank == tp_root else None, dst=tp_root, group=g["tp"])
    # rank r sends (r + j) % 3 + 1 rows to rank j: every rank's splits differ, and so do its sizes
    sent = [(rank + j) % 3 + 1 for j in range(world)]
    received = [(j + rank) % 3 + 1 for j in range(world)]
    output = torch.zeros(sum(received), 2)
    dist.all_to_all_single(output, torch.ones(sum(sent), 2), received, sent)
    dist.broadcast(out, 3)
    dist.all_reduce(out)
    dist.barrier()


def _grid(rank: int) -> tuple[int, int, int]:
    """(tp, pp, dp) coordinates of a rank of the 8-rank grid: tp fastest, then dp, then pp."""
    return rank % 2, rank // 4, (rank // 2) % 2


def grid_3d(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """Healthy: 2 tp x 2 pp x 2 dp, a forward and backward with tp all_reduces, the activations sent
    down the pipeline (sends and recvs are not recorded by gloo), dp and pipeline all_reduces."""
    _grid_steps(rank, dist, torch, g, skipper=None)


def grid_3d_skip(rank: int, dist: Any, torch: Any, g: dict[str, Any]) -> None:
    """The 3-D grid, where rank 5 stops before its dp all_reduce of the second step; rank 7 waits for it."""
    _grid_steps(rank, dist, torch, g, skipper=5)


def _grid_steps(rank: int, dist: Any, torch: Any, g: dict[str, Any], skipper: int | None) -> None:
    _, stage, _ = _grid(rank)
    t = torch.ones(8)
    peer = rank + 4 if stage == 0 else rank - 4
    for step in range(2):
        dist.all_reduce(t, group=g["tp"])
        if stage == 0:
            dist.send(t, peer)
        else:
            dist.recv(t, peer)
        dist.all_reduce(t, group=g["tp"])
        if step == 1 and rank == skipper:
            time.sleep(TIMEOUT.total_seconds() + 1)
            g["dump"]()
            return
        _try(lambda: dist.all_reduce(t, group=g["dp"]))
        _try(lambda: dist.all_reduce(t, group=g["pp"]))


SCENARIOS: dict[str, tuple[int, Callable[..., None]]] = {
    "healthy": (4, healthy),
    "skip": (4, skip),
    "skip_subgroup": (4, skip_subgroup),
    "deadlock": (2, deadlock),
    "size_mismatch": (4, size_mismatch),
    "dtype_mismatch": (4, dtype_mismatch),
    "type_mismatch": (4, type_mismatch),
    "order_swap": (4, order_swap),
    "data_ops": (4, data_ops),
    "grid_3d": (8, grid_3d),
    "grid_3d_skip": (8, grid_3d_skip),
}
# Scenarios whose odd ranks dump JSON instead of pickle, to show mixed formats in one job.
JSON_ODD_RANKS = {"healthy"}


def _rank_main(rank: int, world: int, port: int, scenario: str, out_dir: str) -> None:
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=TIMEOUT)
    groups: dict[str, Any] = {}
    if world == 8:
        # tp pairs, pipelines and dp pairs of a 2 x 2 x 2 grid, made by every rank in one order
        for desc, same in (("tp", lambda a, b: a[1:] == b[1:]), ("pp", lambda a, b: (a[0], a[2]) == (b[0], b[2])),
                           ("dp", lambda a, b: a[:2] == b[:2])):  # fmt: skip
            for members in sorted({tuple(r for r in range(8) if same(_grid(r), _grid(m))) for m in range(8)}):
                group = dist.new_group(list(members), timeout=TIMEOUT, group_desc=desc)
                if rank in members:
                    groups[desc] = group
    elif world == 4:
        # Every rank creates every group, in the same order, as torch requires.
        tp = [dist.new_group(members, timeout=TIMEOUT, group_desc="tp") for members in ([0, 1], [2, 3])]
        dp = [dist.new_group(members, timeout=TIMEOUT, group_desc="dp") for members in ([0, 2], [1, 3])]
        groups["tp"], groups["dp"] = tp[rank // 2], dp[rank % 2]
    else:
        groups["x"] = dist.new_group([0, 1], timeout=TIMEOUT, group_desc="x")
        groups["y"] = dist.new_group([0, 1], timeout=TIMEOUT, group_desc="y")
    c10d = torch._C._distributed_c10d

    def dump() -> None:
        if groups.get("dumped"):
            return
        groups["dumped"] = True
        if scenario in JSON_ODD_RANKS and rank % 2:
            data, name = _portable(c10d._dump_fr_trace_json(), True), f"gloo_trace_rank_{rank}.json"
        else:
            data, name = _portable(c10d._dump_fr_trace(), False), f"gloo_trace_rank_{rank}"
        partial = os.path.join(out_dir, name + ".partial")
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, os.path.join(out_dir, name))

    groups["dump"] = dump
    SCENARIOS[scenario][1](rank, dist, torch, groups)
    dump()
    sys.stdout.flush()
    os._exit(0)  # skip destroy_process_group: peers may already be gone


def _portable(data: bytes, as_json: bool) -> bytes:
    """The dump with the paths of this machine in its stack frames made neutral (``/opt/venv/...`` for
    the interpreter's packages, ``/usr/lib/python3.11/...`` for its standard library, ``/job/...`` for
    this checkout): the same data, written again by the
    same kind of writer (pickle protocol 2, or JSON), so that no sample carries where it was made."""
    import json
    import pickle
    import sysconfig

    packages, stdlib = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    doc = json.loads(data) if as_json else pickle.loads(data)  # our own job's dump: plain data

    def neutral(path: str) -> str:
        if path.startswith(packages):
            return "/opt/venv/lib/python3.11/site-packages" + path[len(packages) :]
        if path.startswith(here):
            return "/job" + path[len(here) :]
        if path.startswith(stdlib):
            return "/usr/lib/python3.11" + path[len(stdlib) :]
        return path

    for entry in doc.get("entries", []):
        for frame in entry.get("frames") or []:
            if isinstance(frame, dict) and isinstance(frame.get("filename"), str):
                frame["filename"] = neutral(frame["filename"])
    return json.dumps(doc).encode() if as_json else pickle.dumps(doc, protocol=2)


def run_scenario(scenario: str, out_dir: str) -> list[str]:
    """Run one scenario as a real multi-process gloo job; return the dump files it left.

    Ranks are joined one by one, whatever their exit status: a rank that gloo aborts on purpose
    must not take the others down before they have dumped.
    """
    import multiprocessing

    world = SCENARIOS[scenario][0]
    os.makedirs(out_dir, exist_ok=True)
    context = multiprocessing.get_context("spawn")
    port = free_port()
    ranks = [context.Process(target=_rank_main, args=(r, world, port, scenario, out_dir)) for r in range(world)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + 120
    for process in ranks:
        process.join(max(1.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
    return sorted(
        os.path.join(out_dir, f) for f in os.listdir(out_dir) if "trace_rank_" in f and not f.endswith(".partial")
    )


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for name in sys.argv[2:]:
        print(name, len(run_scenario(name, os.path.join(sys.argv[1], name))), "dumps")
