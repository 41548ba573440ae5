"""Everyday use: opening in the UI, other output formats, redaction, info, capture."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from fr2perfetto import serve
from fr2perfetto.read.redact import public_code

from .conftest import ROOT, run_cli, start_rank, stop_ranks
from .helpers import free_port
from .tracecheck import read_trace


def test_open_serves_the_trace_once_to_the_ui(nccl_job, tmp_path: Path, monkeypatch):
    trace = tmp_path / "crash.pftrace"
    links: list[str] = []
    threads: list[threading.Thread] = []
    got: dict[str, object] = {}

    def fake_browser(link: str) -> bool:
        links.append(link)
        # the deep link carries the trace's local URL; fetch it as the UI would
        url = urllib.parse.unquote(link.split("url=", 1)[1].split("&", 1)[0])
        request = urllib.request.Request(url, headers={"Origin": serve.UI_ORIGIN})

        def fetch() -> None:
            with urllib.request.urlopen(request, timeout=10) as response:
                got["status"], got["headers"], got["body"] = response.status, dict(response.headers), response.read()

        fetcher = threading.Thread(target=fetch)
        fetcher.start()
        threads.append(fetcher)
        return False  # as on a remote shell: the link gets printed

    monkeypatch.setattr(serve.webbrowser, "open_new_tab", fake_browser)
    code, stdout, stderr = run_cli("convert", str(nccl_job("demo")), "-o", str(trace), "--open", "--port", "0")
    assert code == 0, stderr
    for fetcher in threads:
        fetcher.join(10)
    (link,) = links
    assert link.startswith("https://ui.perfetto.dev/#!/?url=http%3A//127.0.0.1") or link.startswith(
        "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:"
    )
    assert link in stdout.replace("\n", "")
    assert got["status"] == 200 and got["body"] == trace.read_bytes()
    headers = {k.lower(): v for k, v in got["headers"].items()}
    assert headers["access-control-allow-origin"] == "https://ui.perfetto.dev"
    assert headers["content-length"] == str(trace.stat().st_size)
    assert "server stopped" in stdout
    # the server is gone: nothing listens on its port any more
    port = int(urllib.parse.unquote(link).split("127.0.0.1:")[1].split("/")[0])
    with socket.socket() as probe, pytest.raises(OSError):
        probe.settimeout(2)
        probe.connect(("127.0.0.1", port))


def _chrome(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def test_chrome_json_and_gzip_outputs(nccl_job, tmp_path: Path):
    folder = nccl_job("demo")
    for name in ("t.json", "t.json.gz", "t.pftrace.gz"):
        code, _, stderr = run_cli("convert", str(folder), "-o", str(tmp_path / name), "-q")
        assert code == 0, stderr
    doc = _chrome(tmp_path / "t.json")
    assert doc == _chrome(tmp_path / "t.json.gz")
    events = doc["traceEvents"]
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    # the culprit's role is in its name, which is what the UI shows
    expected = {f"rank {r}" for r in range(8) if r != 5} | {"rank 5 · CULPRIT"}
    assert {n for n in names if n.startswith("rank")} == expected
    # the UI orders processes by sort index: ranks by number, Findings above them
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["ph"] == "M" and e["name"] == "process_sort_index"}
    by_pid = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    ranked = sorted(by_pid, key=lambda pid: order[pid])
    assert [by_pid[pid].split(" · ")[0] for pid in ranked] == ["Findings"] + [f"rank {r}" for r in range(8)]
    assert "Findings" in names
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    assert starts and sorted(e["id"] for e in starts) == sorted(e["id"] for e in finishes)
    findings = [e for e in events if e["ph"] == "X" and e["name"].startswith("missing: rank 5 never issued")]
    assert len(findings) == 1 and findings[0]["args"]["culprit_ranks"] == "5"
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    marker = [e for e in events if e["ph"] == "i" and not threads[(e["pid"], e["tid"])].startswith("thread ")]
    assert [m["name"] for m in marker] == ["✗ NEVER ISSUED all_reduce #4"]
    # every op a rank issued was enqueued by its thread: an instant on that thread's track
    enqueued = [e for e in events if e["ph"] == "i" and threads[(e["pid"], e["tid"])].startswith("thread ")]
    assert len(enqueued) == sum(1 for e in events if e["ph"] == "X" and "op_id" in e["args"]) + 2  # and in batches
    # and how late each rank enqueued in each of its groups, a counter of its process
    counters = {e["name"] for e in events if e["ph"] == "C"}
    named = [re.fullmatch(r"enqueue lateness · (.+) \(pg (\d+)\) · rank (\d+)", name) for name in counters]
    assert all(named) and {int(m[3]) for m in named if m} == set(range(8))
    assert "enqueue lateness · default_pg (pg 0) · rank 5" in counters
    # the gzipped Perfetto trace decompresses to the same trace as the plain one
    plain = tmp_path / "t.pftrace"
    run_cli("convert", str(folder), "-o", str(plain), "-q")
    assert gzip.decompress((tmp_path / "t.pftrace.gz").read_bytes()) == plain.read_bytes()


def test_redacted_trace_has_no_hostnames_or_directories(gloo_job, nccl_job, tmp_path: Path):
    # real gloo dumps (frames under this checkout and the virtualenv) plus NCCL dumps named with hosts
    folder = tmp_path / "secret-cluster-dumps"
    shutil.copytree(gloo_job("skip"), folder)
    for path in nccl_job("stuck").iterdir():
        rank = path.name.rsplit("_", 1)[1]
        shutil.copy(path, folder / f"nccl_trace_rank_gpu-node-{rank}.corp.example_{int(rank) + 4}")
    from fr2perfetto.read.job import load_job

    # the two jobs are two runs (one read at a time): each is redacted alike
    jobs = [load_job([str(folder)], run=run) for run in ("1", "2")]
    dumps = [d for job in jobs for d in job.dumps.values()]
    secrets = {d.host for d in dumps if d.host}
    assert len(secrets) == 4
    for dump in dumps:
        for entry in dump.entries:
            for frame in entry.frames:
                secrets.update(p for p in os.path.dirname(frame.filename).split("/") if len(p) > 3)
    secrets.update(p for p in str(folder).split("/") if len(p) > 3)
    # what stays readable on purpose: file basenames and function names ("main", "distributed_c10d.py")
    kept = {f.name for d in dumps for e in d.entries for f in e.frames}
    kept |= {os.path.basename(f.filename) for d in dumps for e in d.entries for f in e.frames}
    # and torch's and Python's own code from its package down: <site-packages>/torch/distributed/...
    public = {public_code(f.filename) for d in dumps for e in d.entries for f in e.frames}
    kept |= {part for path in public if path for part in path.split("/")}
    secrets = {s for s in secrets if not any(s in k for k in kept)}
    assert {"secret-cluster-dumps", "python3.11", "venv"} <= secrets
    for run in ("1", "2"):
        for name in ("r.pftrace", "r.json"):
            out = tmp_path / name
            code, _, stderr = run_cli("convert", str(folder), "-o", str(out), "--redact", "-q", "--run", run)
            assert code == 0, stderr
            data = out.read_bytes()
            leaked = sorted(s for s in secrets if s.encode() in data)
            assert not leaked, f"{name} of run {run} leaks {leaked}"
        code, stdout, _ = run_cli("analyze", str(folder), "--redact", "--json", "--run", run)
        values = json.dumps([v for v in _values(json.loads(stdout))])  # leave out the schema's key names
        assert not [s for s in secrets if s in values]
    code, _, stderr = run_cli("convert", str(folder), "-o", str(tmp_path / "r.pftrace"), "--redact", "-q")
    trace = read_trace(str(tmp_path / "r.pftrace"))
    stack = next(s[4]["stack"] for s in trace.all_slices() if "stack" in s[4])
    assert stack[0] == "all_reduce (<site-packages>/torch/distributed/distributed_c10d.py:3245)"


def _values(node: object) -> list[object]:
    if isinstance(node, dict):
        return [v for value in node.values() for v in _values(value)]
    if isinstance(node, list):
        return [v for value in node for v in _values(value)]
    return [node]


def test_info_lists_ranks_groups_and_missing_dumps(nccl_job):
    code, stdout, _ = run_cli("info", str(nccl_job("missing_dump")))
    assert code == 0
    assert "3 dumps, 4 ranks" in stdout and "Missing dumps: ranks 3" in stdout
    assert "default_pg" in stdout and "2.10" in stdout and "nccl_trace_rank_0" in stdout


def test_every_command_has_help_with_examples():
    for command in ("convert", "analyze", "open", "info", "trigger"):
        code, stdout, _ = run_cli(command, "--help")
        assert code == 0 and "Example" in stdout, command


def test_trigger_writes_to_each_ranks_pipe(tmp_path: Path):
    from fr2perfetto.trigger import PIPE_PREFIX

    pipes = [tmp_path / f"{PIPE_PREFIX}{rank}.pipe" for rank in range(2)]
    received: list[bytes] = []
    for pipe in pipes:
        os.mkfifo(pipe)
    readers = [os.open(p, os.O_RDONLY | os.O_NONBLOCK) for p in pipes]  # as the ranks' watchdogs do
    try:
        code, stdout, _ = run_cli("trigger", str(tmp_path), "--rounds", "1")
        received = [os.read(fd, 16) for fd in readers]
    finally:
        for fd in readers:
            os.close(fd)
    assert code == 0 and "Asked 2 ranks" in stdout and received == [b"1\n", b"1\n"]
    code, _, stderr = run_cli("trigger", str(tmp_path))  # nobody listens any more
    assert code == 2 and "no rank to ask there" in stderr


CAPTURE_SCRIPT = """
import os, sys, time
from datetime import timedelta
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=3))
capture.install()
t = torch.ones(4)
for step in range(5):
    if step == 3 and dist.get_rank() == 2:
        raise ValueError("loss is NaN on rank 2")
    dist.all_reduce(t)
"""


@pytest.mark.torch_job
def test_capture_dumps_every_rank_of_a_real_job(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(CAPTURE_SCRIPT)
    dumps = tmp_path / "dumps"
    port = free_port()
    ranks = []
    for rank in range(4):  # what torchrun does: one process per rank with these variables
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}  # fmt: skip
        ranks.append(start_rank([sys.executable, str(script), str(dumps)], env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))  # fmt: skip
    try:
        errors = [p.communicate(timeout=120)[1].decode() for p in ranks]
    finally:
        stop_ranks(ranks)
    assert all(p.returncode != 0 for p in ranks)  # every rank died: 2 of its error, the others of timeouts
    assert "loss is NaN on rank 2" in errors[2]
    assert sorted(p.name for p in dumps.glob("gloo_trace_rank_?")) == [f"gloo_trace_rank_{r}" for r in range(4)]
    # each rank says how it ended; rank 2 also asked the others to dump at once, while they waited
    assert (dumps / "gloo_trace_rank_2.ended").read_text().startswith("exception: ValueError: loss is NaN")
    code, stdout, _ = run_cli("analyze", str(dumps), "--json")
    verdict = json.loads(stdout)["verdict"]
    assert code == 1 and verdict["culprit_ranks"] == [2] and "rank 2 never issued all_reduce #4" in verdict["summary"]


def test_the_installed_command_prints_everything_and_keeps_its_exit_codes(tmp_path: Path):
    """The console script ends its process early (no interpreter teardown): nothing may be lost."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "fr2perfetto", *args]
        env = {**os.environ, "COLUMNS": "200"}
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)

    hang = run("analyze", str(ROOT / "samples" / "gloo" / "skip"), "-q")
    assert hang.returncode == 1
    assert hang.stdout.startswith("hang: rank 2 never issued all_reduce #4 of default_pg")
    trace = tmp_path / "skip.pftrace"
    written = run("convert", str(ROOT / "samples" / "gloo" / "skip"), "-o", str(trace))
    assert written.returncode == 0
    assert f"Wrote {trace}" in written.stdout and "Open it: fr2perfetto open" in written.stdout
    assert read_trace(trace).processes
    missing = run("analyze", str(tmp_path / "nothing-here"))
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "nothing-here: no such file or directory" in missing.stderr
    assert run("--version").stdout.startswith("fr2perfetto ")
