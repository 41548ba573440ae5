"""Pipelines as large jobs run them: 2 tp x 4 pp x 2 dp, 1F1B with 6 microbatches (``nccl_sim``)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from fr2perfetto.layout.looks import VICTIM

from .conftest import ROOT, run_cli
from .tracecheck import read_trace

sys.path.insert(0, str(ROOT / "samples"))

import nccl_sim


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, Path] = {}

    def write(name: str) -> Path:
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name)
            assert len(nccl_sim.write_pipeline_sample(name, str(made[name]))) == 16
        return made[name]

    return write


@pytest.mark.parametrize("name", ["pipeline_1f1b", "pipeline_batched"])
def test_healthy_pipeline_is_healthy(pipeline, name: str):
    code, stdout, _ = run_cli("analyze", str(pipeline(name)), "--json")
    report = json.loads(stdout)
    assert code == 0 and report["verdict"]["status"] == "healthy" and "findings" not in report
    assert report["job"]["ranks"] == 16


def test_stopped_stage_is_the_culprit_and_its_sender_a_victim(pipeline):
    # Stage 2 of the first dp replica (ranks 8, 9) stops on the CPU in the second step.
    code, stdout, _ = run_cli("analyze", str(pipeline("pipeline_stage_stopped")), "--json")
    report = json.loads(stdout)
    assert code == 1 and report["verdict"]["status"] == "hang"
    assert sorted(report["verdict"]["culprit_ranks"][:2]) == [8, 9]
    lines = [line for f in report["findings"] for line in f["evidence"]]
    assert "rank 4 is a victim: its send waits for rank 8." in lines  # stage 1 sends its activations


def test_trace_joins_each_pair_in_pair_order_and_marks_victims(pipeline, tmp_path: Path):
    out = tmp_path / "p.pftrace"
    code, _, stderr = run_cli("convert", str(pipeline("pipeline_stage_stopped")), "-o", str(out), "-q")
    assert code == 0, stderr
    trace = read_trace(str(out))
    # the k-th send from 4 to 8 and the k-th recv at 8 from 4 carry one flow, whatever their p2p_seq_id
    sends: dict[tuple[str, str], list] = defaultdict(list)
    recvs: dict[tuple[str, str], list] = defaultdict(list)
    for uuid, start, _, name, args in sorted(trace.all_slices(), key=lambda s: s[1]):
        plain = name.split(" ", 2)[-1] if name.startswith(VICTIM) else name
        for side, found in (("send ", sends), ("recv ", recvs)):
            if plain.startswith(side) and "peers" in args:
                found[(args["peers"], trace.process_of(uuid))].append(uuid_flow(trace, uuid, start))
    pairs = 0
    for (peers, process), flows in sends.items():
        src, dst = peers.split("->")
        if process != f"rank {src}":
            continue
        received = recvs.get((peers, f"rank {dst}"), [])
        k = min(len(flows), len(received))
        assert flows[:k] == received[:k] and k > 0
        pairs += 1
    assert pairs >= 8
    # rank 4 is blocked in the recv of its gradients from the stopped rank 8; its send of the next
    # activations to rank 8 waits on the same stream (one per pair): both are victims' slices
    victims = [(n, a.get("role"), a.get("stream")) for u, _, _, n, a in trace.all_slices()
               if trace.process_of(u) == "rank 4" and n.startswith(VICTIM)]  # fmt: skip
    blocked = [v for v in victims if v[0] == "⛓ VICTIM ⚠ UNMATCHED recv 8->4 #7"]
    assert blocked and blocked[0][1] == "victim: blocked here, waiting for rank 8 (never issued)"
    assert blocked[0][2].startswith("the first op on its stream that did not complete")  # it holds the stream
    queued = [n for u, items in trace.instants.items() if trace.process_of(u) == "rank 4" for _, n in items]
    assert any(n.startswith("⏸ QUEUED send 4->8") and n.endswith("(behind recv 8->4 #7)") for n in queued)


def uuid_flow(trace, uuid: int, start: int) -> int:
    """The op flow of a rank's slice (the flow id below the findings')."""
    return trace.slice_flows[(uuid, start)][0]


def test_clocks_of_two_hosts_are_aligned_in_the_trace(pipeline, tmp_path: Path):
    # ranks 8-15 run on a host whose clock is 7 ms ahead; sends and recvs complete together
    out = tmp_path / "h.pftrace"
    run_cli("convert", str(pipeline("pipeline_1f1b")), "-o", str(out), "-q")
    trace = read_trace(str(out))
    shifts = {}
    for uuid, _, end, _, args in trace.all_slices():
        if isinstance(args.get("time_completed_ns"), int):  # a slice ends where it completed, as drawn
            shifts.setdefault(trace.process_of(uuid), args["time_completed_ns"] - end)
    host_a = [shifts[f"rank {r}"] for r in range(8)]
    host_b = [shifts[f"rank {r}"] for r in range(8, 16)]
    gap = sum(host_b) / 8 - sum(host_a) / 8
    assert 5e6 < gap < 9e6  # the 7 ms were taken out, give or take the watchdog's 10 ms polls
    assert any(label.startswith("clock +") for label in trace.process_labels["rank 12"])
