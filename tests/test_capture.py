"""Capture on real gloo jobs: a dump on request while the rank is blocked, the dump at exit, trigger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, run_cli, start_rank, stop_ranks
from .helpers import free_port, wait_ready, wait_until

pytestmark = pytest.mark.torch_job  # every test here runs a real gloo job

HANG_GUARD = 300  # seconds: what a dump takes is far less, even on a loaded machine

BLOCKED_SCRIPT = """
import sys, time
from datetime import timedelta
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
capture.install()
t = torch.ones(4)
dist.all_reduce(t)
print("ready", flush=True)
if dist.get_rank() == 3:
    time.sleep(600)  # stuck in its own code: ranks 0-2 block in the next all_reduce (until killed)
dist.all_reduce(t)
"""


def _ranks(script: Path, dumps: Path, world: int) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    ranks = []
    for rank in range(world):  # what torchrun does: one process per rank with these variables
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}  # fmt: skip
        ranks.append(start_rank([sys.executable, str(script), str(dumps)], env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))  # fmt: skip
    return ranks


def test_sigusr1_dumps_a_rank_blocked_in_a_collective_at_once(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(BLOCKED_SCRIPT)
    dumps = tmp_path / "dumps"
    ranks = _ranks(script, dumps, 4)
    try:
        wait_ready(ranks)
        time.sleep(3)  # ranks 0-2 are in the second all_reduce, which cannot complete before rank 3 wakes
        os.kill(ranks[0].pid, signal.SIGUSR1)
        dump = dumps / "gloo_trace_rank_0"
        # written while rank 0 is still blocked (for ten minutes): the dump did not wait for the collective
        assert wait_until(dump.exists, HANG_GUARD, every=0.05) and ranks[0].poll() is None
        assert (dumps / "gloo_trace_rank_0.ended").read_text() == "running\n"
    finally:
        stop_ranks(ranks)
    from fr2perfetto.read.job import load_job

    job = load_job([str(dumps)])  # the pid and .ended files beside the dump are not read as dumps
    assert not job.problems and list(job.dumps) == [0]
    # it holds the all_reduce it is blocked in
    assert [e.op for e in job.dumps[0].entries] == ["all_reduce", "all_reduce"]


EXIT_SCRIPT = """
import os, signal, sys
from datetime import timedelta
flag = os.path.join(sys.argv[1], "theirs")
signal.signal(signal.SIGUSR1, lambda *_: open(flag, "w").close())  # the script's own handler
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
capture.install()
t = torch.ones(4)
dist.all_reduce(t)
os.kill(os.getpid(), signal.SIGUSR1)  # a dump on request, mid-run
import time; time.sleep(1)
for _ in range(3):
    dist.all_reduce(t)
dist.destroy_process_group()  # after it, nothing would be left to dump at exit
"""


def test_a_job_that_finishes_rewrites_its_dump_and_says_it_exited(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(EXIT_SCRIPT)
    dumps = tmp_path / "dumps"
    ranks = _ranks(script, dumps, 2)
    assert [p.wait(timeout=120) for p in ranks] == [0, 0]
    assert (dumps / "theirs").exists()  # the script's own handler still ran
    assert (dumps / "gloo_trace_rank_0.ended").read_text() == "exit\n"
    code, stdout, _ = run_cli("analyze", str(dumps), "--json")
    report = json.loads(stdout)
    assert code == 0 and report["verdict"]["status"] == "healthy"  # all four all_reduces, on both ranks
    assert report["job"]["ops"] == 4


def test_trigger_never_blocks_on_a_full_pipe_and_goes_on(tmp_path: Path):
    from fr2perfetto.trigger import PIPE_PREFIX

    full, fine = (tmp_path / f"{PIPE_PREFIX}{rank}.pipe" for rank in range(2))
    for pipe in (full, fine):
        os.mkfifo(pipe)
    readers = [os.open(p, os.O_RDONLY | os.O_NONBLOCK) for p in (full, fine)]
    writer = os.open(full, os.O_WRONLY | os.O_NONBLOCK)
    try:
        try:
            while True:  # a rank that stopped reading its pipe: its buffer is full
                os.write(writer, b"x" * 4096)
        except BlockingIOError:
            pass
        code, stdout, stderr = run_cli("trigger", str(tmp_path), "--rounds", "1")
        received = os.read(readers[1], 16)
    finally:
        for fd in (*readers, writer):
            os.close(fd)
    assert code == 0 and "Asked 1 rank " in stdout and received == b"1\n"
    assert f"{full}: not written (its buffer is full" in stderr and "Traceback" not in stderr


SLEEPER_SCRIPT = BLOCKED_SCRIPT.replace("dist.get_rank() == 3", "dist.get_rank() == 2")


def test_one_documented_command_dumps_every_blocked_gloo_rank_and_analyze_names_the_sleeper(tmp_path: Path):
    """The README's way: a job run with the capture helper; ``fr2perfetto trigger DIR`` while it hangs."""
    script = tmp_path / "train.py"
    script.write_text(SLEEPER_SCRIPT)
    dumps = tmp_path / "dumps"
    ranks = _ranks(script, dumps, 4)
    try:
        wait_ready(ranks)
        time.sleep(2)  # ranks 0, 1 and 3 are in the second all_reduce; rank 2 sleeps in its own code
        code, stdout, stderr = run_cli("trigger", str(dumps), "--rounds", "3", "--every", "1")
        assert code == 0, stderr
        assert "Asked 4 ranks" in stdout
        names = [f"gloo_trace_rank_{rank}" for rank in range(4)]
        wait_until(lambda: all((dumps / n).exists() for n in names), HANG_GUARD)
        assert all(p.poll() is None for p in ranks)  # dumped while blocked: nothing ended
    finally:
        stop_ranks(ranks)
    code, stdout, _ = run_cli("analyze", str(dumps), "--json")
    report = json.loads(stdout)
    assert code == 1 and report["verdict"]["culprit_ranks"][:1] == [2], report["verdict"]
    assert "rank 2" in report["verdict"]["summary"]


# Writes made slow (300 ms per write and per rename: a shared filesystem), a filled buffer, rank 0
# blocked in an all_reduce that rank 1, asleep, never joins.
SLOW_STOP_SCRIPT = """
import os, sys, time
from datetime import timedelta
real_replace = os.replace
def slow_replace(*args, **kwargs):
    time.sleep(0.3)
    return real_replace(*args, **kwargs)
os.replace = slow_replace
real_fdopen = os.fdopen
class SlowFile:
    def __init__(self, handle): self.handle = handle
    def __enter__(self): return self
    def __exit__(self, *exc): self.handle.close()
    def write(self, data):
        time.sleep(0.3)
        return self.handle.write(data)
os.fdopen = lambda *a, **k: SlowFile(real_fdopen(*a, **k))
from fr2perfetto import capture
capture.configure(sys.argv[1], buffer_size=64)
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
capture.install()
t = torch.ones(4)
for _ in range(100):
    dist.all_reduce(t)
print("ready", flush=True)
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(t)
"""
STOP_ROUNDS = int(os.environ.get("FR2PERFETTO_STOP_ROUNDS", "3"))  # the release check runs 20
STOP_BOUND = 20  # seconds from the first SIGTERM within which every rank has ended


@pytest.mark.parametrize("round_", range(STOP_ROUNDS))
def test_two_sigterms_in_a_slow_dump_never_hang_a_rank(tmp_path: Path, round_: int):
    script = tmp_path / "train.py"
    script.write_text(SLOW_STOP_SCRIPT)
    dumps = tmp_path / "dumps"
    ranks = _ranks(script, dumps, 2)
    # torchrun's two SIGTERMs come a moment apart; 0.5 s lands inside the slow writes of the first dump
    gap = [0.5, 0.001, 0.1][round_ % 3]
    try:
        wait_ready(ranks)
        time.sleep(1)  # rank 0 is in the all_reduce rank 1 never joins
        for _ in range(2):
            for process in ranks:
                process.send_signal(signal.SIGTERM)
            time.sleep(gap)
        assert wait_until(lambda: all(p.poll() is not None for p in ranks), STOP_BOUND, every=0.1), "a rank hangs"
    finally:
        stop_ranks(ranks)
    from fr2perfetto.read.job import load_job

    for rank in (0, 1):
        assert (dumps / f"gloo_trace_rank_{rank}.ended").read_text() == "signal SIGTERM\n"
    job = load_job([str(dumps)])
    assert not job.problems and sorted(job.dumps) == [0, 1]  # whole dumps, both read
    assert not list(dumps.glob(".*partial"))  # no half-written file left behind


BLOCKED_BOTH_SCRIPT = """
import sys, time
from datetime import timedelta
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=600))
capture.install()
t = torch.ones(4)
for _ in range(5):
    dist.all_reduce(t)
print("ready", flush=True)
if dist.get_rank() == 0:
    dist.all_reduce(t)  # blocked in C++: rank 1 never joins
else:
    dist.recv(t, src=0)  # blocked in C++ too: rank 0 never sends
"""


def test_sigterm_to_a_rank_blocked_in_a_collective_dumps_and_ends_it(tmp_path: Path):
    # Its main thread runs no Python handler until the collective returns (ten minutes here): the dump
    # is written, and the rank ended, from the request thread, before any launcher's SIGKILL.
    script = tmp_path / "train.py"
    script.write_text(BLOCKED_BOTH_SCRIPT)
    dumps = tmp_path / "dumps"
    ranks = _ranks(script, dumps, 2)
    try:
        wait_ready(ranks)
        time.sleep(1)
        ranks[0].send_signal(signal.SIGTERM)
        assert wait_until(lambda: ranks[0].poll() is not None, STOP_BOUND, every=0.1), "rank 0 hangs"
        assert ranks[0].returncode == 128 + signal.SIGTERM
    finally:
        stop_ranks(ranks)
    assert (dumps / "gloo_trace_rank_0.ended").read_text() == "signal SIGTERM\n"
    from fr2perfetto.read.job import load_job

    job = load_job([str(dumps / "gloo_trace_rank_0")])
    assert not job.problems and list(job.dumps) == [0]
    assert job.dumps[0].entries[-1].op == "all_reduce"  # the collective it was blocked in


def test_a_dump_request_during_a_stop_leaves_the_stop_s_dump(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(SLOW_STOP_SCRIPT)
    dumps = tmp_path / "dumps"
    ranks = _ranks(script, dumps, 2)
    try:
        wait_ready(ranks)
        time.sleep(1)
        for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):  # inside the first dump's slow writes
            for process in ranks:
                process.send_signal(number)
            time.sleep(0.3)
        assert wait_until(lambda: all(p.poll() is not None for p in ranks), STOP_BOUND, every=0.1), "a rank hangs"
    finally:
        stop_ranks(ranks)
    from fr2perfetto.read.job import load_job

    # rank 1 (sleeping) handled the SIGTERM at once; rank 0, blocked in C++, may find all three pending,
    # and CPython runs pending handlers in the order of their numbers: SIGHUP's may be the first
    assert (dumps / "gloo_trace_rank_1.ended").read_text() == "signal SIGTERM\n"
    assert (dumps / "gloo_trace_rank_0.ended").read_text() in ("signal SIGTERM\n", "signal SIGHUP\n")
    job = load_job([str(dumps)])
    assert not job.problems and sorted(job.dumps) == [0, 1]
    assert not list(dumps.glob(".*partial"))


LOGGED_SCRIPT = """
import logging, sys
from fr2perfetto import capture
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append((record.name, record.levelname, record.getMessage()))
logger = logging.getLogger("fr2perfetto.capture")
logger.addHandler(Keep())
logger.propagate = False  # the job routes it: nothing on stderr
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(2))
capture.dump(reason="asked by the test")
print(records)
"""


def test_what_the_capture_helper_says_goes_through_its_logger(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(LOGGED_SCRIPT)
    port = free_port()
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "dumps")], capture_output=True, text=True,
                          env=env, timeout=HANG_GUARD)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "('fr2perfetto.capture', 'WARNING', 'fr2perfetto: rank 0 dumped its Flight Recorder to" in done.stdout
    assert "asked by the test" in done.stdout and "fr2perfetto" not in done.stderr
