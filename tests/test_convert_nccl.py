"""NCCL-layout dumps: start/completion times, send/recv, coalesced groups, ring-buffer wrap."""

from __future__ import annotations

from pathlib import Path

from fr2perfetto.base.model import MISSING, OK, STUCK
from fr2perfetto.layout.timeline import FINDING_FLOW_BASE
from fr2perfetto.match.ops import match_ops
from fr2perfetto.read.job import load_job

from .conftest import run_cli
from .tracecheck import read_trace


def convert(folder: Path, tmp_path: Path):
    out = tmp_path / "t.pftrace"
    code, _, stderr = run_cli("convert", str(folder), "-o", str(out))
    assert code == 0, stderr
    return read_trace(str(out))


def test_send_recv_and_coalesced_ops_are_joined(nccl_job, tmp_path: Path):
    folder = nccl_job("demo")
    trace = convert(folder, tmp_path)
    assert len(trace.processes) == 8
    slices = trace.all_slices()
    sends = [s for s in slices if s[3].startswith("send 0->4")]
    recvs = [s for s in slices if s[3].startswith("recv 0->4")]
    assert len(sends) == 1 and len(recvs) == 1
    # joined by one flow with exactly these two ends
    send_args, recv_args = sends[0][4], recvs[0][4]
    assert send_args["peers"] == recv_args["peers"] == "0->4"
    # the completed slices end at the watchdog's completion time
    assert sends[0][2] == send_args["time_completed_ns"]
    assert send_args["duration_ms"] == 0.3
    # coalesced: one slice per rank carrying the ops inside and the state of the closing entry
    coalesced = [s for s in slices if s[4].get("coalesced_ops") == "nccl:all_reduce, nccl:all_reduce, nccl:all_reduce"]
    assert len(coalesced) == 4 and all(s[4]["state"] == "completed" for s in coalesced)
    # a batch ran as one group call: one slice per rank, naming both of its ops, joined to both peers
    batch = [s for s in slices if s[3].startswith(("send 1->5", "recv 1->5", "send 5->1", "recv 5->1"))]
    assert sorted(s[3] for s in batch) == ["recv 1->5 #1 + send 5->1 #1", "send 1->5 #1 + recv 5->1 #1"]
    assert all(s[4]["state"] == "completed" and "coalesced_ops" in s[4] and len(s[4]["batch"]) == 2 for s in batch)
    assert trace.slice_flows[(batch[0][0], batch[0][1])][:2] == trace.slice_flows[(batch[1][0], batch[1][1])][:2]
    # flows: every matched op with two ranks or more has one
    ops = match_ops(load_job([str(folder)]))
    op_flows = [f for f in trace.flows if f < FINDING_FLOW_BASE]  # (not the findings', not the enqueues')
    assert len(op_flows) == sum(1 for op in ops if len(op.entries) > 1)
    # rank 5 never issued tp all_reduce #4: marked on 4, 6, 7 and a marker on 5
    markers = [(trace.process_of(u), n) for u, items in trace.markers().items() for _, n in items]
    assert markers == [("rank 5", "✗ NEVER ISSUED all_reduce #4")]


def test_ops_that_never_complete_run_to_the_end_of_the_trace(nccl_job, tmp_path: Path):
    trace = convert(nccl_job("stuck"), tmp_path)
    stuck = [s for s in trace.all_slices() if s[3].startswith("⏳ STUCK")]
    assert len(stuck) == 4
    last_end = max(s[2] for s in trace.all_slices())
    assert all(s[2] == last_end for s in stuck)
    assert all(s[4]["time_completed_ns"] == "unknown" for s in stuck)


def test_ring_buffer_wrap_is_not_mistaken_for_missing_ops(nccl_job):
    job = load_job([str(nccl_job("wrap"))])
    assert job.dumps[0].may_have_wrapped and not job.dumps[1].may_have_wrapped
    ops = match_ops(job)
    default = [op for op in ops if op.group.desc == "default_pg"]
    # rank 0 no longer holds the early default_pg ops that rank 1 still has: unknown, not missing
    early = [op for op in default if list(op.entries) == [1]]
    assert early and all(op.status == OK and op.unknown == (0,) for op in early)
    assert [op.seq for op in default if op.status == MISSING] == [21]


def test_missing_dump_leaves_a_labelled_process(nccl_job, tmp_path: Path):
    trace = convert(nccl_job("missing_dump"), tmp_path)
    assert "no dump" in trace.process_labels["rank 3"]


def test_stuck_status(nccl_job):
    ops = match_ops(load_job([str(nccl_job("stuck"))]))
    assert [op.seq for op in ops if op.status == STUCK] == [4]


def test_a_coalesced_group_one_rank_did_not_complete_is_not_ok(nccl_job):
    """A collective matched from coalesced groups takes each rank's state from its closing entry: the rank
    that has not completed its group is shown so, and the op is not settled as healthy."""
    import pickle

    folder = nccl_job("demo")
    path = folder / "nccl_trace_rank_0"
    dump = pickle.loads(path.read_bytes())
    closing = next(e for e in dump["entries"] if e["profiling_name"] == "nccl:coalesced")
    closing["state"], closing["time_discovered_completed_ns"] = "started", None
    path.write_bytes(pickle.dumps(dump, protocol=2))
    op = next(op for op in match_ops(load_job([str(folder)])) if (op.group.name, op.seq) == ("1", 4))
    assert len(op.entries[0]) == 4  # the group's three all_reduces and its closing entry
    assert list(zip(op.entries, op.states, strict=True)) == [
        (0, "started"),
        (1, "completed"),
        (2, "completed"),
        (3, "completed"),
    ]
    assert op.status != OK
