"""Ranks laid out from rows (``layout.rows``) give the trace the object path gives, byte for byte: on every
sample, on generated programs, on a hung job of many ranks written by forked writers."""

from __future__ import annotations

import pickle
import random
import struct
import sys
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from fr2perfetto import convert
from fr2perfetto.base.speedups import SPEEDUPS
from fr2perfetto.layout import rows as rows_module
from fr2perfetto.layout import streams
from fr2perfetto.layout.rows import HELD_ROW, ITEM, MISSING_ROW, LookTable, SliceRows
from fr2perfetto.layout.scene import Slice, SliceLook
from fr2perfetto.read.job import load_job
from fr2perfetto.render import perfetto as perfetto_writer

from . import programs
from .programs import sim
from .tracecheck import read_trace

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
needs_speedups = pytest.mark.skipif(SPEEDUPS is None, reason="rows are laid out only where the speed-ups are built")


def _both_ways(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int = 1) -> tuple[bytes, int]:
    """The trace of the dumps in ``folder`` from rows, checked to be the one from items and parsed back with
    Perfetto's schema; and how many of the written ranks were laid out from rows."""
    analysis = convert.analyse(load_job([str(folder)], jobs=1))
    from_rows: list[int] = []
    made = rows_module.job_rows

    def counted(job, ops, ranks):  # type: ignore[no-untyped-def]
        found = made(job, ops, ranks)
        from_rows.append(len(found.items) if found is not None else 0)
        return found

    with monkeypatch.context() as patch:
        patch.setattr(convert, "job_rows", counted)
        convert.write_trace(analysis, str(tmp_path / "rows.pftrace"), jobs=jobs)
    with monkeypatch.context() as patch:
        patch.setattr(convert, "job_rows", lambda job, ops, ranks: None)
        convert.write_trace(analysis, str(tmp_path / "items.pftrace"), jobs=jobs)
    written = (tmp_path / "rows.pftrace").read_bytes()
    assert written == (tmp_path / "items.pftrace").read_bytes()
    parsed = pb.Trace()
    parsed.ParseFromString(written)
    assert len(parsed.packet) > 3
    return written, sum(from_rows)


@needs_speedups
@pytest.mark.parametrize("folder", sorted(p.relative_to(SAMPLES).as_posix() for p in SAMPLES.glob("*/*/")))
def test_every_sample_converts_the_same_from_rows(folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _, from_rows = _both_ways(SAMPLES / folder, tmp_path, monkeypatch)
    assert read_trace(str(tmp_path / "rows.pftrace")).processes
    if folder in ("nccl/straggler", "nccl/pipeline_1f1b", "gloo/healthy"):
        assert from_rows >= 2  # what rows are for: every rank of these is read from columns


@needs_speedups
def test_generated_programs_convert_the_same_from_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Faults of every kind, clocks that disagree, wrapped buffers, sends and recvs, lost dumps."""
    laid_out = 0
    for seed in range(24):
        scenario = programs.generate(seed)
        folder = tmp_path / f"program{seed}"
        sim.write_dumps(programs.dumps(scenario), str(folder), json_ranks=scenario.json_ranks)
        _, from_rows = _both_ways(folder, tmp_path, monkeypatch)
        laid_out += from_rows
        # well formed: every flow with two ends (a queued op's too: seeds 8 and 17 queue batched sends)
        assert read_trace(str(tmp_path / "rows.pftrace")).processes
    assert laid_out > 24


@needs_speedups
def test_a_hung_job_of_many_ranks_converts_the_same_from_rows_in_forked_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Every rank but one blocked in the op that rank never issued (a role in it: Python's to lay out), the
    rest of its ops laid out in C; written by two forked writers."""
    sys.path.insert(0, str(ROOT / "bench"))
    from generate import generate

    generate(str(tmp_path / "dumps"), 64, 120, processes=2)
    _, from_rows = _both_ways(tmp_path / "dumps", tmp_path, monkeypatch)
    assert from_rows == 64  # counted in this process: the forked writers' count stays with them
    written, _ = _both_ways(tmp_path / "dumps", tmp_path, monkeypatch, jobs=2)
    trace = read_trace(str(tmp_path / "rows.pftrace"))
    assert len(trace.processes) == 64 and len(written) > 100_000
    never_issued = [(trace.process_of(uuid), name) for uuid, marks in trace.markers().items() for _, name in marks]
    assert never_issued == [("rank 21", "✗ NEVER ISSUED all_reduce #42")]
    assert len(trace.sequences) == 3  # this process's and each writer's


def test_rank_groups_partition_and_sort_as_the_object_path(monkeypatch: pytest.MonkeyPatch):
    """Groups in order of their first op, items in the given order unless a start goes back (then sorted by
    start, ties in the given order); a missing rank begins at the op's first time, held entries where
    ``start_of`` says."""
    if SPEEDUPS is None:
        pytest.skip("a C function")
    op_groups = struct.pack("=6i", 7, 3, 7, 3, 7, 3)
    first_times = struct.pack("=6q", 100, 110, 120, 130, 140, 150)
    created = struct.pack("=3q", 500, 90, 95)  # rows 0..2
    items = b"".join(ITEM.pack(op, row) for op, row in ((0, 0), (1, 1), (2, MISSING_ROW), (3, 2), (4, HELD_ROW),
                                                        (5, MISSING_ROW)))  # fmt: skip
    groups = SPEEDUPS.rank_groups(items, op_groups, created, first_times, lambda op: 130)
    unpacked = [(group, [ITEM.unpack_from(packed, i) for i in range(0, len(packed), ITEM.size)])
                for group, packed in groups]  # fmt: skip
    # group 7: starts 500, 120, 130: back at the second, so sorted; group 3: 90, 95, 150: in order
    assert unpacked == [(7, [(2, MISSING_ROW), (4, HELD_ROW), (0, 0)]), (3, [(1, 1), (3, 2), (5, MISSING_ROW)])]
    with pytest.raises(IndexError, match="beyond the ops or the rows"):
        SPEEDUPS.rank_groups(ITEM.pack(0, 3), op_groups, created, first_times, lambda op: 0)


def test_slice_rows_hold_slices_as_a_list_would():
    """What the layout does with a track's slices: add, replace (a batch's look), read back in order, sort
    by start (stable), count; a record is made into the Slice it stands for."""
    table = LookTable()
    ran, enqueued, other = SliceLook("ran", ()), SliceLook("enqueued", ()), SliceLook("other", ())
    entries = ["entry 0", "entry 1"]  # what a record's row names: the rank's entry
    held = SliceRows(table, entries)  # type: ignore[arg-type]
    held.records += rows_module.RECORD.pack(30, 40, 7, table.number(ran), 1)
    held.records += rows_module.RECORD.pack(10, rows_module.NO_END, 8, table.number(enqueued), -1)
    marker = Slice(10, None, other)
    held.append(marker)
    assert len(held) == 3 and table.number(ran) == 0 and len(table.looks) == 2
    assert held[0] == Slice(30, 40, ran, "entry 1", "entry 1", (7,))  # type: ignore[arg-type]
    assert held[1] == Slice(10, None, enqueued, None, None, (8,)) and held[-1] is marker
    held[0] = held[0]._replace(look=other)
    assert held[0].look is other and held[0].start == 30
    held.sort_by_start()
    assert [(s.start, s.look.name) for s in held] == [(10, "enqueued"), (10, "other"), (30, "other")]
    with pytest.raises(IndexError):
        held[3]
    # starts no record holds (a stranger's times, shifted by a clock): ordered as Python orders them
    late, early = Slice(2**70, None, other), Slice(-(2**70), 5, other)
    held.append(late)
    held.append(early)
    held.sort_by_start()
    assert held[0] is early and held[4] is late and [s.start for s in held][1:4] == [10, 10, 30]


def test_slices_a_record_can_stand_for_are_held_as_records():
    """A send's or recv's slice (one flow, standing for the rank's one entry at a row) and an enqueue's instant
    are held as records, which the writer encodes in C, with looks of the track's own, numbered after the
    table's for the encoder; a slice closed by another entry stays an object."""
    table = LookTable()
    shared, send, enqueue = SliceLook("shared", ()), SliceLook("send", ()), SliceLook("enqueue", ())
    table.number(shared)
    held = SliceRows(table, ["entry 0", "entry 1"])  # type: ignore[arg-type]
    ran = Slice(30, 40, send, "entry 1", "entry 1", (7,))  # type: ignore[arg-type]
    enqueued = Slice(10, None, enqueue, None, None, (8,))
    batched = Slice(50, 60, send, "entry 0", "its batch's closing entry", (9,))  # type: ignore[arg-type]
    held.append(ran, 1)
    held.append(enqueued)
    held.append(batched, 0)
    assert held.extras == [batched] and held.own_looks == [send, enqueue] and len(table.looks) == 1
    assert list(held) == [ran, enqueued, batched]
    records, looks = held.numbered()
    assert looks == [shared, send, enqueue]
    numbers = [rows_module.RECORD.unpack_from(records, i * rows_module.RECORD.size)[3] for i in range(3)]
    assert numbers == [1, 2, rows_module.EXTRA]


_EXTREMES = [0, 1, 2**56 - 1, 2**56, 2**62 - 1, 2**62, 2**63 - 1]  # times no real job writes; C adds none of them


def _mutated(entry: dict[str, object], rng: random.Random) -> None:
    """Change one field of an entry as a stranger's dump might: times missing, zero, huge or going back,
    threads that change, ids past any real one, a state that disagrees with the times."""
    kind = rng.randrange(10)
    if kind == 0:
        entry["time_discovered_completed_ns"] = None
    elif kind == 1:
        entry["time_discovered_started_ns"] = rng.choice([None, 0, *_EXTREMES])
    elif kind == 2:
        entry["time_discovered_completed_ns"] = rng.choice(_EXTREMES)
    elif kind == 3:
        entry["time_created_ns"] = rng.choice([*_EXTREMES, int(entry["time_created_ns"]) - 10**7])  # type: ignore[call-overload]
    elif kind == 4:
        entry["thread_id"], entry["thread_name"] = str(rng.randrange(3)), rng.choice(["", "worker"])
    elif kind == 5:
        entry.pop("duration_ms", None)
    elif kind == 6:
        entry["input_sizes"] = [[rng.randrange(3)]]
    elif kind == 7:
        entry["op_id"] = rng.choice(_EXTREMES)
    elif kind == 8:
        entry["frames"] = []
    else:
        entry["state"] = rng.choice(["scheduled", "started", "completed"])


@needs_speedups
@pytest.mark.parametrize("sample", ["nccl/straggler", "nccl/pipeline_1f1b", "nccl/victim", "nccl/wrap"])
def test_strangers_dumps_convert_the_same_from_rows_from_items_and_in_python(
    sample: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Fields changed at random in a tenth of the entries: every way of laying out and writing gives the
    same bytes (the C layouts leave to Python any time they could not add without overflow)."""
    rng = random.Random(sample)
    for attempt in range(3):
        folder = tmp_path / f"dumps{attempt}"
        folder.mkdir()
        for path in sorted((SAMPLES / sample).iterdir()):
            dump = pickle.loads(path.read_bytes())
            for entry in dump["entries"]:
                if rng.random() < 0.1:
                    _mutated(entry, rng)
            (folder / path.name).write_bytes(pickle.dumps(dump, protocol=2))
        written, from_rows = _both_ways(folder, tmp_path, monkeypatch)
        analysis = convert.analyse(load_job([str(folder)], jobs=1))
        assert from_rows == len(analysis.job.dumps) >= 2
        with monkeypatch.context() as patch:
            for module in (streams, rows_module, perfetto_writer):
                patch.setattr(module, "_speedups", None)
            convert.write_trace(analysis, str(tmp_path / "python.pftrace"))
        assert (tmp_path / "python.pftrace").read_bytes() == written


@needs_speedups
def test_a_fallback_that_fails_stops_the_write(monkeypatch: pytest.MonkeyPatch):
    """A slice the C encoder leaves to Python, whose encoding raises: the write stops with that error."""
    import io

    dump = load_job([str(SAMPLES / "nccl" / "demo")], jobs=1).dumps[0]
    held = SliceRows(LookTable(), dump.entries)
    held.append(Slice(10, None, SliceLook("queued", ())))
    writer = perfetto_writer.PerfettoWriter(io.BytesIO())
    monkeypatch.setattr(writer, "_slice_packets", lambda item, codes: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        writer.slices(42, held)
