"""``make bench``: time fr2perfetto against merely unpickling the dumps, and against PyTorch's analyzer.

For each size (ranks x entries) it generates NCCL-layout dumps once (``bench/generate.py``, cached
under ``bench-data/``), then runs each stage as a whole process, in one run, and measures wall time and
peak memory (proportional set size of the process and all its children, sampled every 100 ms, so
that memory a forked writer shares with its parent counts once; ``B/entry`` is that peak over the job's
entries):

- ``unpickle``: ``pickle.load`` of every file, serially, the garbage collector off, nothing else (the
  floor; ``x floor`` is each stage's ratio to it);
- ``columns``: the reader alone, every file to columns (``read_dump_columns``), serially, gc off;
- ``load``: ``load_job`` of the folder, as analyze and convert load it (reading processes included);
- ``analyze``: ``fr2perfetto analyze DIR --json``;
- ``convert``: ``fr2perfetto convert DIR -o trace.pftrace`` (folded by default beyond 256 MB);
- ``pytorch``: ``python -m torch.distributed.flight_recorder.fr_trace DIR``, where it fits (by default
  up to 256 ranks: at 1024 it needs minutes and gigabytes).

The first three run in ``--repeat`` rounds (unpickle, analyze, convert, then again), and the table shows
each one's median wall time: a shared machine's speed drifts by a third within minutes, and rounds
interleaved this way let the drift touch the floor and the stages alike. PyTorch's analyzer runs once.

``--pipeline p2p`` (or ``batched``) measures a job with pipeline stages instead, whose ranks send and
receive each step (``bench/generate.py`` says how); its dumps are cached apart.

    python bench/run.py [--sizes 64,256,1024] [--entries 2000] [--pytorch-max-ranks 256] [--repeat 3]
                        [--pipeline p2p|batched]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from generate import PIPELINES, generate  # noqa: E402

BIN = Path(sys.executable).parent
# Memory is sampled this often: more often, the sampling itself takes a noticeable share of a 2-core
# machine from the stage it measures (at every 20 ms: about a tenth of convert's time at 256 ranks).
SAMPLE_SECONDS = 0.1
# The floor: Python's own unpickler building every dump's objects, in one process, with the cyclic garbage
# collector off (fr2perfetto runs with it off too: with it on, the floor would measure the collector).
UNPICKLE = (
    "import gc, glob, pickle, sys\ngc.disable()\n"
    "for f in sorted(glob.glob(sys.argv[1] + '/*')):\n    pickle.load(open(f, 'rb'))\n"
)

COLUMNS = (
    "import gc, glob, sys\ngc.disable()\nfrom fr2perfetto.read.reader import read_dump_columns\n"
    "for f in sorted(glob.glob(sys.argv[1] + '/*')):\n    read_dump_columns(f)\n"
)
LOAD = "import sys\nfrom fr2perfetto.read.job import load_job\nload_job([sys.argv[1]])\n"


def _memory(pid: int, rss_pages: int, page: int) -> int:
    """Proportional set size of ``pid`` (pages shared with a forked parent count once in all); else RSS."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss_pages * page


def _tree_memory(root: int) -> int:
    """Memory of ``root`` and all its descendants (found through each thread's list of children,
    not by reading every process on the machine: the sampling must cost the measured stage little)."""
    total, todo = 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss_pages = int(f.read().split()[1])
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
        except (OSError, ValueError, IndexError):
            continue  # it has just ended
        total += _memory(pid, rss_pages, page)
    return total


def measure(command: list[str], timeout: float) -> tuple[float, int, int]:
    """Run ``command``; return (wall seconds, peak memory of its process tree in bytes, exit code; -1: crashed)."""
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        peak = 0
        while process.poll() is None:
            peak = max(peak, _tree_memory(process.pid))
            if time.perf_counter() - start > timeout:
                process.kill()
                process.wait()
                return float("inf"), peak, -9
            time.sleep(SAMPLE_SECONDS)
        wall = time.perf_counter() - start
        errors.seek(0)
        text = errors.read().decode(errors="replace")
    # PyTorch's analyzer may print tracebacks of its own and still finish; ours never should.
    if "Traceback" in text and "flight_recorder" not in " ".join(command):
        print(text.strip().splitlines()[-1], file=sys.stderr)
        return wall, peak, -1
    return wall, peak, process.returncode


def _typical(measured: list[tuple[float, int, int]]) -> tuple[float, int, int]:
    """Of several rounds of a stage: the median wall time, the highest peak memory, the worst exit code."""
    walls = sorted(wall for wall, _, _ in measured)
    codes = [code for _, _, code in measured]
    worst = next((code for code in codes if code not in (0, 1)), codes[0])
    return walls[len(walls) // 2], max(peak for _, peak, _ in measured), worst


def _warm_cache(folder: Path) -> None:
    """Read every file once, untimed: each stage then reads from the page cache, not the disk, so that
    the floor measures unpickling rather than the disk (on a cold cache, 4096 files take minutes)."""
    for path in sorted(folder.iterdir()):
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024", help="rank counts, comma-separated (4096 is opt-in)")
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--pytorch-max-ranks", type=int, default=256)
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds of the fr2perfetto stages and the floor (median wall time)"
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--data", default=str(ROOT / "bench-data"))
    parser.add_argument("--pipeline", default="", choices=PIPELINES, help="a job with pipeline stages (default: none)")
    args = parser.parse_args()

    rows = []
    print(f"{'ranks':>6} {'stage':<9} {'wall s':>8} {'peak MB':>8} {'B/entry':>8} {'trace MB':>9} {'x floor':>8} "
          f"{'PyTorch/x':>10}")  # fmt: skip
    for ranks in [int(x) for x in args.sizes.split(",") if x]:
        job_name = f"{ranks}x{args.entries}" + (f"-{args.pipeline}" if args.pipeline else "")
        folder = Path(args.data) / job_name
        if not (folder / f"nccl_trace_rank_{ranks - 1}").exists():
            shutil.rmtree(folder, ignore_errors=True)
            generate(str(folder), ranks, args.entries, pipeline=args.pipeline)
        _warm_cache(folder)
        trace = Path(args.data) / f"{job_name}.pftrace"
        stages = {
            "unpickle": [sys.executable, "-c", UNPICKLE, str(folder)],
            "columns": [sys.executable, "-c", COLUMNS, str(folder)],
            "load": [sys.executable, "-c", LOAD, str(folder)],
            "analyze": [str(BIN / "fr2perfetto"), "analyze", str(folder), "--json"],
            "convert": [str(BIN / "fr2perfetto"), "convert", str(folder), "-o", str(trace), "-q"],
        }
        rounds: dict[str, list[tuple[float, int, int]]] = {name: [] for name in stages}
        for _ in range(max(1, args.repeat)):
            for name, command in stages.items():
                trace.unlink(missing_ok=True)  # convert writes a new file each time, as on a clean clone
                rounds[name].append(measure(command, args.timeout))
        results = {name: _typical(measured) for name, measured in rounds.items()}
        if ranks <= args.pytorch_max_ranks:  # once: it takes minutes
            command = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)]
            results["pytorch"] = measure(command, args.timeout)
        floor = results["unpickle"][0]
        pytorch = results.get("pytorch", (None,))[0]
        for name, (wall, peak, code) in results.items():
            size = f"{trace.stat().st_size / 2**20:9.1f}" if name == "convert" and trace.exists() else f"{'':9}"
            vs = f"{pytorch / wall:10.1f}" if pytorch and name in ("analyze", "convert") else f"{'':10}"
            status = "" if code in (0, 1) else f"  (exit {code})"
            per_entry = peak / (ranks * args.entries)  # the peak over every entry of the job
            print(f"{ranks:>6} {name:<9} {wall:8.2f} {peak / 2**20:8.0f} {per_entry:8.0f} {size} {wall / floor:8.2f} "
                  f"{vs}{status}")  # fmt: skip
            rows.append((ranks, name, wall, peak))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
