"""Run real torch.distributed gloo jobs that fail in ways whose dumps alone look almost healthy, and keep
what a person would have: every rank's Flight Recorder dump and whatever else the job left beside them.

- ``torchrun_abort``: 4 ranks launched by torchrun itself (``python -m torch.distributed.run``), the
  training script set up with ``fr2perfetto.capture``. Each step all_reduces the gradients (async,
  overlapped with the step's compute), then the loss. At step 2 rank 2 skips its gradient all_reduce
  and goes on to the loss's: gloo receives its peers' gradient chunks into the loss's 4 bytes ("Received
  data size doesn't match expected size. Is there a distributed collective mismatch in your code?") and
  aborts rank 2 (SIGABRT). torchrun then stops the others with SIGTERM, on which they dump (``.ended``:
  ``signal SIGTERM``). Rank 2 leaves its rank file (``fr_pid_rank_2``), no dump. torchrun's own output
  (stdout and stderr) is kept as ``torchrun.log``, as ``2>&1 | tee torchrun.log`` would.
- ``checkpoint_hang``: 4 ranks save a checkpoint with ``torch.distributed.checkpoint.save`` through a
  ``FileSystemWriter`` whose write, on rank 1 only, hangs 2.5 times the group's timeout, then raises.
  The others wait for rank 1 in the save's gather of write results and time out; rank 1's error, caught by
  DCP, goes through the same gather afterwards. Every rank dumps at its end: every dump holds the same
  collectives, rank 1 entered the last one more than the timeout after its peers.
- ``pair_skip``: 8 ranks, ``dist.new_subgroups(group_size=2)`` (4 pairs); each step a world all_reduce,
  then the pair's. At step 2 rank 5 skips its pair's all_reduce and goes on to the next world
  all_reduce: rank 4 waits in the pair's op, every other rank in the world's. Each rank catches its
  failure and dumps.

Dumps are pickle (``gloo_trace_rank_<rank>``). Everything kept is written again with this machine's
paths, host name and pids made neutral (``/job/...``, ``/opt/venv/...``, ``node0``; ``gloo_jobs._portable``
for the dumps' stack frames).

    python samples/gloo_failures.py OUT_DIR SCENARIO [SCENARIO ...]

Needs torch (the ``test`` or ``capture`` extra); fr2perfetto itself never does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_jobs import _portable, free_port

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout
SCENARIOS = {"torchrun_abort": 4, "checkpoint_hang": 4, "pair_skip": 8}
HANG_GUARD = 120  # seconds: a job still running then is killed

# torchrun_abort
ABORT_RANK, ABORT_STEP = 2, 2
COMPUTE_SECONDS = 2.5  # each step's compute, overlapped with its gradient all_reduce
GRADIENT_ELEMENTS = 1024
NEUTRAL_HOST = "node0"
NEUTRAL_LAUNCHER_PID, NEUTRAL_RANK_PID = 4000, 4001  # rank r's pid becomes 4001 + r
NEUTRAL_FOLDER = "/shared/fr_dumps"

# checkpoint_hang
CHECKPOINT_TIMEOUT = timedelta(seconds=4)
SLOW_RANK = 1
SLOW_WRITE_SECONDS = 2.5 * CHECKPOINT_TIMEOUT.total_seconds()

# pair_skip
PAIR_TIMEOUT = timedelta(seconds=3)
SKIP_RANK, SKIP_STEP, PAIR_STEPS = 5, 2, 4


# ---------------------------------------------------------------------------------------------- torchrun_abort
def _torchrun_worker(folder: str) -> None:
    """The training script torchrun runs, once per rank (``gloo_failures.py --worker torchrun_abort DIR``)."""
    sys.path.append(HERE)  # fr2perfetto from this checkout, where it is not installed
    from fr2perfetto import capture

    capture.configure(folder)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    capture.install()
    rank = dist.get_rank()
    gradients = torch.ones(GRADIENT_ELEMENTS)
    for step in range(ABORT_STEP + 3):
        if step == ABORT_STEP and rank == ABORT_RANK:
            pass  # SKIPPED HERE: rank 2 goes straight on to the loss's all_reduce
        else:
            work = dist.all_reduce(gradients, async_op=True)  # overlapped with the step's compute
            time.sleep(COMPUTE_SECONDS)
            work.wait()
        loss = torch.ones(1)
        dist.all_reduce(loss)
    dist.destroy_process_group()


def _torchrun_abort(out_dir: str) -> None:
    port = free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "4",
               "--master-addr", "127.0.0.1", "--master-port", str(port), os.path.abspath(__file__), "--worker",
               "torchrun_abort", out_dir]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = os.path.join(out_dir, "torchrun.log")
    with open(log, "wb") as output:
        launcher = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, cwd=out_dir,
                                    start_new_session=True)  # fmt: skip
        try:
            launcher.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    _neutral_files(out_dir, launcher.pid)


def _neutral_files(folder: str, launcher_pid: int) -> None:
    """Write the dumps, the rank files and the log again with this machine's paths, host and pids made
    neutral; drop the rest of what capture leaves (stack files of requests, pipes)."""
    import sysconfig

    pids = {launcher_pid: NEUTRAL_LAUNCHER_PID}
    with open(os.path.join(folder, "torchrun.log"), encoding="utf-8", errors="replace") as handle:
        log = handle.read()
    # torchrun names each worker's pid with its local rank, in its failure table and its warnings
    for rank, pid in re.findall(r"local_rank: (\d+)\)?\s+(?:exitcode\s*: -?\d+ )?\(pid: (\d+)\)", log):
        pids[int(pid)] = NEUTRAL_RANK_PID + int(rank)
    replacements = [
        (folder, NEUTRAL_FOLDER),
        (sysconfig.get_paths()["purelib"], "/opt/venv/lib/python3.11/site-packages"),
        (sys.prefix, "/opt/venv"),
        (HERE, "/job"),
        (sysconfig.get_paths()["stdlib"], "/usr/lib/python3.11"),
    ]
    hosts = {socket.gethostname(), socket.getfqdn()}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        stamp = os.stat(path).st_mtime_ns
        if name.startswith("fr_pid_rank_"):
            with open(path) as handle:
                value = json.loads(handle.read())
            pids.setdefault(value["pid"], NEUTRAL_RANK_PID + int(value["rank"]))
            value["host"], value["pid"] = NEUTRAL_HOST, pids[value["pid"]]
            data = (json.dumps(value) + "\n").encode()
        elif name.startswith("gloo_trace_rank_") and "." not in name:
            with open(path, "rb") as handle:
                data = _portable(handle.read(), False)
        elif name.endswith(".ended"):
            with open(path, "rb") as handle:
                data = handle.read()
        elif name == "torchrun.log":
            continue  # below, once every pid is known
        else:
            os.unlink(path)
            continue
        with open(path, "wb") as handle:
            handle.write(data)
        os.utime(path, ns=(stamp, stamp))
    path = os.path.join(folder, "torchrun.log")
    stamp = os.stat(path).st_mtime_ns
    for real, neutral in replacements:
        log = log.replace(real, neutral)
    for host in hosts:
        log = re.sub(rf"(host\s*:\s*){re.escape(host)}\b", rf"\g<1>{NEUTRAL_HOST}", log)

    def pid(match: re.Match[str]) -> str:
        number = int(match.group(2))
        return match.group(1) + str(pids.get(number, number)) + match.group(3)

    # glog's pid after the time, "(pid: N)", "PID N", "process N"
    log = re.sub(r"(^[EWIF]\d{4} [\d:.]+ )(\d+)( )", pid, log, flags=re.MULTILINE)
    log = re.sub(r"(\(pid: |PID |[Pp]rocess )(\d+)(\b)", pid, log)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(log)
    os.utime(path, ns=(stamp, stamp))


# --------------------------------------------------------------------------------------------- checkpoint_hang
def _checkpoint_hang(rank: int, dist: Any, torch: Any, extra: dict[str, Any]) -> None:
    """Rank 1's storage write hangs past the timeout, then fails; the save's gather waits for it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    class SlowWriter(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            if dist.get_rank() == SLOW_RANK:
                time.sleep(SLOW_WRITE_SECONDS)  # HANGS HERE: the storage never answers in time
                raise OSError("checkpoint storage did not answer")
            return super().write_data(plan, planner)

    torch.manual_seed(rank)
    state = {"layer.weight": torch.randn(16, 16), "layer.bias": torch.randn(16), "step": torch.tensor(3)}
    dcp.save(state, storage_writer=SlowWriter(extra["checkpoint"]))


# --------------------------------------------------------------------------------------------------- pair_skip
def _pair_skip(rank: int, dist: Any, torch: Any, extra: dict[str, Any]) -> None:
    """Rank 5 skips its pair's all_reduce at step 2 and goes on to the next world all_reduce."""
    pair, _ = dist.new_subgroups(group_size=2, timeout=PAIR_TIMEOUT)
    t = torch.ones(8)
    for step in range(PAIR_STEPS):
        dist.all_reduce(t)
        if step == SKIP_STEP and rank == SKIP_RANK:
            continue  # SKIPPED HERE: its pair's all_reduce
        dist.all_reduce(t, group=pair)


JOBS = {"checkpoint_hang": (_checkpoint_hang, CHECKPOINT_TIMEOUT), "pair_skip": (_pair_skip, PAIR_TIMEOUT)}


def _rank_main(rank: int, world: int, port: int, scenario: str, out_dir: str, extra: dict[str, Any]) -> None:
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch
    import torch.distributed as dist

    job, timeout = JOBS[scenario]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timeout)
    try:
        job(rank, dist, torch, extra)
    except Exception as error:  # the failure is the point: a timeout, a closed connection, DCP's error
        print(f"rank {rank}: {type(error).__name__}: {str(error)[:200]}", file=sys.stderr)
    finally:
        name = f"gloo_trace_rank_{rank}"
        partial = os.path.join(out_dir, name + ".partial")
        with open(partial, "wb") as f:
            f.write(_portable(torch._C._distributed_c10d._dump_fr_trace(), False))
        os.replace(partial, os.path.join(out_dir, name))
    sys.stderr.flush()
    os._exit(0)  # skip destroy_process_group: peers may already be gone


def _run_ranks(scenario: str, out_dir: str) -> None:
    import multiprocessing

    world = SCENARIOS[scenario]
    context = multiprocessing.get_context("spawn")
    port = free_port()
    scratch = tempfile.mkdtemp(prefix="fr2perfetto_checkpoint_")
    try:
        extra = {"checkpoint": scratch}
        ranks = [context.Process(target=_rank_main, args=(r, world, port, scenario, out_dir, extra))
                 for r in range(world)]  # fmt: skip
        for process in ranks:
            process.start()
        deadline = time.monotonic() + HANG_GUARD
        for process in ranks:
            process.join(max(1.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_scenario(scenario: str, out_dir: str) -> list[str]:
    """Run one scenario as a real multi-process gloo job; return the files it left in ``out_dir``."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    if scenario == "torchrun_abort":
        _torchrun_abort(out_dir)
    else:
        _run_ranks(scenario, out_dir)
    return sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir) if not f.endswith(".partial"))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker" and sys.argv[2] == "torchrun_abort":
        _torchrun_worker(sys.argv[3])
    elif len(sys.argv) < 3 or not set(sys.argv[2:]) <= set(SCENARIOS):
        sys.exit(__doc__)
    else:
        for name in sys.argv[2:]:
            print(name, len(run_scenario(name, os.path.join(sys.argv[1], name))), "files")
