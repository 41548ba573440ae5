"""Bounded by what was read: a ``pg_config`` claiming more ranks than any dump shows costs nothing
beyond its text, is said in one line, and keeps the verdict from calling the job healthy."""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT
from .tracecheck import read_trace

DEMO = ROOT / "samples" / "nccl" / "demo"  # 8 ranks; rank 5 never issues all_reduce #4 of tp
MEMORY_CAP = 2 << 30  # address space a command may use: a million-rank claim once grew past 3.8 GB
HANG_GUARD = 300  # seconds: each command takes about one; an unbounded claim once took minutes


def _demo_claiming(folder: Path, ranks: str) -> Path:
    """The demo's dumps, each claiming ``ranks`` for the world group in its ``pg_config``."""
    folder.mkdir()
    for path in sorted(DEMO.iterdir()):
        dump = pickle.loads(path.read_bytes())
        dump["pg_config"]["0"]["ranks"] = ranks
        (folder / path.name).write_bytes(pickle.dumps(dump))
    return folder


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    return subprocess.run([sys.executable, "-m", "fr2perfetto", *args], capture_output=True, text=True, env=env,
                          timeout=HANG_GUARD, preexec_fn=cap)  # fmt: skip


@pytest.fixture(scope="module")
def million(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _demo_claiming(tmp_path_factory.mktemp("claims") / "million", str(list(range(1_000_000))))


def test_a_million_rank_claim_is_said_and_the_verdict_kept(million: Path):
    done = _run("analyze", str(million), "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"]["status"] == "hang"
    assert report["verdict"]["culprit_ranks"] == [5]
    assert report["job"]["ranks"] == 8
    (problem,) = [p for p in report["input_problems"] if "1000000 ranks" in p["reason"]]
    assert "nccl_trace_rank_" in problem["path"] and not problem.get("fatal")
    plain = _run("analyze", str(million))
    warnings = [line for line in plain.stderr.splitlines() if "1000000 ranks" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: "), plain.stderr
    assert "Traceback" not in done.stderr + plain.stderr


def test_a_million_rank_claim_makes_no_million_processes(million: Path, tmp_path: Path):
    out = tmp_path / "t.pftrace"
    done = _run("convert", str(million), "-o", str(out), "--max-size", "1")
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size <= 1 << 20
    assert len(read_trace(str(out)).processes) == 8
    shown = _run("info", str(million))
    assert shown.returncode == 0, shown.stderr
    assert "8 dumps, 8 ranks" in shown.stdout
    assert "pg_config says group 0 has 1000000 ranks" in shown.stderr  # a quick look says it too


def test_a_healthy_job_claiming_ranks_beyond_its_dumps_is_not_healthy(tmp_path: Path):
    healthy = ROOT / "samples" / "gloo" / "healthy"
    folder = tmp_path / "healthy"
    folder.mkdir()
    claim = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(100_000)))}}
    for path in sorted(healthy.glob("gloo_trace_rank_*")):
        as_json = path.suffix == ".json"
        dump = json.loads(path.read_text()) if as_json else pickle.loads(path.read_bytes())
        dump["pg_config"] = claim
        (folder / path.name).write_bytes(json.dumps(dump).encode() if as_json else pickle.dumps(dump))
    assert len(list(folder.iterdir())) == 4
    done = _run("analyze", str(folder), "--json")
    report = json.loads(done.stdout)
    assert report["verdict"]["status"] == "undecided", report["verdict"]
    assert "100000 ranks" in report["verdict"]["summary"]


def test_a_real_claim_beyond_the_dumps_read_is_followed_rank_by_rank(tmp_path: Path):
    # a 1024-rank job whose 8 first ranks' dumps were read: the others left none, and are named
    folder = _demo_claiming(tmp_path / "partial", str(list(range(1024))))
    done = _run("analyze", str(folder), "--json")
    report = json.loads(done.stdout)
    assert report["job"]["ranks"] == 1024
    assert report["job"]["missing_ranks"] == list(range(8, 1024))
    assert "not followed" not in done.stderr
    shown = _run("info", str(folder))
    rows = [line for line in shown.stdout.splitlines() if "no dump" in line]
    assert len(rows) == 1 and "8-1023" in rows[0]  # one row for the ranks without a dump, not 1016


def test_the_member_lists_kept_between_dumps_stay_within_their_bound(monkeypatch: pytest.MonkeyPatch):
    """Member lists are read once per reading process and kept for the next dump, but dumps of ever new
    long lists cannot make what is kept grow past its bound; a list read again reads the same."""
    from fr2perfetto.read import reader

    monkeypatch.setattr(reader, "RANK_TEXTS_KEPT", 100_000)
    monkeypatch.setattr(reader, "_rank_texts", {})
    monkeypatch.setattr(reader, "_rank_text_sizes", [0])
    world = str(list(range(4096)))
    assert reader._parse_ranks(world) == (tuple(range(4096)), 0)
    for start in range(50):  # 50 different lists of 30 kB each: kept three at a time at most
        members = str(list(range(start, start + 4096)))
        assert reader._parse_ranks(members) == (tuple(range(start, start + 4096)), 0)
        assert sum(map(len, reader._rank_texts)) == reader._rank_text_sizes[0] <= 100_000
    assert reader._parse_ranks(world) == (tuple(range(4096)), 0)
    assert reader._parse_ranks("[3, 1, x]") == ((1, 3), 0) and reader._parse_ranks("[-1, 2]") == (None, 0)
