"""The clocks' statistics: what a shortcut computes is exactly what the definition gives."""

from __future__ import annotations

import math
import random
import statistics

from fr2perfetto.match import clocks


def _by_definition(residuals: list[float], poll_ns: int) -> float:
    ordered = sorted(residuals)
    cut = len(ordered) // 10
    kept = ordered[cut : len(ordered) - cut]
    return max(statistics.pstdev(kept), poll_ns / 2) / math.sqrt(len(kept))


def test_a_members_standard_error_is_the_exact_one_where_floats_would_settle_it():
    """Residuals spread well below the polls' floor, near it, above it, far from zero, huge: the standard
    error is the one computed in exact fractions, to the last bit."""
    rng = random.Random(5)
    for trial in range(600):
        poll = rng.choice([0, 1, 100_000, 1_000_000, 10_000_000])
        spread = rng.choice([0.0, 10.0, 1e4, poll / 2 * rng.uniform(0.9, 1.1), 1e7, 1e13])
        centre = rng.choice([0.0, -3e6, 2e11, 5e12])
        residuals = [centre + rng.gauss(0, spread) for _ in range(rng.randrange(clocks.MIN_TICKS, 60))]
        assert clocks._standard_error(residuals, poll) == _by_definition(residuals, poll), trial
    assert clocks._standard_error([1.0] * (clocks.MIN_TICKS - 1), 100_000) == math.inf
