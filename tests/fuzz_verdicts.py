"""Run many generated programs (``programs``) and print how fr2perfetto's verdicts fare, by fault kind.

    python tests/fuzz_verdicts.py [COUNT] [FIRST_SEED] [--fault NAME] [--all]

``make fuzz-verdicts`` runs 10,000 from seed 0, drawn from the default mix (``programs.FAULTS``);
``--all`` adds the faults kept out of it (``programs.ALONE_FAULTS``: two runs in one folder), and
``--fault NAME`` (repeatable) runs only those faults. A verdict is right, undecided (it says it cannot
tell, where the dumps of two ranks are symmetric, and blames no rank wrongly) or wrong; each wrong one is
listed with its seed, to replay with ``programs.examine(seed, fault)``. The column "healthy?" counts the
faulty programs called healthy (a wrong verdict, always). Exits 1 when a verdict is wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import programs

Result = tuple[int, str, str, str, str, bool]


def judge_range(seeds: range, faults: tuple[str, ...] = (), mix: tuple[str, ...] = programs.FAULTS) -> list[Result]:
    """(seed, fault, outcome, the scenario, what fr2perfetto said, whether a faulty program was called
    healthy) for each seed; ``faults``: the seeds take these in turn instead of drawing from ``mix``."""
    results = []
    for seed in seeds:
        fault = faults[seed % len(faults)] if faults else None
        judged = programs.examine(seed, fault, mix)
        scenario = judged.scenario
        called_healthy = scenario.faulty and judged.status == "healthy"
        results.append((seed, scenario.fault, judged.outcome, scenario.describe(), judged.said, called_healthy))
    return results


def main(count: int, first: int, faults: tuple[str, ...] = (), mix: tuple[str, ...] = programs.FAULTS) -> int:
    """Judge ``count`` programs from seed ``first``, print the table and the wrong verdicts; 1 if any."""
    started = time.perf_counter()
    workers = max(1, min(os.cpu_count() or 1, 8))
    step = max(1, count // (workers * 8))
    chunks = [range(s, min(s + step, first + count)) for s in range(first, first + count, step)]
    with ProcessPoolExecutor(workers) as pool:
        results = [r for part in pool.map(partial(judge_range, faults=faults, mix=mix), chunks) for r in part]
    print_table(results)
    wrong = [r for r in results if r[2] == programs.WRONG]
    for _, _, _, described, said, _ in wrong:
        print(f"\nwrong: {described}\n  said: {said}")
    print(f"\n{len(results)} programs in {time.perf_counter() - started:.0f} s on {workers} processes")
    return 1 if wrong else 0


def print_table(results: list[Result]) -> None:
    """Per fault: programs, right, undecided, wrong, and faulty ones called healthy; then all together."""
    table: dict[str, Counter[str]] = {}
    for _, fault, outcome, _, _, called_healthy in results:
        row = table.setdefault(fault, Counter())
        row[outcome] += 1
        row["healthy?"] += called_healthy
    print(f"{'fault':<13} {'programs':>9} {'right':>7} {'undecided':>10} {'wrong':>6} {'healthy?':>9}")
    total: Counter[str] = Counter()
    for fault in [f for f in programs.ALL_FAULTS if f in table]:
        total.update(table[fault])
        _print_row(fault, table[fault])
    _print_row("all", total)
    print(f"faulty called healthy: {total['healthy?']}")


def _print_row(name: str, row: Counter[str]) -> None:
    n = row[programs.RIGHT] + row[programs.UNDECIDED] + row[programs.WRONG]
    print(f"{name:<13} {n:>9} {row[programs.RIGHT]:>7} {row[programs.UNDECIDED]:>10} {row[programs.WRONG]:>6} "
          f"{row['healthy?']:>9}")  # fmt: skip


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("count", nargs="?", type=int, default=10_000)
    parser.add_argument("first", nargs="?", type=int, default=0)
    parser.add_argument("--fault", action="append", choices=programs.ALL_FAULTS, default=[],
                        help="run only this fault (repeatable); the seeds take them in turn")  # fmt: skip
    parser.add_argument("--all", action="store_true", help="draw from every fault, two runs included")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _arguments(sys.argv[1:])
    sys.exit(main(args.count, args.first, tuple(args.fault), programs.ALL_FAULTS if args.all else programs.FAULTS))
