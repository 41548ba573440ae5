"""The C speed-ups give exactly what their Python twins give, on every path through them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pickle
import shlex
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

import fr2perfetto
from fr2perfetto.base.model import EntriesByRank, Entry
from fr2perfetto.base.speedups import SPEEDUPS
from fr2perfetto.layout import rows, streams
from fr2perfetto.match import ops as match
from fr2perfetto.read import columns, reader
from fr2perfetto.render import perfetto as perfetto_writer

from .conftest import run_cli
from .helpers import NOW
from .helpers import make_entry as _entry
from .tracecheck import read_trace

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def test_the_speedups_are_built():
    # `make test` installs with a C compiler at hand; without one fr2perfetto still works, slower.
    for module in (reader, match, rows, streams, perfetto_writer):
        assert module._speedups is not None, "fr2perfetto._speedups was not built (no C compiler?)"


def _without_speedups(patch: pytest.MonkeyPatch) -> None:
    for module in (reader, match, rows, streams, perfetto_writer):
        patch.setattr(module, "_speedups", None)


def _convert(folder: Path, out: Path, monkeypatch: pytest.MonkeyPatch, pure: bool) -> tuple[bytes, str]:
    """The trace's bytes and the JSON report, with or without the C speed-ups (read in two processes)."""
    with monkeypatch.context() as patch:
        if pure:
            _without_speedups(patch)
        code, _, stderr = run_cli("convert", str(folder), "-o", str(out), "-j", "2", "-q", "--full")
        assert code == 0, stderr
        _, report, _ = run_cli("analyze", str(folder), "--json", "-j", "2")
    return out.read_bytes(), report


@pytest.mark.parametrize(
    "sample", ["gloo/skip", "gloo/deadlock", "nccl/demo", "nccl/straggler", "nccl/wrap", "nccl/send_without_recv"]
)
def test_samples_read_match_and_convert_the_same_with_and_without_speedups(
    sample: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fast_trace, fast_report = _convert(SAMPLES / sample, tmp_path / "fast.pftrace", monkeypatch, pure=False)
    pure_trace, pure_report = _convert(SAMPLES / sample, tmp_path / "pure.pftrace", monkeypatch, pure=True)
    assert fast_trace == pure_trace
    assert fast_report == pure_report and json.loads(fast_report)["findings"]
    trace = read_trace(str(tmp_path / "fast.pftrace"))
    assert len(trace.all_slices()) >= 5 and trace.flows


def test_the_c_reader_reads_a_dump_pytorch_wrote_without_the_python_reader(monkeypatch: pytest.MonkeyPatch):
    if reader._speedups is None:
        pytest.skip("built without the C speed-ups")
    calls = []
    python_reader = reader.read_dump_reference
    monkeypatch.setattr(reader, "read_dump_reference", lambda *args: calls.append(1) or python_reader(*args))
    dump = reader.read_dump(str(SAMPLES / "nccl" / "straggler" / "nccl_trace_rank_0"))
    assert len(dump.entries) == 30 and calls == []
    reader.read_dump(str(SAMPLES / "nccl" / "mixed_formats" / "nccl_trace_rank_1.json"))  # JSON: Python's to read
    assert calls == [1]


def test_entries_that_repeat_many_kinds_read_the_same_in_c_and_python(monkeypatch: pytest.MonkeyPatch):
    # More sizes, dtypes, stacks and shapes in turn than the C reader keeps as recent keys, some of
    # them equal in value but not in type or container (as a dict lookup sees them), and per-entry
    # lists of shared frame dicts, as PyTorch writes stacks.
    raw = pickle.loads((SAMPLES / "nccl" / "demo" / "nccl_trace_rank_0").read_bytes())
    template, frames = raw["entries"][0], raw["entries"][0]["frames"]
    kinds = [
        ([[4096]], ["Float"], frames[:2], "completed"),
        (((4096,),), ("Float",), frames[:3], "completed"),
        ([[4096, 2]], ["BFloat16"], frames[1:], "started"),
        ([[1], [2]], ["Float", "Half"], [], "scheduled"),
        ([[True]], ["Float"], frames[:2], "completed"),  # True == 1 to a dict
        ([[1]], ["Float"], frames[2:], "completed"),
        ([[4096]], ["Float"], frames[:2], "completed"),
    ]
    entries = []
    for n in range(40):
        sizes, dtypes, stack, state = kinds[n * 5 % len(kinds)]
        entry = dict(template, record_id=n, op_id=n, collective_seq_id=n + 1, input_sizes=sizes, state=state)
        entry.update(output_sizes=sizes, input_dtypes=dtypes, frames=list(stack), retired=n % 3 == 0)
        entries.append(entry)
    data = pickle.dumps(dict(raw, entries=entries))
    made_in_c = reader.read_dump("nccl_trace_rank_0", data)
    with monkeypatch.context() as patch:
        patch.setattr(reader, "_speedups", None)
        made_in_python = reader.read_dump("nccl_trace_rank_0", data)
    assert made_in_c.entries == made_in_python.entries and len(made_in_c.entries) == 40
    for fast, pure in zip(made_in_c.entries, made_in_python.entries, strict=True):
        assert [type(v) for v in fast] == [type(v) for v in pure]
        assert [type(d) for s in fast.input_sizes for d in s] == [type(d) for s in pure.input_sizes for d in s]
    assert {e.input_sizes for e in made_in_c.entries} >= {((4096,),), ((4096, 2),), ((1,), (2,))}


def test_an_environment_variable_turns_the_speedups_off_and_version_says_so():
    for value, says in (
        ("1", "(C speed-ups off: pure Python, as FR2PERFETTO_NO_SPEEDUPS asks)"),
        ("0", "(C speed-ups on)"),
    ):
        env = dict(os.environ, FR2PERFETTO_NO_SPEEDUPS=value)
        command = [sys.executable, "-m", "fr2perfetto", "--version"]
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        assert result.stdout.strip().endswith(says), result.stdout


def test_version_says_why_the_speedups_were_not_built_and_the_command_that_builds_them():
    # An install without a C compiler leaves no module file: here one that cannot be found, as then.
    script = (
        "import sys; sys.modules['fr2perfetto._speedups'] = None; sys.argv = ['fr2perfetto', '--version']; "
        "from fr2perfetto.cli import main; main()"
    )
    env = dict(os.environ, FR2PERFETTO_NO_SPEEDUPS="0", COLUMNS="80")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    first, why, command = result.stdout.splitlines()
    assert first.endswith("(C speed-ups off: not built when fr2perfetto was installed)"), first
    assert "C compiler" in why and "cached" in why
    parts = shlex.split(command)
    assert parts[:7] == [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir"]
    origin = json.loads(importlib.metadata.distribution("fr2perfetto").read_text("direct_url.json") or "{}")
    if origin.get("dir_info", {}).get("editable"):
        # installed from this clone (editable, by `make install-test`): built from it again, into this Python
        editable, folder = parts[7:]
        assert editable == "-e" and Path(folder).resolve() == SAMPLES.parent.resolve()
    else:  # the wheel `make dist` made, tested installed: the index's sdist
        assert parts[7:] == ["--no-binary", "fr2perfetto", f"fr2perfetto=={fr2perfetto.__version__}"]


@pytest.mark.parametrize(
    ("direct_url", "source"),
    [
        (None, ["--no-binary", "fr2perfetto", "fr2perfetto=={version}"]),  # from the package index
        ({"url": "file:///opt/src/fr%2Bp", "dir_info": {}}, ["/opt/src/fr+p"]),
        (
            {"url": "https://example.org/fr.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
            ["git+https://example.org/fr.git@abc123"],
        ),
        (
            {"url": "https://example.org/fr2perfetto-0.1.0.tar.gz", "archive_info": {}},
            ["https://example.org/fr2perfetto-0.1.0.tar.gz"],
        ),
        # a wheel it came from is the one built without them: the index's sdist
        (
            {"url": "file:///tmp/fr2perfetto-0.1.0-py3-none-any.whl", "archive_info": {}},
            ["--no-binary", "fr2perfetto", "fr2perfetto=={version}"],
        ),
    ],
)
def test_the_command_that_builds_the_speedups_installs_from_where_fr2perfetto_came(
    monkeypatch: pytest.MonkeyPatch, direct_url: dict[str, object] | None, source: list[str]
):
    import importlib.metadata

    from fr2perfetto import __version__, cli

    class Installed:
        def read_text(self, name: str) -> str | None:
            return json.dumps(direct_url) if name == "direct_url.json" and direct_url is not None else None

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Installed())
    command = shlex.split(cli._rebuild_command())
    assert command[:7] == [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir"]
    assert command[7:] == [part.format(version=__version__) for part in source]


def test_entries_are_made_from_columns_the_same_in_c_and_python():
    assert SPEEDUPS is not None
    rows = [_entry(op_id=n, record_id=n, time_created_ns=NOW + n, timeout_ms=None if n == 3 else 600_000)
            for n in range(5)]  # fmt: skip
    made = columns.from_entries(0, rows)
    ints: dict[int, int] = {}
    made_in_c = columns.to_entries(made, SPEEDUPS.entries_from_columns, {}, ints)
    made_in_python = columns.to_entries(made, columns.entries_in_python, {}, {})
    assert repr(made_in_c) == repr(made_in_python) == repr(rows) and [e.op_id for e in made_in_c] == [0, 1, 2, 3, 4]
    assert all(type(e) is Entry for e in made_in_c) and made_in_c[3].timeout_ms is None
    assert made_in_c[0].timeout_ms is made_in_c[4].timeout_ms is ints[600_000]  # one object per value
    assert SPEEDUPS.entries_from_columns(Entry, 0, []) == []
    for sources, error in (
        ([("I", b"\x09\x00\x00\x00", ["only"])], IndexError),  # an id beyond its table
        ([("q", b"\x00" * 7, None)], ValueError),  # a column of another length
        ([("x", None, None)], ValueError),
        ([("0", b"\x00\x00\x00\x00", ["not a pair"])], ValueError),
        ([("q", b"\x00" * 8, [])], ValueError),  # shared ints through something not a dict
    ):
        with pytest.raises(error):
            SPEEDUPS.entries_from_columns(Entry, 1, sources)


def test_entries_are_made_at_rows_the_same_in_c_and_python():
    assert SPEEDUPS is not None
    rows = [_entry(op_id=n, record_id=n, time_created_ns=NOW + n) for n in range(5)]
    made = columns.from_entries(0, rows)
    sources = columns.entry_sources(0, columns.column_bytes(made), made.tables)
    wanted = array("I", [4, 0, 2, 2]).tobytes()
    in_c = SPEEDUPS.entries_from_columns(Entry, 5, sources, wanted)
    assert in_c == columns.entries_in_python(Entry, 5, sources, wanted) == [rows[4], rows[0], rows[2], rows[2]]
    assert SPEEDUPS.entries_from_columns(Entry, 5, sources, b"") == columns.entries_in_python(Entry, 5, sources, b"")
    assert SPEEDUPS.entries_from_columns(Entry, 5, sources, None) == rows
    for make in (SPEEDUPS.entries_from_columns, columns.entries_in_python):
        with pytest.raises(IndexError):  # a row beyond the columns
            make(Entry, 5, sources, array("I", [1, 5]).tobytes())
    with pytest.raises(ValueError):
        SPEEDUPS.entries_from_columns(Entry, 5, sources, b"\x00")  # not whole uint32s


def _match_inputs() -> tuple[dict[int, list[Entry]], list[match.RankInput], bytes, bytes]:
    """Three ranks' inputs to the collective matcher: ops every rank issued alike, one whose sizes
    differ, a coalesced group (two rows of one rank for one op), a row inside a coalesced group, a gloo
    op left scheduled, a send, seqs out of order and a negative one, and a group only one rank knows."""
    entries = {
        0: [_entry(rank=0, collective_seq=1), _entry(rank=0, collective_seq=2, time_created_ns=NOW + 5),
            _entry(rank=0, collective_seq=3), _entry(rank=0, collective_seq=3), _entry(rank=0, is_p2p=True),
            _entry(rank=0, collective_seq=5, state="scheduled", backend="gloo"), _entry(rank=0, collective_seq=-1)],
        1: [_entry(rank=1, collective_seq=2, time_created_ns=NOW - 5), _entry(rank=1, collective_seq=1),
            _entry(rank=1, collective_seq=3, input_sizes=((8,),)), _entry(rank=1, collective_seq=5, state="started",
            backend="gloo"), _entry(rank=1, collective_seq=4)],
        2: [_entry(rank=2, collective_seq=1, state="scheduled"), _entry(rank=2, collective_seq=2, op="broadcast"),
            _entry(rank=2, group_name="1", collective_seq=9)],
    }  # fmt: skip
    tables = columns.JobTables({})
    made = {}
    for rank, held in entries.items():
        read = columns.from_entries(rank, held)
        made[rank] = tables.merged_bytes(columns.column_bytes(read), read.tables)
    names: dict[str, int] = {}
    op_names = array("I", [names.setdefault(op, len(names)) for _, op in tables.values["ops"]]).tobytes()
    untracked = bytes(backend == "gloo" for backend, _ in tables.values["ops"])
    group_index = {("0", "default_pg"): 0, ("1", "default_pg"): 1}
    inputs: list[match.RankInput] = []
    for rank, c in made.items():
        groups = array("I", [group_index[tables.values["groups"][g]] for g in array("I", c["group"])]).tobytes()
        flagged = bytes([0, 0, 0, 0, 0, 1, 0]) if rank == 0 else None  # rank 0's gloo op: in a coalesced group
        inputs.append((rank, len(entries[rank]), groups, c["collective_seq"], c["op"], c["input_sizes"],
                       c["input_dtypes"], c["state"], c["created"], c["is_p2p"], flagged))  # fmt: skip
    return entries, inputs, op_names, untracked


def test_collectives_are_matched_from_columns_the_same_in_c_and_python():
    assert SPEEDUPS is not None
    entries, inputs, op_names, untracked = _match_inputs()
    fixed = (columns.STATES, 2, 0)
    members = [array("i", [0, 1, 2]).tobytes(), None]
    in_c = SPEEDUPS.match_collectives(inputs, members, op_names, untracked, *fixed)
    in_python = match._match_collectives_in_python(inputs, members, op_names, untracked, *fixed)
    assert repr(in_c) == repr(in_python)
    filed, spans, p2p = in_c
    by_op = {
        (group, seq): ((list(array("i", ranks)), list(array("I", rows))), scanned)
        for group, seq, ranks, rows, scanned in filed
    }
    assert [(group, seq) for group, seq, *_ in filed] == [(0, 1), (0, 2), (0, 3), (0, 5), (0, -1), (0, 4), (1, 9)]
    assert by_op[(0, 1)][0] == ([0, 1, 2], [0, 1, 0])  # the ranks of its rows, and the rows
    times = array("q", [NOW, NOW, NOW]).tobytes()
    assert by_op[(0, 1)][1] == (NOW, True, 1, times, ["completed", "completed", "scheduled"], 0)  # 0: all_reduce
    assert by_op[(0, 2)][1][:3] == (NOW - 5, False, 0)  # rank 2's broadcast: not alike; rank 1 first
    assert by_op[(0, 2)][1][4] is None  # every rank completed it: no state is listed
    for filed_by in (filed, in_python[0]):  # an op on every member shares the members given, in C and Python
        assert [(group, seq) for group, seq, ranks, *_ in filed_by if ranks is members[0]] == [(0, 1), (0, 2)]
    assert by_op[(0, 3)] == (([0, 0, 1], [2, 3, 2]), None)  # a coalesced group: scanned from entries
    assert by_op[(0, 5)] == (([0, 1], [5, 3]), None)  # a row inside a coalesced group
    assert spans == [(0, 0, -1, 5), (1, 0, 1, 5), (2, 0, 1, 2), (2, 1, 9, 9)]
    assert [list(array("I", sent)) for sent in p2p] == [[4], [], []]  # the rows of sends and recvs
    coalesced = EntriesByRank(entries, *(array(kind, part) for kind, part in zip("iI", filed[2][2:4], strict=True)))
    assert list(coalesced) == [0, 1] and len(coalesced) == 2 and 2 not in coalesced
    assert coalesced[0][0] is entries[0][2] and coalesced[0][1] is entries[0][3]  # the entries, not copies
    assert coalesced.items() == [(0, entries[0][2:4]), (1, [entries[1][2]])]
    no_group = [(*inputs[2][:2], array("I", [0, 0, 7]).tobytes(), *inputs[2][3:])]
    for bad, error in (
        ([(*inputs[0][:3], b"\x00" * 8, *inputs[0][4:])], ValueError),  # a column of another length
        (no_group, ValueError),
        ([inputs[0][:5]], TypeError),
    ):
        with pytest.raises(error):
            SPEEDUPS.match_collectives(bad, members, op_names, untracked, *fixed)
    with pytest.raises(ValueError, match="no group known"):
        match._match_collectives_in_python(no_group, members, op_names, untracked, *fixed)
