"""The reader's columns (``read.columns``): the C reader (``_speedups.pickle_columns``) writes, byte for
byte, the columns and tables the reference writes from the Python reader's entries, on every sample;
it leaves every file it cannot read so to that reader; and entries made from columns are the entries."""

from __future__ import annotations

import pickle
import sys
from array import array
from pathlib import Path
from unittest import mock

import pytest

from fr2perfetto.base.model import Entry, RankDump
from fr2perfetto.base.speedups import SPEEDUPS
from fr2perfetto.read import columns, reader
from fr2perfetto.read.reader import DumpError, read_dump_columns, read_dump_reference

from .conftest import ROOT

SAMPLES = sorted(str(p) for p in (ROOT / "samples").glob("*/*/*") if p.is_file())
needs_c = pytest.mark.skipif(SPEEDUPS is None, reason="the C speed-ups are not built")


def columns_agree(path: str, data: bytes | None = None) -> columns.RankColumns | None:
    """The columns ``read_dump_columns`` writes are the reference's for the Python reader's entries (or
    both fail with the same one-line error); the columns, or None."""
    try:
        expected = read_dump_reference(path, data)
    except DumpError as error:
        with pytest.raises(DumpError) as raised:
            read_dump_columns(path, data=data)
        assert str(raised.value) == str(error) and "\n" not in str(error)
        return None
    dump, made = read_dump_columns(path, data=data)
    assert made.to_bytes() == columns.from_entries(expected.rank, expected.entries).to_bytes()
    assert (dump.time_range, dump.group_counts) == (expected.time_range, expected.group_counts)
    assert repr(columns.to_entries(made, columns.entries_in_python)) == repr(expected.entries)
    assert repr(columns.to_entries(made)) == repr(expected.entries)  # in C where it is built
    return made


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.split("samples/")[1])
def test_every_sample_reads_to_the_same_columns(path: str):
    columns_agree(path)
    with mock.patch.object(reader, "_speedups", None):  # as FR2PERFETTO_NO_SPEEDUPS reads it
        columns_agree(path)


@needs_c
def test_the_c_reader_reads_every_sample_pickle_of_2x_itself():
    walked = []
    for path in SAMPLES:
        with open(path, "rb") as file:
            data = file.read()
        if data[:1] == b"\x80" and read_dump_reference(path).version.startswith("2."):
            made = SPEEDUPS.pickle_columns(data, 64, 10**8, reader._WALK_KEYS)
            assert made is not None, path
            walked.append(path)
    assert len(walked) > 100


@needs_c
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80\x02.",
        b"\x80\x02}q\x00.",
        b"\x80\x02]q\x00.",  # a list at the top
        b"\x80\x02}q\x00(X\x07\x00\x00\x00entriesq\x01]q\x02h\x02au.",  # the entries list in itself
        b"\x80\x02}(X\x07\x00\x00\x00entries](}(u}(ueu.",  # entries without a key
        b"\x80\x02cos\nsystem\n(X\x02\x00\x00\x00idtR.",  # code: never run, by either reader
        b"\x80\x02}q\x00(X\x01\x00\x00\x00a" + b"(" * 100 + b")" + b"\x85" * 100 + b"u.",  # nested deep
        b"\x80\x02}q\xff",
    ],
)
def test_odd_pickles_read_the_same_by_both_readers(data: bytes):
    columns_agree("/odd/nccl_trace_rank_0", data)


def _real(**changes: object) -> dict[str, object]:
    """A real NCCL dump, decoded, with ``changes`` to its top dict."""
    with open(ROOT / "samples" / "nccl" / "demo" / "nccl_trace_rank_1", "rb") as file:
        dump = pickle.load(file)
    return {**dump, **changes}


def _odd_dumps() -> list[bytes]:
    one_entry = pickle.dumps(_real(entries=_real()["entries"][:1]), protocol=2)  # APPEND, not APPENDS
    # "entries" twice in the top dict: the later value (None) is the one the unpickler keeps
    twice = pickle.dumps({**_real(), "zzzzzzz": None}, protocol=2).replace(b"zzzzzzz", b"entries")
    states = _real()
    states["entries"] = [{**entry, "state": "odd"} for entry in states["entries"]]  # inferred from times
    return [one_entry, twice, pickle.dumps(states, protocol=2), pickle.dumps(_real(version="1.5"), protocol=2)]


@pytest.mark.parametrize("data", _odd_dumps(), ids=["one entry", "entries twice", "odd state", "version 1"])
def test_odd_layouts_read_the_same_by_both_readers(data: bytes):
    columns_agree("/odd/nccl_trace_rank_1", data)


def test_one_entry_without_later_times_has_its_creation_as_its_time_range():
    dump = _real()
    dump["entries"] = [
        {**dump["entries"][0], "time_discovered_started_ns": None, "time_discovered_completed_ns": None}  # type: ignore[index]
    ]
    made = columns_agree("/odd/nccl_trace_rank_1", pickle.dumps(dump, protocol=2))
    assert made is not None and len(made) == 1


@needs_c
def test_the_array_operations_are_the_same_in_c_and_python():
    ids = bytes(columns.array("I", [3, 1, 3, 0, 2, 1]))
    table = bytes(range(32))
    for width in (1, 4, 8):
        assert SPEEDUPS.gather(ids, table, width) == columns.gather_in_python(ids, table, width)
    assert SPEEDUPS.first_uses(ids) == columns.first_uses_in_python(ids) == [3, 1, 0, 2]
    assert SPEEDUPS.first_uses(b"") == columns.first_uses_in_python(b"") == []
    for gather in (SPEEDUPS.gather, columns.gather_in_python):  # an id past the table: an error in both
        with pytest.raises(ValueError, match="past the table"):
            gather(bytes(columns.array("I", [9])), table, 4)
        with pytest.raises(ValueError, match="a table of width 1 to 8"):
            gather(ids, table, 3)
    # a rank's ids remapped to the job's tables as it is merged in (each id's in the job's, as bytes)
    remap = bytes(columns.array("I", [5, 7, 9, 4]))
    for gather in (SPEEDUPS.gather, columns.gather_in_python):
        assert gather(ids, remap, 4) == bytes(columns.array("I", [4, 7, 4, 5, 9, 7]))


def _matched(job: object) -> list[tuple[object, ...]]:
    from fr2perfetto.match.ops import match_ops

    return [(op.group.name, op.seq, op.status, op.name, {r: [e.record_id for e in es] for r, es in op.entries.items()},
             op.created_ns, op.states, op.missing) for op in match_ops(job)]  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("sample", ["gloo/type_mismatch", "gloo/size_mismatch", "nccl/wrap"])
def test_the_matcher_gives_the_same_ops_whatever_tables_the_ranks_columns_index(sample: str):
    """Columns read together share one set of tables; a dump read on its own (from an archive) has its own,
    and one whose entries are held as a list (a JSON dump the live watch read) has none: the matcher
    moves them all into one set, so that equal ids mean equal values (else one rank's op could
    pass for another's, and a mismatch go unseen), and matches the same ops."""
    from fr2perfetto.read.job import load_job

    folder = str(ROOT / "samples" / sample)
    expected = _matched(load_job([folder], jobs=1))
    for rank in sorted(load_job([folder], jobs=1).dumps):
        job = load_job([folder], jobs=1)
        dump = job.dumps[rank]
        assert isinstance(dump.entries, columns.EntryRows) and dump.entries.tables is not None
        _, read = read_dump_columns(dump.path)
        other = columns.JobTables({})  # every value of every table at another id: the last first
        for name, values in dump.entries.tables.items():
            for value in reversed(values):
                other.ids[name][value] = len(other.values[name])
                other.values[name].append(value)
        other.fill(dump, columns.column_bytes(read), read.tables)  # its entries made from ids into those
        assert isinstance(dump.entries, columns.EntryRows) and dump.entries.tables is other.values
        assert _matched(job) == expected, rank
    job = load_job([folder], jobs=1)
    for dump in list(job.dumps.values())[:2]:
        dump.entries = list(dump.entries)  # held: their columns are made again from them
    assert _matched(job) == expected


def _read_as_load_job_reads(path: str) -> RankDump:
    """The dump at ``path`` with its entries made from its columns, as ``load_job`` gives it, whichever reader
    read it (``read_dump`` holds the entries the Python reader made where the C reader is not built)."""
    dump, read = read_dump_columns(path)
    columns.JobTables({}).fill(dump, columns.column_bytes(read), read.tables)
    return dump


@pytest.mark.parametrize("sample", ["nccl/pipeline_1f1b/nccl_trace_rank_1", "gloo/skip/gloo_trace_rank_2"])
@pytest.mark.parametrize("in_c", [True, False])
def test_entries_read_are_made_from_the_columns_as_they_are_asked_for(sample: str, in_c: bool):
    """A dump read holds its columns, not its entries: each entry is made when asked for, equal to the
    reference reader's, whether by index, slice, iteration either way or a field's distinct values."""
    path = str(ROOT / "samples" / sample)
    expected = read_dump_reference(path).entries
    with (
        mock.patch.object(columns, "_speedups", SPEEDUPS if in_c else None),
        mock.patch.object(columns.EntryRows, "CHUNK", 3),  # iterated a few rows at a time
    ):
        dump = _read_as_load_job_reads(path)
        entries = dump.entries
        assert isinstance(entries, columns.EntryRows) and len(entries) == len(expected) > 4
        assert dump.has_timing == ("nccl" in sample) == read_dump_reference(path).has_timing  # from columns
        assert list(entries) == expected and list(reversed(entries)) == expected[::-1]
        assert entries[0] == expected[0] and entries[-1] == expected[-1] and entries[0] is not entries[0]
        assert entries[1:4] == expected[1:4] and entries[-2:] == expected[-2:] and entries[::2] == expected[::2]
        assert entries.rows([3, 0, 3]) == [expected[3], expected[0], expected[3]]
        assert entries == expected and repr(entries) == repr(expected)
        fields = ("backend", "group_name", "op", "state", "frames", "collective_seq", "p2p_local", "time_created_ns",
                  "time_started_ns", "timeout_ms", "duration_ms")  # fmt: skip
        for field in fields:
            assert entries.distinct(field) == {getattr(e, field) for e in expected}, field
        # a column that holds one value in every row (its timeout, its thread) is held as that value, and
        # given as the bytes it was wherever a column is asked for
        reference = columns.column_bytes(columns.from_entries(dump.rank, expected))
        assert {"timeout_ms", "thread_id"} <= {Entry._fields[index] for index in entries._constant}
        asked = {"timeout": "timeout_ms", "thread": "thread_id", "created": "time_created_ns", "state": "state",
                 "completed": "time_completed_ns", "group": "group_name"}  # fmt: skip
        for name, field in asked.items():
            assert entries.column(field) == reference[name], name
        assert entries.kept_columns() == {name: reference[name] for name in columns.KEPT_COLUMNS}
        rows = [len(expected) - 1, 0, 2, 0]
        # read from a column where it is an integer one, else made
        for field in (*fields, "record_id", "time_completed_ns"):
            assert entries.values(field, rows) == [getattr(expected[row], field) for row in rows], field
        with pytest.raises(IndexError):
            entries.values("time_completed_ns", [len(expected)])
        # what a column holds, as it holds it (an index into STATES, NONE for None), a constant one's included
        assert [columns.STATES[i] for i in entries.raw_at("state", rows) or ()] == [expected[r].state for r in rows]
        for field in ("time_created_ns", "timeout_ms", "time_completed_ns", "collective_seq"):
            raw = entries.raw_at(field, rows) or ()
            assert [None if v == columns.NONE else v for v in raw] == [getattr(expected[r], field) for r in rows]
        assert entries.raw_at("duration_ms", rows) is None and entries.raw_at("p2p_local", rows) is None
        with pytest.raises(IndexError):
            entries.raw_at("state", [len(expected)])
        none = columns.from_entries(0, [])  # a rank without entries: nothing asked, nothing given
        held = columns.EntryRows(0, columns.entry_sources(0, columns.column_bytes(none), none.tables))
        assert entries.values("time_completed_ns", []) == [] == held.values("record_id", [])
        for seq in {e.collective_seq for e in expected} | {-1, 10**6}:
            assert entries.rows_with("collective_seq", seq) == [
                row for row, e in enumerate(expected) if e.collective_seq == seq
            ]
        with pytest.raises(IndexError):
            entries[len(expected)]
        with pytest.raises(IndexError):
            entries.rows([len(expected)])


@pytest.mark.parametrize("sample", ["nccl/demo/nccl_trace_rank_0", "nccl/wrap/nccl_trace_rank_1"])
def test_a_collective_is_found_in_a_ranks_columns_as_in_its_entries(sample: str):
    """Where a rank's streams part (``diagnose.streams``), each member's anchor op is found from its seq
    column, the first run of rows of that group and seq (a coalesced group's last; the demo has three):
    as a walk finds it."""
    from fr2perfetto.diagnose.streams import _anchor

    entries = _read_as_load_job_reads(str(ROOT / "samples" / sample)).entries
    assert isinstance(entries, columns.EntryRows)
    held = list(entries)
    asked = {(e.group_name, e.collective_seq) for e in held} | {("0", -5), ("no such group", 1)}
    found = {key: _anchor(entries, *key) for key in asked}
    assert found == {key: _anchor(held, *key) for key in asked}
    assert sum(row is not None for row in found.values()) >= 5


def test_a_send_and_its_recv_are_held_as_rows_and_are_the_entries_paired():
    """Sends and recvs matched to their other ends are held by their rows, as collectives are (the entries
    made to pair them are let go); each rank's part is that rank's own send or recv, and the peers it names
    are the op's."""
    from fr2perfetto.base.model import EntriesByRank
    from fr2perfetto.match.ops import match_ops
    from fr2perfetto.read.job import load_job

    job = load_job([str(ROOT / "samples" / "nccl" / "pipeline_1f1b")], jobs=1)
    p2p = [op for op in match_ops(job) if op.kind == "p2p"]
    assert len(p2p) >= 100 and all(isinstance(op.entries, EntriesByRank) for op in p2p)
    for op in p2p:
        assert set(op.entries) | set(op.missing) | set(op.unknown) == set(op.peers)
        for rank, entries in op.entries.items():
            assert [(e.rank, e.is_p2p) for e in entries] == [(rank, True)] * len(entries)
            assert entries[0].op in (("send", "isend") if rank == op.peers[0] else ("recv", "irecv"))


@pytest.mark.parametrize(
    "sample", ["nccl/demo", "nccl/wrap", "nccl/stuck", "nccl/pipeline_stage_stopped", "gloo/size_mismatch", "gloo/skip"]
)
def test_an_op_settled_as_it_is_filed_is_what_classifying_it_says(sample: str):
    """An op every member issued alike and completed is settled as the matcher files it, unclassified: its
    status and name are what ``classify`` and the majority say of it. Only the ops that are not OK reach
    the rules that look for a cause (``Evidence.unsettled``)."""
    from dataclasses import replace

    from fr2perfetto.base.model import OK, majority_op
    from fr2perfetto.diagnose.evidence import gather_evidence
    from fr2perfetto.match.ops import classify, match_ops
    from fr2perfetto.read.job import load_job

    job = load_job([str(ROOT / "samples" / sample)], jobs=1)
    ops = match_ops(job)
    for op in ops:
        again = replace(op, status=OK, mismatch="", mismatch_ranks=())
        classify(again)
        assert (again.status, again.mismatch, again.mismatch_ranks) == (op.status, op.mismatch, op.mismatch_ranks)
        assert op.name == majority_op(op.entries), op.title
    unsettled = gather_evidence(job, ops).unsettled
    assert unsettled == [op for op in ops if op.status != OK]
    assert 0 < len(unsettled) < len(ops)


@pytest.mark.parametrize("sample", ["nccl/demo", "nccl/pipeline_batched"])
def test_linked_ranks_keep_their_columns_and_give_the_entries_linking_makes(sample: str):
    """A rank whose coalesced groups are linked keeps its columns (``LinkedRows``) and gives, entry for
    entry, what linking makes of its entries held as a list; the ops of a group made together point at
    one closing entry, made apart at equal ones, and none is held; and linking again gives the same."""
    from fr2perfetto.match.coalesce import link_coalesced
    from fr2perfetto.read.job import load_job

    linked, held = load_job([str(ROOT / "samples" / sample)]), load_job([str(ROOT / "samples" / sample)])
    for dump in held.dumps.values():
        dump.entries = list(dump.entries)
    link_coalesced(linked)
    link_coalesced(held)
    kinds = {type(dump.entries).__name__ for dump in linked.dumps.values()}
    assert "LinkedRows" in kinds and "list" not in kinds
    for rank, dump in linked.dumps.items():
        assert list(dump.entries) == held.dumps[rank].entries
        inner = [row for row, entry in enumerate(dump.entries) if entry.closed_by is not None]
        if isinstance(dump.entries, columns.LinkedRows):
            assert inner
            together, apart = dump.entries.rows(inner), dump.entries.rows(inner)
            assert [a.closed_by for a in together] == [b.closed_by for b in apart]
            closings = {id(entry.closed_by) for entry in together}
            assert len(closings) == len({entry.closed_by.record_id for entry in together}) < len(inner)
            assert _entries_held(dump.entries) == 0
    again = [list(dump.entries) for dump in linked.dumps.values()]
    link_coalesced(linked)
    assert [list(dump.entries) for dump in linked.dumps.values()] == again


def test_a_coalesced_group_the_buffer_cut_is_set_aside_alike_from_columns(tmp_path):
    """A coalesced group that holds the buffer's first entry (the ring buffer may have dropped its first ops)
    is set aside, its ops and closing entry p2p and closed by nothing, alike where a rank's entries are
    linked from its columns and where they are held as a list."""
    from fr2perfetto.match.coalesce import link_coalesced
    from fr2perfetto.read.job import load_job

    cut = []  # the ranks whose buffer now starts with a coalesced group of collectives
    for path in sorted((ROOT / "samples" / "nccl" / "demo").iterdir()):
        with open(path, "rb") as file:
            dump = pickle.load(file)
        entries = dump["entries"]
        closings = [row for row, entry in enumerate(entries) if entry["profiling_name"] == "nccl:coalesced"]
        first = closings[0] if closings else 0
        while first and entries[first - 1]["state"] == "scheduled":
            first -= 1  # its ops: recorded just before it, without events (scheduled for ever)
        if closings and not entries[first]["is_p2p"]:
            cut.append(int(path.name.rsplit("_", 1)[1]))
        (tmp_path / path.name).write_bytes(pickle.dumps({**dump, "entries": entries[first:]}, protocol=2))
    linked, held = load_job([str(tmp_path)]), load_job([str(tmp_path)])
    for dump in held.dumps.values():
        dump.entries = list(dump.entries)
    link_coalesced(linked)
    link_coalesced(held)
    assert len(cut) >= 3
    for rank, dump in linked.dumps.items():
        assert list(dump.entries) == held.dumps[rank].entries
        if rank in cut:
            assert isinstance(dump.entries, columns.LinkedRows)
            group = list(dump.entries)[: 1 + next(row for row, e in enumerate(dump.entries) if e.op == "coalesced")]
            assert len(group) > 1 and all(e.is_p2p and e.p2p_local is None and e.closed_by is None for e in group)


def _entries_held(held: object) -> int:
    """How many ``Entry`` objects ``held`` reaches (what it keeps alive)."""
    import gc

    from fr2perfetto.base.model import Entry

    seen, todo, count = {id(held)}, [held], 0
    while todo:
        for child in gc.get_referents(todo.pop()):
            if id(child) not in seen and not isinstance(child, (str, bytes, int, float, type)):
                seen.add(id(child))
                todo.append(child)
                count += type(child) is Entry
    return count


def _kept_values(kept: dict[str, bytes] | None, tables: columns.Tables | None) -> dict[str, list[object]]:
    """The matcher's columns (``KEPT_COLUMNS``) as the values they stand for: ids looked up in ``tables``."""
    assert kept is not None and tables is not None
    values: dict[str, list[object]] = {}
    for name in columns.KEPT_COLUMNS:
        column = array(columns.TYPES[name], kept[name]).tolist()
        table = columns.ID_COLUMNS.get(name)
        values[name] = [tables[table][value] for value in column] if table else column
    return values


def test_the_matcher_reads_a_linked_rank_as_the_entries_linking_makes():
    """The columns the matcher files a linked rank's ops by are its columns as read, but for what linking
    changed (a batch's closing entry made a send or recv): value for value, those of its linked entries."""
    from fr2perfetto.match.coalesce import link_coalesced
    from fr2perfetto.read.job import load_job

    job = load_job([str(ROOT / "samples" / "nccl" / "pipeline_batched")])
    link_coalesced(job)
    changed = 0
    for rank, dump in job.dumps.items():
        if not isinstance(dump.entries, columns.LinkedRows):
            continue
        made = columns.from_entries(rank, list(dump.entries), columns.KEPT_COLUMNS)
        kept = _kept_values(dump.entries.kept_columns(), dump.entries.base.tables)
        assert kept == _kept_values(columns.column_bytes(made), made.tables)
        changed += kept != _kept_values(dump.entries.base.kept_columns(), dump.entries.base.tables)
    assert changed


def _transfers(job: object) -> list[tuple[object, ...]]:
    """Every field of each send's and recv's op that a rule or the trace reads; its entries as made."""
    from fr2perfetto.match.ops import match_ops

    return [
        (op.op_key, op.group.name, op.seq, op.peers, op.status, op.mismatch, op.name, op.first_time_ns, op.in_batch,
         tuple(op.states), op.missing, op.unknown, type(op.entries).__name__, list(op.entries.items()))
        for op in match_ops(job)  # type: ignore[arg-type]
        if op.kind == "p2p"
    ]  # fmt: skip


def _mismatched_transfers(out: str) -> str:
    """Rank 0 sends rank 1 three tensors: the second recv is twice its send's size, the third of another
    dtype. NCCL moves the bytes regardless; the sizes and dtypes the entries record differ."""
    if str(ROOT / "samples") not in sys.path:
        sys.path.insert(0, str(ROOT / "samples"))
    import nccl_sim as sim

    sends = [sim.p2p("send", "0", 1, 64), sim.p2p("send", "0", 1, 64), sim.p2p("send", "0", 1, 64)]
    recvs = [sim.p2p("recv", "0", 0, 64), sim.p2p("recv", "0", 0, 128), sim.p2p("recv", "0", 0, 64, dtype="Float")]
    job = sim.SimJob({"0": ("default_pg", (0, 1))}, {0: sends, 1: recvs})
    sim.write_dumps(sim.dump_documents(job, sim.simulate(job), sim.DumpOptions()), out)
    return out


def _wrapped(sample: str, out: Path) -> str:
    """A pipeline sample's dumps as ring buffers that wrapped, each rank's at another point: the oldest
    transfers of a pair are held by one of its ranks only."""
    for path in sorted((ROOT / "samples" / sample).iterdir()):
        with open(path, "rb") as file:
            dump = pickle.load(file)
        dropped = 3 + 7 * int(path.name.rsplit("_", 1)[1]) % 23
        (out / path.name).write_bytes(pickle.dumps({**dump, "entries": dump["entries"][dropped:]}, protocol=2))
    return str(out)


@pytest.mark.parametrize(
    "sample",
    ["nccl/demo", "nccl/pipeline_1f1b", "nccl/pipeline_batched", "nccl/pipeline_stage_stopped",
     "nccl/send_without_recv", "mismatched", "wrapped nccl/pipeline_1f1b", "wrapped nccl/pipeline_batched"],
)  # fmt: skip
def test_transfers_settled_from_columns_are_the_ops_their_entries_make(sample: str, tmp_path):
    """A send and its recv that each completed, alike, are settled from their ranks' columns with no entry
    made (``pairs.Settled``): the ops are those that pairing the entries makes, field for field, in a
    pipeline's healthy, batched and stopped runs, and where buffers wrapped (a transfer one rank's buffer holds
    the end of, the other's no longer: OK, the other unknown); a size or dtype that differs is no such op."""
    from fr2perfetto.match import pairs
    from fr2perfetto.read.job import load_job

    if sample.startswith("wrapped "):
        folder = _wrapped(sample.split()[1], tmp_path)
    else:
        folder = _mismatched_transfers(str(tmp_path)) if sample == "mismatched" else str(ROOT / "samples" / sample)
    settled: list[int] = []
    settle = pairs._settle

    def counted(*args: object) -> pairs.Settled | None:
        made = settle(*args)  # type: ignore[arg-type]
        settled.extend(made.indices if made is not None else ())
        return made

    with mock.patch.object(pairs, "_settle", counted):
        from_columns = _transfers(load_job([folder], jobs=1))
    with mock.patch.object(pairs, "_settle", lambda *args: None):
        from_entries = _transfers(load_job([folder], jobs=1))
    assert from_columns == from_entries
    statuses = [op[4] for op in from_columns]
    if sample == "mismatched":
        assert settled == [1] and [op[4:6] for op in from_columns] == [("ok", ""), ("mismatch", "size"),
                                                                       ("mismatch", "dtype")]  # fmt: skip
    else:  # those that are not are judged from their entries (a stopped stage's, a send never received)
        assert len(settled) == statuses.count("ok") > 0
    if sample.startswith("wrapped "):  # one end held, the other older than its rank's buffer: OK, unknown
        assert sum(1 for op in from_columns if op[4] == "ok" and op[11]) >= 8


def test_redacting_columns_gives_the_placeholders_that_redacting_every_entry_gives():
    """Redaction makes a rank's entries, where they are made from columns, only at the rows where a value
    first appears, and then redacts the job's tables once. Each value gets the placeholder that redacting
    every entry in turn gives it: values are met rank by rank, entry by entry and field by field, not column
    by column nor in the tables' order. The entries stay made from columns, and a value of the tables that
    no dump of the job holds (one left out after it was read) is shown as nothing."""
    from fr2perfetto.base.model import Frame, group_counts
    from fr2perfetto.read.redact import Redactor, redact_dumps

    from .helpers import make_entry

    def stack(name: str) -> tuple[Frame, ...]:
        return (Frame(name, f"/home/alice/{name}.py", 3),)

    read = {  # in the order their tables are merged: rank 1's values take the first ids
        1: [make_entry(rank=1, group_name="trainers", thread_name="worker", op="fused_x", output_dtypes=("Fancy",)),
            make_entry(rank=1, group_name="trainers", input_dtypes=("Odd",), frames=stack("step"))],
        0: [make_entry(group_desc="mine", thread_id="main_t", input_dtypes=("Odd",), output_dtypes=("Weird",)),
            make_entry(input_dtypes=("Strange",), frames=stack("loss"), backend="mybackend")],
        3: [make_entry(rank=3, group_desc="mine", thread_id="main_t", input_dtypes=("Odd",), output_dtypes=("Weird",),
                       record_id=row) for row in range(500)],
        2: [make_entry(rank=2, group_name="secret_group", op="secret_op")],  # read, then left out of the job
    }  # fmt: skip

    def job(from_columns: bool) -> tuple[dict[int, RankDump], columns.Tables]:
        tables, dumps = columns.JobTables({}), {}
        for rank, entries in read.items():
            dump = dumps[rank] = RankDump(rank, f"/data/nccl_trace_rank_{rank}", None, "2.10", "pickle", "",
                                          list(entries), {}, group_counts=group_counts(entries))  # fmt: skip
            if from_columns:
                made = columns.from_entries(rank, entries)
                tables.fill(dump, columns.column_bytes(made), made.tables)
        del dumps[2]
        return dumps, tables.values

    held, _ = job(False)
    made, tables = job(True)
    given, asked = [], []
    real_rows = columns.EntryRows.rows
    with mock.patch.object(columns.EntryRows, "rows", lambda self, rows: asked.extend(rows) or real_rows(self, rows)):
        for dumps in (held, made):
            redactor = Redactor()
            redact_dumps(dumps, [], redactor=redactor)
            given.append(list(redactor._given.items()))
    assert given[0] == given[1]
    assert [value for (kind, value), _ in given[1] if kind == "dtype"] == ["Odd", "Weird", "Strange", "Fancy"]
    assert not any("secret" in value for (_, value), _ in given[1])  # no placeholder given to what is not shown
    assert len(asked) == 4  # rank 0's two rows, rank 1's two, none of rank 3's
    for rank, dump in made.items():
        assert isinstance(dump.entries, columns.EntryRows) and dump.entries.tables is not tables
        assert list(dump.entries) == held[rank].entries and dump.group_counts == held[rank].group_counts
    shown = made[0].entries.tables
    assert "secret" in repr(tables) and "secret" not in repr(shown) and "alice" not in repr(shown)
