"""What ``fr2perfetto watch`` costs: its CPU time and peak memory, and the requests each rank gets, watching a
stand-in debug server (``tests/fake_debug_server.py``) of N ranks whose Flight Recorders hold E entries
(about 0.47 KB each as JSON, as torch 2.13's gloo recorder writes them) while they all-reduce 5 times a
second. The watch runs as a process of its own for the given seconds, then the servers go away and it ends.

    python bench/watch.py [--ranks 4,64] [--entries 2000] [--seconds 60] [--every 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fake_debug_server import FakeJob  # noqa: E402


def measure(ranks: int, entries: int, seconds: float, every: float) -> dict[str, float]:
    job = FakeJob(ranks, rate=5.0, entries=entries, ops=entries)  # a recorder already full
    size = len(job.recorder(0))
    command = [sys.executable, "-m", "fr2perfetto", "watch", job.url, "--every", str(every), "--stall", "3600"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    timer = threading.Timer(seconds, job.close)
    timer.start()
    started = time.monotonic()
    _, status, usage = os.wait4(process.pid, 0)
    took = time.monotonic() - started
    timer.cancel()
    return {
        "ranks": ranks,
        "answer_kb": size / 1024,
        "seconds": took,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "cpu_percent": 100 * (usage.ru_utime + usage.ru_stime) / took,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "requests_per_rank_per_second": sum(job.requests) / ranks / took,
        "exit": os.waitstatus_to_exitcode(status),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="4,64")
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=5.0)
    options = parser.parse_args()
    print("ranks  answer KB  seconds  CPU s  CPU %  peak RSS MB  requests/rank/s  exit")
    for ranks in (int(n) for n in options.ranks.split(",")):
        row = measure(ranks, options.entries, options.seconds, options.every)
        print(f"{row['ranks']:5d}  {row['answer_kb']:9.0f}  {row['seconds']:7.1f}  {row['cpu_seconds']:5.1f}  "
              f"{row['cpu_percent']:5.1f}  {row['peak_rss_mb']:11.0f}  {row['requests_per_rank_per_second']:15.3f}  "
              f"{row['exit']:4.0f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
