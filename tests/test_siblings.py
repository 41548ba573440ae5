"""Sibling groups (the pairs of ``new_subgroups(group_size=2)``) name the rank that deviated.

Eight ranks in four pairs; each step a world all_reduce, then a pair all_reduce. One rank skips its
pair's op once and goes on to the next world op: its partner waits in the pair op, everyone else in
the world op. The two ranks of that pair wait for each other; the three other pairs, whose members
all issued the pair op before the world op, say which of the two broke the program's order.
"""

from __future__ import annotations

from pathlib import Path

from fr2perfetto.base.model import MISMATCH
from fr2perfetto.convert import analyse
from fr2perfetto.diagnose.blame import assign_blame
from fr2perfetto.diagnose.evidence import gather_evidence
from fr2perfetto.read.job import load_job

from .conftest import nccl_layout

PAIRS = {str(i + 1): ("undefined", [2 * i, 2 * i + 1]) for i in range(4)}  # as new_subgroups names them


def _pair_job(skipper: int, pair_ops: dict[str, str] | None = None) -> nccl_layout.Job:
    """Two good steps, then a third in which ``skipper`` skips its pair's all_reduce and goes on to the
    next world all_reduce, which its partner never reaches. ``pair_ops``: pair name -> the collective
    that pair issues instead of all_reduce, in every step."""
    job = nccl_layout.Job(8, PAIRS)
    own = next(name for name, (_, members) in PAIRS.items() if skipper in members)
    partner = next(r for r in PAIRS[own][1] if r != skipper)
    for step in range(3):
        job.collective("all_reduce", "0")
        for name in PAIRS:
            skip = (skipper,) if step == 2 and name == own else ()
            job.collective((pair_ops or {}).get(name, "all_reduce"), name, skip=skip)
    job.collective("all_reduce", "0", skip=(partner,))
    return job


def _analysis(job: nccl_layout.Job, folder: Path):
    job.dump(str(folder))
    return analyse(load_job([str(folder)]))


def test_the_other_pairs_name_the_rank_that_skipped_its_pair_op(tmp_path: Path):
    analysis = _analysis(_pair_job(skipper=5), tmp_path)
    verdict = analysis.diagnosis.verdict
    assert verdict.status == "hang" and verdict.culprit_ranks[0] == 5
    (deadlock,) = [f for f in analysis.diagnosis.findings if f.kind == "deadlock"]
    assert deadlock.culprit_ranks[0] == 5
    assert (
        "in the 3 other pairs (ranks 0-1, 2-3, 6-7) both members issued their pair's all_reduce #3 before "
        "default_pg's all_reduce #4; rank 5 issued default_pg's all_reduce #4 first"
    ) in deadlock.evidence
    assert not any("cannot say which side" in line for line in deadlock.evidence)


def test_the_partner_that_skipped_is_named_the_same_way(tmp_path: Path):
    analysis = _analysis(_pair_job(skipper=2), tmp_path)
    assert analysis.diagnosis.verdict.culprit_ranks[0] == 2
    (deadlock,) = [f for f in analysis.diagnosis.findings if f.kind == "deadlock"]
    assert any(line.startswith("in the 3 other pairs (ranks 0-1, 4-5, 6-7)") for line in deadlock.evidence)


def test_pairs_that_run_other_collectives_are_not_siblings(tmp_path: Path):
    # rank 5's pair broadcasts where the others all_reduce: another part of the program, no witness
    job = _pair_job(skipper=5, pair_ops={"1": "broadcast", "2": "broadcast", "4": "broadcast"})
    analysis = _analysis(job, tmp_path)
    lines = [line for f in analysis.diagnosis.findings for line in f.evidence]
    assert not any("other pairs" in line for line in lines)


def test_the_siblings_say_which_of_two_members_passed_the_wrong_size(tmp_path: Path):
    job = nccl_layout.Job(8, PAIRS)
    for name in PAIRS:
        job.collective("all_reduce", name)
    for name in PAIRS:
        job.collective("all_reduce", name, sizes={5: 2048} if name == "3" else None, hang=name == "3")
    job.dump(str(tmp_path))
    analysis = analyse(load_job([str(tmp_path)]))
    (op,) = [op for op in analysis.ops if op.status == MISMATCH]
    blame = assign_blame(gather_evidence(analysis.job, analysis.ops))
    rank, line = blame.odd_members[op.op_key]
    assert rank == 5
    assert line == (
        "in the 3 other pairs (ranks 0-1, 2-3, 6-7) both members passed sizes [[1024]] in their pair's #2; "
        "rank 5 passed sizes [[2048]]"
    )
