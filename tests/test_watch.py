"""``fr2perfetto watch``: a hang caught while the job still hangs, from PyTorch's debug server or the folder it
writes into; a job that ends well let go; and servers that are slow, garbled or gone never hang the watch
nor end it in a traceback."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fr2perfetto
from fr2perfetto.live.progress import Failure, Mark, Progress, Sample

from .conftest import ROOT, run_cli, start_rank, stop_ranks
from .fake_debug_server import FakeJob
from .helpers import free_port

HANG_GUARD = 300  # seconds: what a real job needs here is far less, even on a loaded machine


def _later(seconds: float, action) -> threading.Timer:  # type: ignore[no-untyped-def]
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()
    return timer


def _lines_about(stderr: str, word: str) -> list[str]:
    return [line for line in stderr.splitlines() if word in line]


# Progress: pure, on a clock of our own


def _sample(enqueued: int, completed: int, desc: str = "default_pg") -> Sample:
    return Sample({"0": Mark(enqueued, -1, completed, "all_reduce")}, {"0": desc}, enqueued - 1)


def test_progress_tells_moves_the_rank_behind_and_a_stall():
    progress = Progress(stall=10, now=0)
    progress.known([0, 1, 2])
    assert progress.status(0).line() == "0/3 ranks answering (not 0-2), 0 groups, - ops/s, waiting for the first op"
    assert progress.observe(0, {r: _sample(5, 5) for r in range(3)}) == []
    progress.observe(1, {0: _sample(6, 5), 1: _sample(6, 5), 2: _sample(5, 5)})
    status = progress.status(1)
    assert status.behind is not None and (status.behind.rank, status.behind.by) == (2, 1)
    assert status.since_progress == 0 and not status.stalled and status.ops == 6
    assert "furthest behind: rank 2, 1 op behind in default_pg (pg 0), after all_reduce" in status.line()
    progress.observe(6, {0: _sample(6, 5), 1: _sample(6, 5), 2: _sample(5, 5)})  # nothing moved
    assert not progress.stalled(6) and progress.stalled(11)
    # a rank that stops answering is said once, at once; and when it is back
    assert progress.observe(12, {1: Failure("no whole answer within 1 s")}) == [
        "rank 1 stopped answering: no whole answer within 1 s"
    ]
    assert progress.observe(13, {1: Failure("no whole answer within 1 s")}) == []
    assert progress.status(13).line().startswith("2/3 ranks answering (not 1), 1 group")
    assert progress.observe(14, {1: _sample(6, 5)}) == ["rank 1 answers again"]
    gone = Failure("connection refused (nothing listens there)", gone=True)
    assert progress.observe(15, dict.fromkeys(range(3), gone)) == [
        "ranks 0-2 stopped answering: connection refused (nothing listens there)"
    ]
    assert progress.gone() == [0, 1, 2]


def test_what_a_rank_says_reaches_the_line_escaped():
    progress = Progress(stall=10, now=0)
    progress.observe(0, {0: _sample(2, 2, "\x1b]0;owned\x07tp\u202e"), 1: _sample(1, 1, "\x1b]0;owned\x07tp\u202e")})
    line = progress.status(0).line()
    assert "\x1b" not in line and "\u202e" not in line and "\\x1b]0;owned\\x07tp\\u202e" in line


def test_by_stacks_alone_a_stall_needs_a_rank_waiting_in_a_collective():
    def at(place: str, waiting: bool) -> Sample:
        return Sample(place=(place,), in_collective=waiting)

    progress = Progress(stall=5, now=0)
    for now in range(20):  # every rank sleeps between steps, always at the same line: no hang
        progress.observe(now, {0: at("train.py:20", False), 1: at("train.py:20", False)})
    assert not progress.stalled(19) and progress.status(19).from_stacks
    progress.observe(20, {0: at("c10d.py:3245", True), 1: at("train.py:17", False)})
    for now in range(21, 27):
        progress.observe(now, {0: at("c10d.py:3245", True), 1: at("train.py:17", False)})
    assert progress.stalled(26) and "outside a collective: rank 1" in progress.status(26).line()


# A stand-in debug server: fast, every way a server can be wrong


@pytest.fixture()
def fake_job():
    jobs: list[FakeJob] = []

    def make(ranks: int = 4, **options: object) -> FakeJob:
        job = FakeJob(ranks, **options)  # type: ignore[arg-type]
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        if job.running:
            job.close()


def test_a_hang_is_caught_with_its_verdict_evidence_trace_and_hook(tmp_path: Path, fake_job):
    job = fake_job(4)
    _later(2.0, lambda: job.stop(2))
    out, said = tmp_path / "evidence", tmp_path / "hook.json"
    code = f"import json, sys; json.dump(sys.argv[1:], open({str(said)!r}, 'w'))"
    hook = shlex.join([sys.executable, "-c", code, "--from-hook"])  # the report's path comes after
    started = time.monotonic()
    code, stdout, stderr = run_cli("watch", job.url, "--stall", "1", "--every", "0.2", "--json", "--out", str(out),
                                   "--on-hang", hook)  # fmt: skip
    assert code == 1, stderr
    assert time.monotonic() - started < 60
    report = json.loads(stdout)  # standard output holds the report alone
    assert report["verdict"]["status"] == "hang" and report["verdict"]["culprit_ranks"][0] == 2
    assert report["verdict"]["summary"].startswith("hang: rank 2 never issued all_reduce #")
    names = sorted(p.name for p in out.iterdir())
    assert {f"gloo_trace_rank_{r}.json" for r in range(4)} <= set(names)
    assert {f"gloo_trace_rank_{r}.json.ended" for r in range(4)} <= set(names)
    assert sum(1 for n in names if n.startswith("stacks_rank_2_")) == 2  # twice, seconds apart
    assert {"fr2perfetto_report.json", "fr2perfetto_watch.json", "hang.pftrace"} <= set(names)
    assert json.loads(said.read_text()) == ["--from-hook", str(out / "fr2perfetto_report.json")]
    assert json.loads((out / "fr2perfetto_report.json").read_text()) == report
    # analyze reads the evidence to the same report, and nothing there is a file it would warn about
    code, again, warnings = run_cli("analyze", str(out), "--json")
    assert code == 1 and json.loads(again) == report and not warnings.strip()
    assert _lines_about(stderr, "furthest behind: rank 2, 1 op behind in default_pg")


def test_requests_are_few_at_once_and_bounded_per_rank_and_a_job_that_ends_is_let_go(fake_job, monkeypatch):
    from fr2perfetto.live import sources

    job = fake_job(12)
    _later(3.0, job.close)
    at_once, most, lock = [0], [0], threading.Lock()
    fetch = sources.fetch

    def counted(*args, **options):  # type: ignore[no-untyped-def]
        with lock:
            at_once[0] += 1
            most[0] = max(most[0], at_once[0])
        try:
            return fetch(*args, **options)
        finally:
            with lock:
                at_once[0] -= 1

    monkeypatch.setattr(sources, "fetch", counted)
    started = time.monotonic()
    code, stdout, stderr = run_cli("watch", job.url, "--every", "0.5")
    took = time.monotonic() - started
    assert code == 0, stderr
    assert stdout.startswith("the job ended: its servers went away") and len(stdout.splitlines()) == 1
    assert "Traceback" not in stderr and took < 15
    assert most[0] == 4  # never more requests at once, whatever the ranks
    assert max(job.requests) <= took / 0.5 + 2  # one request a rank a round, a round every 0.5 s


def test_keep_going_catches_each_hang_once_and_goes_on_while_the_job_moves(tmp_path: Path, fake_job):
    job = fake_job(3)
    out = tmp_path / "ev"

    def drive() -> None:  # a hang, the job moves again, another hang, then the job ends
        for report in (out / "fr2perfetto_report.json", Path(f"{out}-2") / "fr2perfetto_report.json"):
            time.sleep(1.0)
            job.stop(1)
            deadline = time.monotonic() + 60
            while not report.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            with job.lock:
                job.stuck = None
        time.sleep(1.0)
        job.close()

    threading.Thread(target=drive, daemon=True).start()
    code, stdout, stderr = run_cli("watch", job.url, "--stall", "1", "--every", "0.2", "--keep-going", "--json",
                                   "--out", str(out))  # fmt: skip
    assert code == 1, stderr
    assert stderr.count("taking the evidence into") == 2 and Path(f"{out}-2", "hang.pftrace").exists()
    assert stdout.count('"status": "hang"') == 2  # a report for each
    summary = stderr.strip().splitlines()[-1]
    assert summary.startswith("the job ended: its servers went away") and "2 hangs caught before" in summary


@pytest.mark.parametrize(
    ("behaviour", "timeout", "reason"),
    [
        ("slow", "0.5", "no whole answer within 0.5 s"),
        ("dribble", "0.5", "no whole answer within 0.5 s"),
        # not about time: a timeout a busy machine cannot overrun, so the answer is read and judged
        ("garbage", "5", "its gloo Flight Recorder could not be read (not a Flight Recorder dump"),
        ("huge", "5", "an answer over the"),
    ],
)
def test_a_worker_slow_garbled_or_endless_is_said_in_one_line_and_never_holds_the_watch(
    fake_job, behaviour, timeout, reason
):
    job = fake_job(3)
    job.behaviour[1] = behaviour
    _later(3.0, job.close)
    started = time.monotonic()
    code, _, stderr = run_cli("watch", job.url, "--every", "0.3", "--timeout", timeout, "--max-answer", "64")
    assert time.monotonic() - started < 20
    assert code == 0 and "Traceback" not in stderr, stderr
    said = _lines_about(stderr, "rank 1 does not answer")
    assert len(said) == 1 and reason in said[0], stderr
    assert "\x1b" not in stderr and "\x00" not in stderr


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("garbage", "answers, but is not PyTorch's debug server: no rank is listed at /wait_counters or"),
        ("silent", "no whole answer within 0.5 s, for 1 s: the job never started its debug server there"),
    ],
)
def test_a_frontend_that_is_no_debug_server_is_one_line_exit_2(fake_job, behaviour, message):
    job = fake_job(2)
    job.frontend_behaviour = behaviour
    started = time.monotonic()
    code, stdout, stderr = run_cli("watch", job.url, "--wait", "1", "--timeout", "0.5")
    assert time.monotonic() - started < 10
    lines = stderr.strip().splitlines()
    assert code == 2 and lines[-1].startswith("error: ") and message in lines[-1], stderr
    assert not stdout and "\x1b" not in stderr and "\x07" not in stderr


def test_nothing_listening_a_wrong_address_and_wrong_options_are_one_line_exit_2(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    code, _, stderr = run_cli("watch", f"http://127.0.0.1:{port}", "--wait", "0")
    assert code == 2 and "connection refused" in stderr and "never started" in stderr
    for args, said in (
        (["https://127.0.0.1:1"], "starts with http://"),
        (["http://user:pw@127.0.0.1:1"], "a user name or password"),
        (["http://127.0.0.1:1", "--on-hang", "'unclosed"], "--on-hang: No closing quotation"),
        (["http://127.0.0.1:1", "--json", "--format", "markdown"], "ask for two formats"),
        ([str(tmp_path / "none"), "--wait", "0"], "no such folder"),
    ):
        code, _, stderr = run_cli("watch", *args)
        assert code == 2 and said in stderr and len(stderr.strip().splitlines()) == 1, (args, stderr)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    code, _, stderr = run_cli("watch", "http://127.0.0.1:1", "--out", str(tmp_path / "full"))
    assert code == 2 and "a folder with files in it already" in stderr


def test_help_repeats_pytorchs_warning_and_shows_examples():
    code, stdout, _ = run_cli("watch", "--help")
    text = " ".join(stdout.split())
    assert code == 0 and "Example" in stdout
    assert "intended to be used only in trusted network environments" in text
    assert "should not be exposed to the public internet" in text


def test_the_api_returns_the_report_and_calls_back(tmp_path: Path, fake_job):
    job = fake_job(4)
    _later(1.5, lambda: job.stop(1))
    lines: list[str] = []
    caught: list[tuple[str, str]] = []
    report = fr2perfetto.watch(job.url, stall=1, every=0.2, out=tmp_path / "ev",
                               on_progress=lambda status: lines.append(status.line()),
                               on_hang=lambda r, folder: caught.append((r.status, folder)))  # fmt: skip
    assert report is not None and report.status == "hang" and report.culprits[0].rank == 1
    assert caught == [("hang", str(tmp_path / "ev"))] and any("4/4 ranks answering" in line for line in lines)
    job2 = fake_job(2)
    _later(1.0, job2.close)
    assert fr2perfetto.watch([job2.worker_url(0), f"1={job2.worker_url(1)}"], every=0.2) is None
    with pytest.raises(ValueError, match="never started"):
        fr2perfetto.watch(job2.url, wait=0.2, every=0.2)


def test_a_folder_whose_ranks_say_how_they_ended(tmp_path: Path):
    sample = ROOT / "samples" / "gloo" / "skip"
    endings = [("exit", 0, "every rank's .ended file says exit"),
               ("exception: ValueError: loss is NaN", 1, "rank 0's .ended file says exception")]  # fmt: skip
    for ending, code, said in endings:
        folder = tmp_path / ending.split(":")[0]
        folder.mkdir()

        def write(folder: Path = folder, ending: str = ending) -> None:
            for dump in sorted(sample.glob("gloo_trace_rank_*")):
                shutil.copy(dump, folder / dump.name)
                (folder / f"{dump.name}.ended").write_text(ending + "\n")

        _later(1.0, write)
        started = time.monotonic()
        result, stdout, stderr = run_cli("watch", str(folder), "--every", "0.2")
        assert result == code and said in stdout, stderr
        assert time.monotonic() - started < 15


def test_a_folder_whose_job_ended_with_its_stacks_standing_still_is_let_go_not_caught(tmp_path: Path):
    """The debug server's last snapshots stand still (its ranks waited in their last op) and then stop: when
    the stall has run, the workers they name are asked before any evidence is taken, and they are gone."""
    # a snapshot the debug server wrote while the job ran (named by when: the samples' generator names them anew)
    stacks = sorted((ROOT / "samples" / "gloo" / "pipeline_healthy").glob("stacks_2*.txt"))[0].read_text()
    ports = iter([free_port() for _ in range(4)])  # nothing listens there any more: the workers went away
    text = "".join(part if index % 2 == 0 else f"http://127.0.0.1:{next(ports)}"
                   for index, part in enumerate(re.split(r"(http://127\.0\.0\.1:\d+)", stacks)))  # fmt: skip
    folder = tmp_path / "debug"
    folder.mkdir()

    def write() -> None:  # three snapshots alike, named as the server names them, then nothing
        for later in range(3):
            name = time.strftime("stacks_%Y%m%d_%H%M%S.txt", time.localtime(time.time() + later))
            (folder / name).write_text(text)

    _later(0.5, write)
    evidence = tmp_path / "evidence"
    result, stdout, stderr = run_cli("watch", str(folder), "--stall", "2", "--every", "0.2", "--out", str(evidence))
    assert result == 0 and stdout.startswith(f"the job ended: nothing new was written into {folder}"), stderr
    assert "workers went away" in stdout and "taking the evidence" not in stderr


# Real jobs: 4 gloo ranks under PyTorch's debug server, all-reducing every 0.2 s


JOB = """
import os, sys, socket, time
from datetime import timedelta
socket.gethostname = lambda: "127.0.0.1"  # each worker registers this address: loopback only
import torch, torch.distributed as dist
from torch.distributed.debug import start_debug_server

dist.init_process_group("gloo", timeout=timedelta(seconds=300))
start_debug_server(port=int(os.environ["DEBUG_PORT"]), dump_dir=os.environ.get("DUMP_DIR"), dump_interval=2.0)
t = torch.ones(4)

def train_step(step):
    if step == 30 and dist.get_rank() == int(os.environ["STUCK_RANK"]):
        with open(os.environ["STUCK_FILE"], "w") as f:
            f.write(str(time.time()))
        while True:  # STUCK LINE
            pass
    dist.all_reduce(t)

for step in range(int(os.environ["STEPS"])):
    train_step(step)
    time.sleep(0.2)
if dist.get_rank() == 0:
    with open(os.environ["DONE_FILE"], "w") as f:
        f.write(str(time.time()))
"""


def _start_job(tmp_path: Path, *, stuck_rank: int, steps: int, dump_dir: Path | None = None):  # type: ignore[no-untyped-def]
    script = tmp_path / "job.py"
    script.write_text(JOB)
    port, debug_port = free_port(), free_port()
    ranks = []
    for rank in range(4):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "DEBUG_PORT": str(debug_port), "STUCK_RANK": str(stuck_rank), "STEPS": str(steps),
               "STUCK_FILE": str(tmp_path / "stuck"), "DONE_FILE": str(tmp_path / "done"),
               "TORCH_FR_BUFFER_SIZE": "2000"}  # fmt: skip
        if dump_dir is not None:
            env["DUMP_DIR"] = str(dump_dir)
        ranks.append(start_rank([sys.executable, str(script)], env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL))  # fmt: skip
    return ranks, f"http://127.0.0.1:{debug_port}"


def _watch_process(target: str, *args: str) -> tuple[int, str, str, float]:
    """``fr2perfetto watch`` as a process of its own, started with the job; (code, stdout, stderr, when it ended)."""
    done = subprocess.run([sys.executable, "-m", "fr2perfetto", "watch", target, *args], capture_output=True, text=True,
                          timeout=HANG_GUARD, cwd=ROOT)  # fmt: skip
    return done.returncode, done.stdout, done.stderr, time.time()


def _caught_while_it_hangs(tmp_path: Path, target: str, ranks: list[subprocess.Popen[bytes]], out: Path) -> None:
    code, stdout, stderr, ended = _watch_process(target, "--stall", "5", "--every", "1", "--json", "--out", str(out))
    still = [process.poll() is None for process in ranks]
    assert code == 1, stderr
    assert all(still)  # the job still hangs: nothing but the watch noticed yet
    stuck_at = float((tmp_path / "stuck").read_text())
    assert ended - stuck_at < 90, f"{ended - stuck_at:.0f} s after the stall"
    report = json.loads(stdout)
    assert report["verdict"]["culprit_ranks"][0] == 2, report["verdict"]
    line = JOB.splitlines().index("        while True:  # STUCK LINE") + 1
    assert report["verdict"]["summary"].endswith(f"rank 2 is in train_step at job.py:{line}, not in a collective")
    code, again, _ = run_cli("analyze", str(out), "--json")
    assert code == 1 and json.loads(again)["verdict"] == report["verdict"]


@pytest.mark.torch_job
def test_a_real_job_stuck_on_the_cpu_is_caught_while_it_still_hangs(tmp_path: Path):
    ranks, url = _start_job(tmp_path, stuck_rank=2, steps=100_000)
    try:
        _caught_while_it_hangs(tmp_path, url, ranks, tmp_path / "evidence")
    finally:
        stop_ranks(ranks)


@pytest.mark.torch_job
def test_a_real_job_that_ends_well_is_let_go_soon_after(tmp_path: Path):
    ranks, url = _start_job(tmp_path, stuck_rank=-1, steps=30)
    try:
        code, stdout, stderr, ended = _watch_process(url, "--stall", "5", "--every", "1", "--json")
        assert all(process.wait(timeout=HANG_GUARD) == 0 for process in ranks)
    finally:
        stop_ranks(ranks)
    assert code == 0 and not stdout, stderr
    finished = float((tmp_path / "done").read_text())
    assert "the job ended: its servers went away" in stderr and ended - finished < 15, ended - finished


@pytest.mark.torch_job
def test_a_real_job_watched_through_its_debug_servers_folder(tmp_path: Path):
    folder = tmp_path / "debug"
    ranks, _ = _start_job(tmp_path, stuck_rank=2, steps=100_000, dump_dir=folder)
    try:
        _caught_while_it_hangs(tmp_path, str(folder), ranks, tmp_path / "evidence")
    finally:
        stop_ranks(ranks)
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    folder = healthy / "debug"
    ranks, _ = _start_job(healthy, stuck_rank=-1, steps=30, dump_dir=folder)
    try:
        code, stdout, stderr, ended = _watch_process(str(folder), "--stall", "5", "--every", "1")
        assert all(process.wait(timeout=HANG_GUARD) == 0 for process in ranks)
    finally:
        stop_ranks(ranks)
    assert code == 0 and stdout.startswith(f"the job ended: nothing new was written into {folder}"), stderr
    assert ended - float((healthy / "done").read_text()) < 30
