"""Light in a training environment: installed beside the oldest protobuf supported (5.29, which older
tensorboard, wandb and onnx releases pin), fr2perfetto keeps it, its capture helper dumps a real gloo
job, and ``analyze`` and ``convert`` give, byte for byte, what they give with the newest protobuf.

Runs where ``FR2PERFETTO_OLDEST_PYTHON`` names the Python of such an environment: ``make test-oldest``
makes one (``.venv-oldest``) and runs this file; elsewhere it is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import free_port

OLDEST = os.environ.get("FR2PERFETTO_OLDEST_PYTHON", "")
OLDEST_PROTOBUF = "5.29."
HANG_GUARD = 300

pytestmark = [
    pytest.mark.torch_job,
    pytest.mark.skipif(not OLDEST, reason="FR2PERFETTO_OLDEST_PYTHON is not set (make test-oldest sets it)"),
]

JOB = """
import sys
from fr2perfetto import capture
capture.configure(sys.argv[1])
import torch, torch.distributed as dist
dist.init_process_group("gloo")
capture.install()
t = torch.ones(4)
for _ in range(5):
    dist.all_reduce(t)
dist.destroy_process_group()
"""


def _run(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    # from a folder outside the clone: the package comes from the environment, never the tree
    return subprocess.run([python, *args], capture_output=True, text=True, cwd="/", timeout=HANG_GUARD)


def test_the_oldest_protobuf_stays_and_gives_the_same_bytes(tmp_path: Path):
    where = _run(OLDEST, "-c", "import google.protobuf as p, fr2perfetto as f; print(p.__version__, f.__file__)")
    assert where.returncode == 0, where.stderr
    version, package = where.stdout.split()
    assert version.startswith(OLDEST_PROTOBUF) and "site-packages" in package  # installed, not the tree

    script, dumps = tmp_path / "train.py", tmp_path / "dumps"
    script.write_text(JOB)
    port = free_port()
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    command = [OLDEST, str(script), str(dumps)]
    ranks = [subprocess.Popen(command, env={**env, "RANK": str(rank)}) for rank in range(2)]
    assert [rank.wait(timeout=HANG_GUARD) for rank in ranks] == [0, 0]
    assert sorted(p.name for p in dumps.glob("gloo_trace_rank_?")) == ["gloo_trace_rank_0", "gloo_trace_rank_1"]

    reports, traces = [], []
    for python in (OLDEST, sys.executable):
        report = _run(python, "-m", "fr2perfetto", "analyze", str(dumps), "--json")
        assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
        reports.append(report.stdout)
        trace = tmp_path / f"{len(traces)}.pftrace"
        converted = _run(python, "-m", "fr2perfetto", "convert", str(dumps), "-o", str(trace), "-q")
        assert converted.returncode == 0, converted.stderr
        traces.append(trace.read_bytes())
    assert '"status": "healthy"' in reports[0]
    assert reports[0] == reports[1] and traces[0] == traces[1]
