"""Run many generated programs (``programs``) and print how fr2perfetto's verdicts fare, by fault kind.

    python tests/fuzz_verdicts.py [COUNT] [FIRST_SEED]        (``make fuzz-verdicts``: 10,000 from seed 0)

A verdict is right, undecided (it says it cannot tell, where the dumps of two ranks are symmetric, and
blames no rank wrongly) or wrong; each wrong one is listed with its seed, to replay with
``programs.run(seed)``. Exits 1 when a verdict is wrong.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import programs


def judge_range(seeds: range) -> list[tuple[int, str, str, str, str]]:
    """(seed, fault, outcome, the scenario, what fr2perfetto said) for each seed."""
    results = []
    for seed in seeds:
        scenario, outcome, said = programs.run(seed)
        results.append((seed, scenario.fault, outcome, scenario.describe(), said))
    return results


def main(count: int, first: int) -> int:
    started = time.perf_counter()
    workers = max(1, min(os.cpu_count() or 1, 8))
    step = max(1, count // (workers * 8))
    chunks = [range(s, min(s + step, first + count)) for s in range(first, first + count, step)]
    with ProcessPoolExecutor(workers) as pool:
        results = [r for part in pool.map(judge_range, chunks) for r in part]
    table: dict[str, Counter[str]] = {}
    for _, fault, outcome, _, _ in results:
        table.setdefault(fault, Counter())[outcome] += 1
    print(f"{'fault':<12} {'programs':>9} {'right':>7} {'undecided':>10} {'wrong':>6}")
    total: Counter[str] = Counter()
    for fault in programs.FAULTS:
        row = table.get(fault, Counter())
        total.update(row)
        n = sum(row.values())
        print(f"{fault:<12} {n:>9} {row[programs.RIGHT]:>7} {row[programs.UNDECIDED]:>10} {row[programs.WRONG]:>6}")
    n = sum(total.values())
    print(f"{'all':<12} {n:>9} {total[programs.RIGHT]:>7} {total[programs.UNDECIDED]:>10} {total[programs.WRONG]:>6}")
    wrong = [r for r in results if r[2] == programs.WRONG]
    for _, _, _, described, said in wrong:
        print(f"\nwrong: {described}\n  said: {said}")
    print(f"\n{n} programs in {time.perf_counter() - started:.0f} s on {workers} processes")
    return 1 if wrong else 0


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    sys.exit(main(args[0] if args else 10_000, args[1] if len(args) > 1 else 0))
