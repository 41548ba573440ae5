"""What to do after a verdict: the step that fits it, with the command to run.

A verdict names a rank, a group and an op; what a person does next depends on what the dumps could not
say. Where the culprit's dump shows only the last collective it issued, where it really is comes from a
stack snapshot (py-spy, PyTorch's debug server, the capture helper), which ``analyze`` reads when it
lies beside the dumps. Every verdict ends with the trace to open at the problem.
"""

from __future__ import annotations

import shlex

from ..base.model import Finding
from ..base.words import group_in_words, lateness_track, ranks_text
from ..read.job import Job
from .beside import KIND_CRASH, KIND_STUCK_CPU
from .verdict import HEALTHY, KIND_STRAGGLER, KIND_STUCK, SLOW, Diagnosis


def next_steps(job: Job, diagnosis: Diagnosis, inputs: list[str]) -> list[str]:
    """The next steps after ``diagnosis`` of the dumps named by ``inputs`` (as the command line gave
    them), most useful first."""
    verdict = diagnosis.verdict
    given = " ".join(shlex.quote(item) for item in inputs) or "<dumps>"
    if verdict.status == HEALTHY and diagnosis.caveats:  # what the dumps cannot show may be the hang
        return [
            "These dumps cannot show everything (above): if the job hangs, take stack snapshots while it hangs "
            "(fr2perfetto trigger <folder>, with fr2perfetto.capture in the job; or py-spy dump --pid <pid> "
            "> pyspy_rank_<rank>.txt on each rank's host) and analyze again with them beside the dumps."
        ]
    if verdict.status == HEALTHY and not diagnosis.findings:
        return [
            "Nothing in these dumps is wrong. If the job still hangs, they were taken before it did: take them "
            "while it hangs (fr2perfetto trigger <folder>, with fr2perfetto.capture in the job; see the README)."
        ]
    steps: list[str] = []
    top = diagnosis.findings[0] if diagnosis.findings else None
    if top is not None:
        steps += _for_finding(job, top)
    if verdict.status == SLOW and top is not None and top.group is not None:
        counters = ", ".join(f"'{lateness_track(top.group, rank)}'" for rank in top.culprit_ranks[:2])
        steps.append(f"Open the trace; its link pins {counters}: fr2perfetto convert {given} -o slow.pftrace --open")
    else:
        steps.append(f"Open the trace at the problem: fr2perfetto convert {given} -o hang.pftrace --open")
    return steps


def _for_finding(job: Job, finding: Finding) -> list[str]:
    """What the first finding asks for: where the culprit is, the group to look at, or what to compare."""
    steps: list[str] = []
    group = finding.group
    group_name = group_in_words(group, f"ranks {group.members_label}") if group else ""
    if finding.kind == KIND_STRAGGLER and finding.culprit_ranks:
        rank = finding.culprit_ranks[0]
        steps.append(
            f"Find what slows rank {rank}{_on_host(job, rank)}: its data loading, CPU contention, a slower GPU or "
            f"link; it enqueues late in {group_name}, so the others wait for it in every collective."
        )
        return steps
    if finding.kind == KIND_STUCK:
        steps.append(
            f"Every member of {group_name} entered {finding.op} #{finding.seq} and none completed: look at NCCL's "
            "own logs (NCCL_DEBUG=INFO) and at the GPUs and network links of those ranks."
        )
        return steps
    if finding.kind.endswith("_mismatch") and finding.stacks:
        # often one stack is shown, the culprit's: "the stacks above" would send a reader looking for more
        (ranks, _), *others = finding.stacks
        stacks = f"the stack of {ranks_text(ranks)} above" if not others else "the stacks above"
        steps.append(
            f"Compare where the ranks of {group_name} called op #{finding.seq} ({stacks}): "
            + ("they called different collectives there." if finding.kind == "type_mismatch"
               else "they passed different tensors to it.")
        )  # fmt: skip
        return steps
    if not finding.culprit_ranks or finding.kind in (KIND_CRASH, KIND_STUCK_CPU):
        return steps
    rank = finding.culprit_ranks[0]
    if rank in job.dumps and rank not in job.stacks:  # its dump shows only the last op it issued
        process = job.processes.get(rank)
        if process is not None:
            host, pid = process
            how = f"on {host}: py-spy dump --pid {pid} > pyspy_rank_{rank}.txt"
        else:
            how = (
                f"on its host: py-spy dump --pid <its pid> > pyspy_rank_{rank}.txt (or fr2perfetto trigger <folder>, "
                "with fr2perfetto.capture in the job)"
            )
        steps.append(f"See where rank {rank} is now, {how}; then analyze again with the snapshot beside the dumps.")
    if group is not None:
        steps.append(f"The group to look at: {group_name}, op {finding.op} #{finding.seq}.")
    return steps


def _on_host(job: Job, rank: int) -> str:
    host = job.host_of(rank)
    return f" (on {host})" if host else ""
