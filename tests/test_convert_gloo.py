"""Real multi-process gloo jobs, dumped by PyTorch, converted, and read back with Perfetto's schema."""

from __future__ import annotations

from pathlib import Path

from fr2perfetto.layout.looks import NEVER_ISSUED, PREFIX, VICTIM
from fr2perfetto.layout.streams import LAUNCH_FLOW_BASE
from fr2perfetto.layout.timeline import FINDING_FLOW_BASE
from fr2perfetto.match.ops import match_ops
from fr2perfetto.read.job import load_job

from .conftest import run_cli
from .tracecheck import read_trace


def test_skipped_collective_is_marked_on_waiters_and_on_the_rank_that_never_issued_it(gloo_job, tmp_path: Path):
    dumps = gloo_job("skip")
    trace_path = tmp_path / "skip.pftrace"
    code, stdout, stderr = run_cli("convert", str(dumps), "-o", str(trace_path))
    assert code == 0, stderr
    trace = read_trace(str(trace_path))

    # One process per rank, named and sorted by rank.
    assert sorted(trace.processes.values()) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert [trace.processes[pid] for pid in sorted(trace.processes)] == ["rank 0", "rank 1", "rank 2", "rank 3"]

    # One track per group per member rank: default_pg on all four, each tp pair on its two ranks.
    default_tracks = trace.tracks_named("default_pg · pg 0 · 4 ranks")
    assert sorted(trace.process_of(t) for t in default_tracks) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    tp_tracks = trace.tracks_named("tp · pg")
    assert sorted(trace.process_of(t) for t in tp_tracks) == ["rank 0", "rank 1", "rank 2", "rank 3"]

    # The skipped all_reduce #4 of default_pg: marked on ranks 0, 1, 3 (victims, waiting for rank 2)
    # and a marker on rank 2.
    unmatched = [
        (trace.process_of(u), name, args["role"])
        for u, _, _, name, args in trace.all_slices()
        if PREFIX["missing"] in name
    ]
    assert sorted(unmatched) == [
        (
            f"rank {r}",
            VICTIM + PREFIX["missing"] + "all_reduce #4",
            "victim: blocked here, waiting for rank 2 (never issued)",
        )
        for r in (0, 1, 3)
    ]
    markers = [(trace.process_of(u), name) for u, items in trace.markers().items() for _, name in items]
    assert markers == [("rank 2", NEVER_ISSUED + "all_reduce #4")]
    (marker_track,) = [u for u, items in trace.markers().items() if items]
    assert "default_pg" in trace.tracks[marker_track][0]

    # Flows: one per op issued by two ranks or more, each joining all of them, and one from the
    # finding to the three waiting ranks' slices and the culprit's marker.
    ops = match_ops(load_job([str(dumps)]))
    op_flows = {f: n for f, n in trace.flows.items() if f < FINDING_FLOW_BASE}
    assert len(op_flows) == sum(1 for op in ops if len(op.entries) >= 2)
    assert sorted(op_flows.values()) == sorted(len(op.entries) for op in ops if len(op.entries) >= 2)
    assert sorted(n for f, n in trace.flows.items() if FINDING_FLOW_BASE <= f < LAUNCH_FLOW_BASE) == [1 + 3 + 1]
    # and each rank's enqueue of each op it issued joined to where it ran: two ends each
    launches = [n for f, n in trace.flows.items() if f >= LAUNCH_FLOW_BASE]
    assert len(launches) == sum(len(op.entries) for op in ops) and set(launches) == {2}
    # gloo records no completion: the slice says so instead of inventing a duration.
    args = next(s[4] for s in trace.all_slices() if trace.process_of(s[0]) == "rank 0")
    assert "records enqueue time only" in str(args["timing"])
    assert "Wrote" in stdout and "4 ranks" in stdout


def test_healthy_job_with_mixed_pickle_and_json_dumps(gloo_job, tmp_path: Path):
    dumps = gloo_job("healthy")
    assert sorted(p.name for p in dumps.iterdir()) == [
        "gloo_trace_rank_0",
        "gloo_trace_rank_1.json",
        "gloo_trace_rank_2",
        "gloo_trace_rank_3.json",
    ]
    trace_path = tmp_path / "healthy.pftrace"
    code, _, stderr = run_cli("convert", str(dumps), "-o", str(trace_path))
    assert code == 0, stderr
    trace = read_trace(str(trace_path))
    names = [name for _, _, _, name, _ in trace.all_slices()]
    assert not [n for n in names if n.startswith(("⚠", "⏳"))]
    assert not any(trace.markers().values())
    # default_pg (all), two tp pairs, two dp pairs: each rank has default + tp + dp tracks.
    for rank in range(4):
        groups = sorted(
            name.split(" · ")[0]
            for u, (name, parent) in trace.tracks.items()
            if parent is not None and trace.process_of(u) == f"rank {rank}" and " · pg " in name
        )
        assert groups == ["default_pg", "dp", "tp"]
    # every op was issued by all members of its group, so every slice carries a flow id
    ops = match_ops(load_job([str(dumps)]))
    assert len([f for f in trace.flows if f < LAUNCH_FLOW_BASE]) == len(ops)
    # stack frames are on the slices, innermost first
    stack = next(s[4] for s in trace.all_slices() if trace.process_of(s[0]) == "rank 0")["stack"]
    assert isinstance(stack, list) and stack[0].startswith(("all_reduce", "all_gather", "broadcast", "barrier"))


def test_subgroup_membership_is_rebuilt_from_entries(gloo_job):
    job = load_job([str(gloo_job("healthy"))])
    # gloo's pg_config is broken ("" with "[]"); members come from which ranks used each group.
    members = sorted((g.desc, g.members) for g in job.groups)
    assert members == [("default_pg", (0, 1, 2, 3)), ("dp", (0, 2)), ("dp", (1, 3)), ("tp", (0, 1)), ("tp", (2, 3))]
