"""Run a real pipeline-parallel training job on gloo under PyTorch's debug server, and keep what a person
would have when it hangs: every rank's Flight Recorder dump and the debug server's stack snapshots.

Four ranks, one stage each of a small MLP, ``torch.distributed.pipelining``'s ``Schedule1F1B`` over 8
microbatches, and an ``all_reduce`` of the loss at the end of each step (the only op gloo's Flight
Recorder records: it records no send or recv). ``torch.distributed.debug.start_debug_server`` writes
``stacks_<YYYYmmdd_HHMMSS>.txt`` (every rank's Python threads) every second; ``fr2perfetto.capture``
dumps each rank on SIGUSR1 while it is blocked.

- ``pipeline_healthy``: trains for some seconds while the snapshots are taken, then every rank dumps.
- ``pipeline_stopped``: at step 3, stage 2 stops on the CPU in the middle of its forward (its own code,
  before its next send); the other stages block in ``_wait_batch_p2p``. Once the debug server has taken
  several snapshots of the hang, every rank is asked to dump.

The stack snapshots and dumps are written again with this machine's paths made neutral (``/job/...``,
``/opt/venv/...``), as ``gloo_jobs._portable`` does for dumps.

    python samples/gloo_pipeline.py OUT_DIR pipeline_healthy|pipeline_stopped
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_jobs import free_port

SCENARIOS = ("pipeline_healthy", "pipeline_stopped")
WORLD = 4
STEPS = 12
STOP_STEP = 3
STOPPED_STAGE = 2
SNAPSHOTS_OF_THE_HANG = 5  # stack files written after the stage stopped, before the dumps are asked for
HANG_GUARD = 300

JOB = """
import os, sys, time
from datetime import timedelta
__import__("socket").gethostname = lambda: "127.0.0.1"  # the debug server's workers register it: loopback
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
from torch.distributed.debug import start_debug_server
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
scenario, debug_port = sys.argv[2], int(os.environ["DEBUG_PORT"])
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
start_debug_server(port=debug_port, dump_dir=sys.argv[1], dump_interval=1.0)
capture.install()
torch.manual_seed(rank)


class Stage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
        self.step = 0

    def forward(self, x):
        if scenario == "pipeline_stopped" and rank == STOPPED_STAGE and self.step == STOP_STEP:
            print("stopped", flush=True)
            time.sleep(3600)  # STOPPED HERE: on the CPU, in its own code, before its next send
        return torch.relu(self.layers(x))


model = Stage()
stage = PipelineStage(model, rank, world, torch.device("cpu"))
schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=lambda out, target: ((out - target) ** 2).mean())
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
print("ready", flush=True)
for step in range(STEPS):
    model.step = step
    x, target = torch.randn(64, 256), torch.randn(64, 256)
    optimizer.zero_grad()
    losses = []
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=target, losses=losses)
    else:
        schedule.step()
    optimizer.step()
    loss = torch.tensor([float(sum(l.item() for l in losses))])
    dist.all_reduce(loss)  # the one op of the step that gloo's Flight Recorder records
print("trained", flush=True)
time.sleep(3600)  # until the dumps are taken and the job is ended
"""


def run_scenario(scenario: str, out_dir: str) -> list[str]:
    """Run the job; return the files it left in ``out_dir`` (dumps, stack snapshots)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    script = os.path.join(out_dir, ".job.py")
    with open(script, "w") as out:
        out.write(f"STOP_STEP, STOPPED_STAGE, STEPS = {STOP_STEP}, {STOPPED_STAGE}, {STEPS}\n" + JOB)
    port, debug_port = free_port(), free_port()
    ranks = []
    for rank in range(WORLD):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "DEBUG_PORT": str(debug_port), "PYTHONPATH": here,
               "TORCH_FR_BUFFER_SIZE": "2000"}  # fmt: skip
        # a session of its own: killing it ends the debug server's workers too, which outlive a rank
        ranks.append(subprocess.Popen([sys.executable, script, out_dir, scenario], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, start_new_session=True))  # fmt: skip
    try:
        for process in ranks:
            assert process.stdout is not None and process.stdout.readline().strip() == b"ready"
        if scenario == "pipeline_stopped":
            waiting_for = ranks[STOPPED_STAGE]
            assert waiting_for.stdout is not None and waiting_for.stdout.readline().strip() == b"stopped"
        else:
            for process in ranks:
                assert process.stdout is not None and process.stdout.readline().strip() == b"trained"
        deadline = time.monotonic() + HANG_GUARD
        if scenario == "pipeline_stopped":
            stopped_at = time.time()
            while time.monotonic() < deadline and len(_stacks_after(out_dir, stopped_at)) < SNAPSHOTS_OF_THE_HANG:
                time.sleep(0.2)
        for process in ranks:
            os.kill(process.pid, signal.SIGUSR1)  # capture dumps at once, blocked or not
        dumps = [os.path.join(out_dir, f"gloo_trace_rank_{rank}") for rank in range(WORLD)]
        while time.monotonic() < deadline and not all(os.path.exists(d) for d in dumps):
            time.sleep(0.2)
    finally:
        for process in ranks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    _portable(out_dir, here)
    os.unlink(script)
    return sorted(os.path.join(out_dir, name) for name in os.listdir(out_dir))


def _stacks_after(folder: str, moment: float) -> list[str]:
    """The debug server's snapshot files written after ``moment`` (by their names' times, local time)."""
    found = []
    for name in os.listdir(folder):
        if name.startswith("stacks_") and name.endswith(".txt"):
            stamp = time.mktime(time.strptime(name[7:22], "%Y%m%d_%H%M%S"))
            if stamp > moment:
                found.append(name)
    return found


def _portable(folder: str, here: str) -> None:
    """Rewrite the dumps and snapshots with this machine's paths made neutral, and drop what is neither
    (the debug server's other dumps, capture's rank files and pipes)."""
    import sysconfig

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gloo_jobs import _portable as portable_dump

    packages, stdlib = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith("."):
            continue  # the job's script, removed by the caller
        if name.startswith("gloo_trace_rank_") and "." not in name:
            with open(path, "rb") as handle:
                data = portable_dump(handle.read(), False)
        elif name.startswith("stacks_") and name.endswith(".txt"):
            with open(path) as handle:
                text = handle.read()
            text = text.replace(packages, "/opt/venv/lib/python3.11/site-packages").replace(folder, "/job")
            text = text.replace(here, "/job").replace(stdlib, "/usr/lib/python3.11")
            text = text.replace('"/job/.job.py"', '"/job/train.py"')
            data = text.encode()
        else:
            if os.path.isfile(path) or os.path.islink(path):
                os.unlink(path)
            continue
        stamp = os.stat(path).st_mtime_ns
        with open(path, "wb") as handle:
            handle.write(data)
        os.utime(path, ns=(stamp, stamp))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in SCENARIOS:
        sys.exit(__doc__)
    print(sys.argv[2], len(run_scenario(sys.argv[2], os.path.join(sys.argv[1], sys.argv[2]))), "files")
