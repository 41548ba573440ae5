"""The timeline people read: streams as GPU profilers show them (never two slices partly over each other),
the CPU side with a flow from each enqueue to what ran, lateness that makes a straggler stand out, a
number of tracks bounded by groups, pairs and threads, in both formats."""

from __future__ import annotations

import json
import re
import statistics
import urllib.parse
from pathlib import Path

import picture
import pytest

from fr2perfetto.base.model import MISSING, STUCK, Entry, Group, MatchedOp
from fr2perfetto.layout.looks import QUEUED, Highlights, Looks
from fr2perfetto.layout.streams import LAUNCH_FLOW_BASE, lay_out
from fr2perfetto.layout.timeline import items_per_rank, ops_by_rank
from fr2perfetto.match.ops import match_ops
from fr2perfetto.read.job import load_job

from .conftest import ROOT, run_cli
from .helpers import NOW
from .helpers import count_lines as _count_lines
from .helpers import make_entry as _entry
from .tracecheck import read_trace

SAMPLES = sorted(p for p in (ROOT / "samples").glob("*/*") if p.is_dir())


def _partial_overlaps(spans: list[tuple[int, int]]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Pairs of spans of one track that overlap without one holding the other."""
    found = []
    ordered = sorted(spans, key=lambda s: (s[0], -s[1]))
    open_spans: list[tuple[int, int]] = []
    for span in ordered:
        while open_spans and open_spans[-1][1] <= span[0]:
            open_spans.pop()
        if open_spans and span[1] > open_spans[-1][1]:
            found.append((open_spans[-1], span))
        open_spans.append(span)
    return found


def _json_spans(path: Path) -> dict[tuple[int, int], list[tuple[int, int]]]:
    doc = json.loads(path.read_text())
    spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for event in doc["traceEvents"]:
        if event["ph"] == "X":
            start = round(event["ts"] * 1000)
            spans.setdefault((event["pid"], event["tid"]), []).append((start, start + round(event["dur"] * 1000)))
    return spans


def _is_group_stream(name: str) -> bool:
    """A group's stream: ``tp · pg 2 · 4 ranks``, or ``pg 3 · 2 ranks`` for a group with no description."""
    return " · pg " in name or name.startswith("pg ")


@pytest.mark.parametrize("sample", SAMPLES, ids=[f"{p.parent.name}/{p.name}" for p in SAMPLES])
def test_every_samples_trace_has_streams_that_never_partly_overlap(sample: Path, tmp_path: Path):
    out, json_out = tmp_path / "t.pftrace", tmp_path / "t.json"
    for path in (out, json_out):
        code, _, stderr = run_cli("convert", str(sample), "-o", str(path), "-q", "--full")
        assert code == 0, stderr
    trace = read_trace(str(out))
    for uuid, slices in trace.slices.items():
        assert not _partial_overlaps([(s, e) for s, e, _, _ in slices]), trace.tracks[uuid][0]
        if _is_group_stream(trace.tracks[uuid][0]) or trace.tracks[uuid][0].startswith("send/recv"):
            starts = [s for s, _, _, _ in slices]
            assert starts == sorted(starts)  # a stream's slices in the order they ran
    for thread, spans in _json_spans(json_out).items():
        assert not _partial_overlaps(spans), thread
    # per rank: a track per group, pair stream, thread and counter, and a few of its own, never more
    groups_of = {name.split(" · ")[0] for name in trace.processes.values()}
    for rank in groups_of:
        tracks = [u for u in trace.tracks if trace.tracks[u][1] is not None and trace.process_of(u) == rank]
        names = [trace.tracks[u][0] for u in tracks]
        groups = sum(_is_group_stream(n) for n in names)
        pairs = sum(n.startswith("send/recv with rank") for n in names)
        threads = sum(n.startswith(("thread ", "enqueued (thread")) for n in names)
        counters = sum(u in trace.counter_axes for u in tracks)
        assert counters <= groups and len(names) <= groups + pairs + threads + counters + 2, (rank, names)


def test_a_1f1b_pipeline_is_a_few_tracks_per_rank_not_a_staircase(tmp_path: Path):
    out = tmp_path / "t.pftrace"
    run_cli("convert", str(ROOT / "samples" / "nccl" / "pipeline_1f1b"), "-o", str(out), "-q")
    trace = read_trace(str(out))
    for rank in range(16):
        tracks = [u for u in trace.tracks if trace.process_of(u) == f"rank {rank}"]
        assert len(tracks) <= 12, [trace.tracks[u][0] for u in tracks]  # the process's own track included
    names = {trace.tracks[u][0] for u in trace.tracks if trace.process_of(u) == "rank 5"}
    assert {"send/recv with rank 1", "send/recv with rank 9"} <= names and "lane 2" not in names
    # every op a rank ran is joined to its enqueue on the thread's track: one flow with two ends each
    launches = {f: n for f, n in trace.flows.items() if f >= LAUNCH_FLOW_BASE}
    ran = [s for u, items in trace.slices.items() if not trace.is_thread_track(u) for s in items if "op_id" in s[3]]
    assert len(launches) == len(ran) and set(launches.values()) == {2}


@pytest.mark.parametrize("sample", ["pipeline_stage_stopped", "demo"])
def test_the_op_that_holds_a_stream_is_one_slice_with_the_queued_behind_it(sample: str, tmp_path: Path):
    folder = ROOT / "samples" / "nccl" / sample
    out = tmp_path / "t.pftrace"
    run_cli("convert", str(folder), "-o", str(out), "-q")
    trace = read_trace(str(out))
    ends: dict[str, int] = {}  # each rank's end of the trace (on its own clock, where shifted)
    for uuid, items in trace.slices.items():
        rank = trace.process_of(uuid)
        ends[rank] = max([ends.get(rank, 0), *(e for _, e, _, _ in items)])
    holders = [(u, s) for u, items in trace.slices.items() for s in items if "stream" in s[3]]
    assert holders
    for uuid, (start, stop, name, args) in holders:
        # it never completed: to the end of the trace
        assert stop == ends[trace.process_of(uuid)] and args["state"] != "completed"
        assert args["stream"].startswith("the first op on its stream that did not complete")
        same = [s for s in trace.slices[uuid] if s[0] >= start]
        assert same[0][2] == name and all(s[1] <= stop for s in same)  # the one slice, anything else inside
    queued = [n for items in trace.markers().values() for _, n in items if n.startswith(QUEUED)]
    assert sample != "pipeline_stage_stopped" or queued  # ops behind the holders: queued, not drawn as run
    # the deep link frames the verdict's op
    code, link, _ = run_cli("open", str(out), "--url", "https://example.org/t.pftrace")
    arguments = urllib.parse.parse_qs(link.strip().split("#!/?", 1)[1])
    window = int(arguments["visStart"][0]), int(arguments["visEnd"][0])
    assert code == 0 and any(window[0] <= start <= window[1] for _, (start, _, _, _) in holders)


def test_a_stragglers_lateness_counter_stands_above_every_other_rank(tmp_path: Path):
    out = tmp_path / "t.pftrace"
    run_cli("convert", str(ROOT / "samples" / "nccl" / "straggler"), "-o", str(out), "-q")
    trace = read_trace(str(out))
    _, report, _ = run_cli("analyze", str(ROOT / "samples" / "nccl" / "straggler"), "--json")
    finding = json.loads(report)["findings"][0]
    (late,) = finding["culprit_ranks"]
    group = finding["group"]
    medians = {}
    for uuid, values in trace.counters.items():
        assert trace.counter_axes[uuid] == "fr2perfetto.lateness"  # one y axis for every rank's
        name, rank = trace.tracks[uuid][0], trace.process_of(uuid)
        assert name.startswith("enqueue lateness · ") and name.endswith(f" · {rank}")
        if f"{group['desc']} (pg " in name:  # the straggler's group, on every rank
            medians[rank] = statistics.median(v for _, v in values)
    others = [m for rank, m in medians.items() if rank != f"rank {late}"]
    assert others and medians[f"rank {late}"] > 0 and all(medians[f"rank {late}"] >= 5 * m for m in others), medians
    # the deep link brings that counter up: it pins it
    _, link, _ = run_cli("open", str(out), "--url", "https://example.org/t.pftrace")
    commands = json.loads(urllib.parse.parse_qs(link.strip().split("#!/?", 1)[1])["startupCommands"][0])
    (pin,) = [c["args"][0] for c in commands if c["id"] == "dev.perfetto.PinTracksByRegex"]
    pinned = [n for n, _ in trace.tracks.values() if re.fullmatch(pin, n)]
    assert f"enqueue lateness · {group['desc']} (pg {group['name']}) · rank {late}" in pinned


def _stream_items(count: int) -> list[tuple[MatchedOp, list[Entry]]]:
    """One rank's ops on one group: the first started and never completed, the others enqueued behind it."""
    group = Group("0", "default_pg", (0, 1), 0, "0-1")
    items = []
    for seq in range(1, count + 1):
        entry = _entry(collective_seq=seq, op_id=seq, time_created_ns=NOW + 1000 * seq, state="scheduled",
                       time_started_ns=None, time_completed_ns=None)  # fmt: skip
        if seq == 1:
            entry = entry._replace(state="started", time_started_ns=NOW + 1500)
        op = MatchedOp(group, "collective", seq, {0: [entry], 1: [entry._replace(rank=1)]}, status=STUCK, op_key=seq)
        op.first_time_ns, op.name, op.created_ns = NOW + 1000 * seq, "all_reduce", [NOW + 1000 * seq] * 2
        items.append((op, [entry]))
    return items


def test_layout_of_a_held_stream():
    items = _stream_items(4)
    never = MatchedOp(items[0][0].group, "collective", 9, {1: [_entry()]}, status=MISSING, missing=(0,), op_key=9)
    never.first_time_ns, never.name = NOW + 2500, "all_reduce"
    layout = lay_out(0, [*items, (never, [])], NOW + 100_000, Looks(Highlights(), 0))
    (stream,) = layout.streams.values()
    holder, *rest = sorted(stream.slices, key=lambda s: s.start)
    assert (holder.start, holder.end) == (NOW + 1500, NOW + 100_000) and stream.nested
    assert [s.end for s in rest] == [None] * 4  # three queued behind it, one never issued: instants
    assert [s.name for s in rest if s.name.startswith(QUEUED)] == [
        f"{QUEUED}all_reduce #{seq} (behind all_reduce #1)" for seq in (2, 3, 4)
    ]
    ((_, enqueues),) = layout.enqueues.items()
    assert [e.start for e in enqueues] == [NOW + 1000 * seq for seq in range(1, 5)]
    assert [e.flows for e in enqueues] == [s.flows for s in sorted(stream.slices, key=lambda s: s.start) if s.flows]


def test_layout_work_grows_with_the_ops_not_their_square():
    """2 ranks x many ops that never started (the case that once made lanes quadratic)."""

    def work(count: int) -> int:
        items = _stream_items(count)
        return _count_lines(lambda: lay_out(0, items, NOW + 10**9, Looks(Highlights(), 0)))

    ratio = work(4000) / work(2000)
    assert ratio < 2.3, ratio


def test_the_readmes_picture_draws_streams_threads_and_counters(tmp_path: Path):
    out = tmp_path / "demo.pftrace"
    assert run_cli("convert", str(ROOT / "samples" / "nccl" / "demo"), "-o", str(out), "-q")[0] == 0
    svg = picture.draw(str(out))
    labels = re.findall(r"<text x=\"4\" y=\"[\d.]+\">([^<]*)</text>", svg)
    assert "rank 5 · CULPRIT · tp · pg 2 · 4 ranks" in labels and "rank 0 · send/recv with rank 4" in labels
    assert sum(1 for label in labels if label.startswith("enqueue lateness")) == svg.count("<polyline")
    assert svg.count("<polyline") == sum(1 for label in labels if " · pg " in label and "lateness" not in label)


@pytest.mark.parametrize("sample", ["nccl/pipeline_1f1b", "nccl/pipeline_batched", "nccl/demo", "gloo/skip"])
def test_each_ranks_ops_are_indexed_with_its_own_entries(sample: str):
    """The layout's index of every rank's ops and entries, from ops that hold rows (collectives), entries
    (sends and recvs) or entries linked into coalesced groups, and ranks that never issued one; a writing
    process indexes only its own ranks, and finds the same for them; no entry stands in two ops."""
    job = load_job([str(ROOT / "samples" / sample)], jobs=1)
    ops = match_ops(job)

    def indexed(ranks: set[int] | None = None) -> dict[int, list[tuple[int, list[Entry]]]]:
        index = ops_by_rank(ops, ranks)
        return {rank: [(op.op_key, entries) for op, entries in items] for rank, items in index.items()}

    every = indexed()
    assert sorted(every) == sorted(job.dumps) and sum(map(len, every.values())) >= len(ops)
    some = set(list(every)[1::2])
    assert indexed(some) == {rank: items for rank, items in every.items() if rank in some}
    assert items_per_rank(ops) == {rank: len(items) for rank, items in every.items()}
    for rank, items in every.items():  # each rank's own entries, in the order of the ops, each once
        assert all(entry.rank == rank for _, entries in items for entry in entries)
        assert [key for key, _ in items] == sorted(key for key, _ in items)
        held = [entry for _, entries in items for entry in entries]
        assert len(held) == len(set(held)) <= len(job.dumps[rank].entries)
