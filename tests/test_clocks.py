"""The clocks' statistics: what a shortcut computes is exactly what the definition gives."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from fr2perfetto.base.model import state_entry
from fr2perfetto.match import clocks
from fr2perfetto.match.ops import match_ops
from fr2perfetto.read import columns
from fr2perfetto.read.columns import EntryRows, LinkedRows
from fr2perfetto.read.job import load_job

from .conftest import ROOT


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


@pytest.mark.parametrize(
    ("sample", "held_as"),
    [("nccl/demo", {EntryRows, LinkedRows}), ("nccl/pipeline_batched", {LinkedRows}), ("nccl/straggler", {EntryRows}),
     ("nccl/wrap", {EntryRows}), ("gloo/skip", {EntryRows})],
)  # fmt: skip
def test_the_times_a_clock_is_fitted_on_are_those_of_each_ranks_state_entry(
    sample: str, held_as: set[type], monkeypatch: pytest.MonkeyPatch
):
    """Where a rank's entries are made from columns, an op's start and completion times are read from them,
    with no entry made, also for a rank whose coalesced groups were linked (its last entry in an op may be
    closed by another, whose times count): the times of the entry that carries each rank's state."""
    job = load_job([str(ROOT / "samples" / sample)], jobs=1)
    ops = match_ops(job)
    assert {type(dump.entries) for dump in job.dumps.values()} == held_as
    expected = [
        [
            (rank, state_entry(parts).time_started_ns, state_entry(parts).time_completed_ns)
            for rank, parts in held.items()
        ]
        for held in (op.entries for op in ops)
    ]
    made = []
    making = columns.make_entries
    monkeypatch.setattr(columns, "make_entries", lambda *args: made.append(args) or making(*args))
    assert clocks._state_times(ops) == expected
    assert made == []
    completed = sum(time is not None for parts in expected for _, _, time in parts)
    assert completed >= 20 if sample.startswith("nccl") else completed == 0  # gloo records no completion
