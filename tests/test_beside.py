"""Dumps as people have them (sub-folders, archives, TorchComms and debug-server layouts) and what lies
beside them: stack snapshots and logs, on the timeline and in the verdict."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT, nccl_layout, run_cli, start_rank, stop_ranks
from .helpers import free_port, wait_ready, wait_until
from .tracecheck import read_trace

DEMO = ROOT / "samples" / "nccl" / "demo"  # rank 5 never issued all_reduce #4 of tp
HANG_GUARD = 300  # seconds: what a real job needs here is far less, even on a loaded machine


def _verdict(*inputs: str) -> dict:
    code, stdout, stderr = run_cli("analyze", *inputs, "--json")
    assert code in (0, 1, 3), stderr
    return json.loads(stdout)


def _shape(path: Path) -> list[tuple[str, str, int, int]]:
    """A trace as a person sees it: each rank's slices (process, name, start, end), paths aside."""
    trace = read_trace(str(path))
    return sorted((trace.process_of(u), name, start, end) for u, start, end, name, _ in trace.all_slices())


def test_sub_folders_and_archives_read_as_the_flat_folder(tmp_path: Path):
    nodes = tmp_path / "nodes"
    for rank, dump in enumerate(sorted(DEMO.iterdir())):
        node = nodes / f"node{rank // 4:02d}"  # what copying each node's dumps off it gives
        node.mkdir(parents=True, exist_ok=True)
        shutil.copy(dump, node / dump.name)
    (nodes / "node00" / "README.md").write_text("notes")
    (nodes / ".cache").mkdir()
    shutil.copy(next(DEMO.iterdir()), nodes / ".cache" / "nccl_trace_rank_99")  # hidden: left out
    with tarfile.open(tmp_path / "dumps.tar.gz", "w:gz") as archive:
        archive.add(DEMO, arcname="dumps")
    with zipfile.ZipFile(tmp_path / "dumps.zip", "w") as archive:
        for dump in DEMO.iterdir():
            archive.write(dump, f"job/{dump.name}")
    flat = _verdict(str(DEMO))["verdict"]
    assert flat["culprit_ranks"] == [5]
    shapes = []
    for source in (DEMO, nodes, tmp_path / "dumps.tar.gz", tmp_path / "dumps.zip"):
        assert _verdict(str(source))["verdict"] == flat, source
        out = tmp_path / f"{source.name}.pftrace"
        assert run_cli("convert", str(source), "-o", str(out), "-q")[0] == 0
        shapes.append(_shape(out))
    assert all(shape == shapes[0] for shape in shapes)
    _, _, stderr = run_cli("analyze", str(nodes))
    assert "1 file skipped (not a dump by its name: README.md)" in stderr


def test_archives_that_would_escape_or_explode_are_refused_in_one_line(tmp_path: Path):
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as archive:
        member = tarfile.TarInfo("../../etc/nccl_trace_rank_0")
        data = (DEMO / "nccl_trace_rank_0").read_bytes()
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    bomb = tmp_path / "bomb.tar.gz"

    class Zeros(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
            buffer[:] = bytes(len(buffer))
            return len(buffer)

    with tarfile.open(bomb, "w:gz") as archive:
        member = tarfile.TarInfo("nccl_trace_rank_0")
        member.size = 64 << 20  # 64 MB of zeros: a few tens of KB compressed
        archive.addfile(member, io.BufferedReader(Zeros()))
    assert bomb.stat().st_size < 1 << 20
    for archive, why in ((evil, "would land outside the archive's folder"), (bomb, "a compression bomb")):
        code, _, stderr = run_cli("analyze", str(archive), "--max-dump-size", "16")
        lines = [line for line in stderr.splitlines() if "archive refused" in line]
        assert code == 2 and len(lines) == 1 and str(archive) in lines[0] and why in lines[0], stderr


def test_torchcomms_names_and_two_dumps_of_one_rank(tmp_path: Path):
    dumps = sorted(DEMO.iterdir())
    (tmp_path / "per_rank").mkdir()
    for dump in dumps[:4]:
        shutil.copy(dump, tmp_path / "per_rank" / f"rank_{dump.name.rsplit('_', 1)[1]}")
    for dump in dumps[4:]:
        shutil.copy(dump, tmp_path / f"torchcomm_fr_trace_{dump.name.rsplit('_', 1)[1]}")
    # an older snapshot of rank 2, as a periodic dumper leaves: only its first entries
    older = pickle.loads((DEMO / "nccl_trace_rank_2").read_bytes())
    older["entries"] = older["entries"][:3]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "nccl_trace_rank_2").write_bytes(pickle.dumps(older))
    report = _verdict(str(tmp_path))
    assert report["verdict"]["culprit_ranks"] == [5] and report["job"]["ranks_with_dump"] == list(range(8))
    skipped = [p for p in report["input_problems"] if "has a newer dump" in p["reason"]]
    assert len(skipped) == 1 and skipped[0]["path"].endswith("old/nccl_trace_rank_2") and not skipped[0].get("fatal")


PY_SPY = """Process 4242: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    _wait_for_tstate_lock (threading.py:1132)
    next_batch (/job/data.py:77)
    train_step (/job/train.py:140)
    <module> (/job/train.py:200)
Thread 4250 (idle): "pt_autograd_0"
    wait (threading.py:327)
"""


def test_a_py_spy_dump_says_where_the_culprit_is(tmp_path: Path):
    shutil.copytree(DEMO, tmp_path / "dumps")
    (tmp_path / "dumps" / "pyspy_rank_5.txt").write_text(PY_SPY)  # taken by hand on the hung rank
    report = _verdict(str(tmp_path / "dumps"))
    assert report["verdict"]["summary"].endswith("; rank 5 is in next_batch at data.py:77, not in a collective")
    (stack,) = report["stacks"]
    assert stack["rank"] == 5 and stack["thread"] == "MainThread" and not stack.get("in_collective")
    out = tmp_path / "t.pftrace"
    run_cli("convert", str(tmp_path / "dumps"), "-o", str(out), "-q")
    trace = read_trace(str(out))
    notes = [(trace.process_of(u), n) for u, items in trace.instants.items() for _, n in items if n.startswith("⌖")]
    assert notes == [("rank 5", "⌖ stuck in next_batch (data.py:77)")]


# Formats from PyTorch's source: the watchdog's (ProcessGroupNCCL.cpp, WorkNCCL::checkTimeout) and
# the CUDA check's (c10/cuda/CUDAException.h), with glog's prefix as torchrun prints it.
NCCL_LOG = """\
[rank0]:[E1203 10:00:01.123456789 ProcessGroupNCCL.cpp:683] [Rank 0] Watchdog caught collective operation \
timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600029 \
milliseconds before timing out.
[rank3]:[E1203 09:50:00.000000000 CUDAException.cpp:45] CUDA error: an illegal memory access was encountered
garbage \x00\x01 that is no log line at all
[rank3]: Traceback (most recent call last):
[rank3]:   File "/job/train.py", line 140, in train_step
[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered
"""


def test_a_rank_that_died_of_a_cuda_error_without_a_dump_is_the_culprit(tmp_path: Path):
    dumps = tmp_path / "dumps"
    nccl_layout.write_scenario("missing_dump", str(dumps))  # rank 3 left no dump; ranks 0-2 wait in #6
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "job.log").write_text(NCCL_LOG)
    (logs / "binary.log").write_bytes(os.urandom(4096))  # unreadable as text: ignored
    report = _verdict(str(dumps), "--logs", str(logs))
    verdict = report["verdict"]
    assert verdict["culprit_ranks"][0] == 3 and verdict["category"].startswith("a rank crashed")
    assert (
        "rank 3's log says: [E1203 09:50:00.000000000 CUDAException.cpp:45] CUDA error: an illegal memory"
        in (verdict["summary"])
    )
    assert any("rank 0's watchdog timed out in ALLREDUCE SeqNum=6 after 600029 ms; its dump agrees: all_reduce #6"
               in line for line in verdict["evidence"])  # fmt: skip
    kinds = sorted({(e.get("rank", 0), e["kind"]) for e in report["log_events"]})
    assert kinds == [(0, "watchdog_timeout"), (3, "cuda_error"), (3, "exception")]
    out = tmp_path / "t.pftrace"
    assert run_cli("convert", str(dumps), "--logs", str(logs), "-o", str(out), "-q")[0] == 0
    notes = [(read_trace(str(out)).process_of(u), n) for u, items in read_trace(str(out)).instants.items()
             for _, n in items if n.startswith("✗ WATCHDOG")]  # fmt: skip
    assert [p for p, _ in notes] == ["rank 0"]


JOB_WITH_DEBUG_SERVER = """
import os, sys, socket, time
from datetime import timedelta
socket.gethostname = lambda: "127.0.0.1"  # each worker registers this address: loopback only
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
from torch.distributed.debug import start_debug_server
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
start_debug_server(port=int(os.environ["DEBUG_PORT"]), dump_dir=sys.argv[1], dump_interval=1.0)
capture.install()
t = torch.ones(4)

def train_step(step):
    dist.all_reduce(t)
    if step == 1 and dist.get_rank() == 1:
        print("sleeping", flush=True)
        time.sleep(600)  # SLEEP LINE
    dist.all_reduce(t)

for step in range(3):
    train_step(step)
"""


@pytest.mark.torch_job
def test_the_debug_servers_folder_of_a_real_job_names_where_the_sleeper_is(tmp_path: Path):
    script = tmp_path / "job.py"
    script.write_text(JOB_WITH_DEBUG_SERVER)
    sleep_line = JOB_WITH_DEBUG_SERVER.splitlines().index("        time.sleep(600)  # SLEEP LINE") + 1
    folder = tmp_path / "debug"
    port, debug_port = free_port(), free_port()
    ranks = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "DEBUG_PORT": str(debug_port), "PYTHONPATH": str(ROOT)}  # fmt: skip
        ranks.append(start_rank([sys.executable, str(script), str(folder)], env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))  # fmt: skip
    try:
        wait_ready([ranks[1]], b"sleeping")
        slept_at = time.time()
        # the server snapshots every rank's stacks each second: wait for two taken while rank 1 sleeps
        wait_until(lambda: sum(1 for p in folder.glob("stacks_*.txt") if p.stat().st_mtime > slept_at + 1) >= 2,
                   HANG_GUARD, every=0.2)  # fmt: skip
        for process in ranks:
            os.kill(process.pid, signal.SIGUSR1)  # the dumps, while rank 0 waits in all_reduce
        dumps = [folder / f"gloo_trace_rank_{rank}" for rank in range(2)]
        wait_until(lambda: all(d.exists() for d in dumps), HANG_GUARD, every=0.2)
    finally:
        stop_ranks(ranks)
    names = sorted(p.name for p in folder.iterdir())
    assert any(n.startswith("stacks_") for n in names) and "gloo_trace_rank_1" in names
    report = _verdict(str(folder))
    verdict = report["verdict"]
    assert verdict["culprit_ranks"] == [1]
    assert verdict["summary"].startswith("hang: rank 1 never issued all_reduce #4 of default_pg")
    assert verdict["summary"].endswith(f"rank 1 is in train_step at job.py:{sleep_line}, not in a collective")
    out = tmp_path / "t.pftrace"
    assert run_cli("convert", str(folder), "-o", str(out), "-q")[0] == 0
    trace = read_trace(str(out))
    notes = [(trace.process_of(u), n) for u, items in trace.instants.items() for _, n in items if n.startswith("⌖")]
    assert ("rank 1", f"⌖ stuck in train_step (job.py:{sleep_line})") in notes


RAISING_JOB = """
import sys
from datetime import timedelta
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=10))
capture.install()
t = torch.ones(4)
for step in range(4):
    if step == 2 and dist.get_rank() == 1:
        raise ValueError("loss is NaN on rank 1")
    dist.all_reduce(t)
"""


@pytest.mark.torch_job
def test_a_real_job_launched_by_torchrun_with_its_logs(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(RAISING_JOB)
    dumps, logs = tmp_path / "dumps", tmp_path / "logs"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), "--log-dir", str(logs), "--redirects", "3",
               str(script), str(dumps)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launched = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
    assert launched.returncode != 0
    (logs / "torchrun.log").write_text(launched.stderr)  # the launcher's own output, failure table in it
    report = _verdict(str(dumps), "--logs", str(logs))
    verdict = report["verdict"]
    assert verdict["culprit_ranks"][0] == 1 and "rank 1 never issued all_reduce #3" in verdict["summary"]
    finding = report["findings"][0]
    # quoted from its worker log, or from the .ended file the capture helper wrote: the same exception
    assert any(line.startswith(("rank 1's log (", "rank 1's .ended file (")) and "ValueError: loss is NaN on rank 1"
               in line for line in finding["evidence"])  # fmt: skip
    kinds = {(e.get("rank", 0), e["kind"]) for e in report["log_events"]}
    assert (1, "exception") in kinds and (1, "child_failed") in kinds


def test_every_log_line_kind_is_recognised_and_nothing_else():
    from fr2perfetto.read.logs import parse_log

    # formats from ProcessGroupNCCL.cpp (HeartbeatMonitor), NCCLUtils.hpp (C10D_NCCL_CHECK) and NCCL's results
    text = """\
[rank2]:[E1203 10:00:01.000 ProcessGroupNCCL.cpp:1401] [PG ID 0 PG GUID 0(default_pg) Rank 2] Heartbeat monitor \
timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1
[rank2]:[F1203 10:00:02.000 ProcessGroupNCCL.cpp:1420] [PG ID 0 PG GUID 0(default_pg) Rank 2] ProcessGroupNCCL's \
watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.
[rank6]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2047, remote process exited \
or there was a network error, NCCL version 2.27.5
[rank6]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
2026-12-03 10:00:03,120 INFO nothing wrong here
[rank9]: something ncclSystemError-looking but from an unknown rank beyond nothing\x00\xff
"""
    events = parse_log(text, "job.log", 2026)
    got = [(e.rank, e.kind) for e in events]
    # rank 6's lines say a remote process went away: what happened to it, not an error of its own
    assert got == [(2, "watchdog_stuck"), (2, "watchdog_stuck"), (6, "comm_failure"), (6, "comm_failure"),
                   (9, "nccl_error")]  # fmt: skip
    assert events[0].time_ns is not None and events[0].source == "job.log:1"
    assert parse_log("\x00\x01 not a log \n" * 100, "x.log") == []
