"""Reading dumps: file names, formats, versions, and every way a file can be bad."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from fr2perfetto.base.model import group_counts, time_range
from fr2perfetto.layout.timeline import time_span
from fr2perfetto.read.files import parse_dump_name
from fr2perfetto.read.job import build_job, load_job
from fr2perfetto.read.reader import DumpError, read_dump

from .conftest import nccl_layout, run_cli
from .tracecheck import read_trace


@pytest.mark.parametrize(
    ("name", "rank", "host"),
    [
        ("nccl_trace_rank_7", 7, None),
        ("trace_7", 7, None),
        ("rank_7", 7, None),
        ("gloo_trace_rank_7.json", 7, None),
        ("comm_lib_trace_rank_12.pkl", 12, None),
        ("nccl_trace_rank_node02_7", 7, "node02"),
        ("nccl_trace_rank_gpu-node-3.cluster_15", 15, "gpu-node-3.cluster"),
        ("dump-3", 3, None),
    ],
)
def test_rank_and_host_from_file_name(name: str, rank: int, host: str | None):
    parsed = parse_dump_name(f"/some/dir/{name}")
    assert parsed is not None and (parsed.rank, parsed.host) == (rank, host)


def test_name_without_rank_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "dump.pkl"
    path.write_bytes(pickle.dumps({"version": "2.10"}, protocol=2))
    with pytest.raises(DumpError, match="cannot tell the rank"):
        read_dump(str(path))


class Payload:
    """A pickle that, if loaded by a plain unpickler, creates a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_pickle_with_code_is_refused_and_never_runs(tmp_path: Path):
    marker = tmp_path / "payload-ran"
    dump = {"version": "2.10", "pg_config": {}, "entries": [Payload(str(marker))]}
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    with pytest.raises(DumpError, match=r"refused: the pickle asks for (posix|os)\.mkdir"):
        read_dump(str(path))
    assert not marker.exists()
    # and through the CLI: one line, the file named, exit 2, no traceback, payload never ran
    code, _, stderr = run_cli("convert", str(path), "-o", str(tmp_path / "t.pftrace"))
    assert code == 2 and not marker.exists()
    assert str(path) in stderr and "refused" in stderr and "Traceback" not in stderr


def test_pickle_asking_for_gigabytes_is_refused_at_once(tmp_path: Path):
    # an empty dict, then LONG_BINPUT at index 2**31 - 1: the unpickler would clear a 16 GB memo table
    path = tmp_path / "rank_0"
    path.write_bytes(b"\x80\x02}r\xff\xff\xff\x7f.")
    with pytest.raises(DumpError, match="memo index too large"):  # seen before anything is built
        read_dump(str(path))


def _good_dump(tmp_path: Path) -> list[str]:
    return nccl_layout.write_scenario("stuck", str(tmp_path / "good"))


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty file"),
        (b"hello, world\n", "not a Flight Recorder dump"),
        (b"[1, 2, 3]", "not a Flight Recorder dump"),
        (json.dumps({"version": "9.1", "entries": []}).encode(), "unknown dump version 9.1"),
        (json.dumps({"entries": []}).encode(), "no 'version' key"),
        (pickle.dumps([1, 2], protocol=2), "top level is a list"),
        ("truncate", "truncated or corrupt pickle"),
        (b'{"version": "2.10", "entries": [', "truncated or corrupt JSON"),
    ],
)
def test_bad_files_get_one_line_each_and_the_rest_still_converts(tmp_path: Path, content, reason):
    good = _good_dump(tmp_path)
    bad = tmp_path / "good" / "nccl_trace_rank_9"
    if content == "truncate":
        content = Path(good[0]).read_bytes()[:-200]
    bad.write_bytes(content)
    out = tmp_path / "t.pftrace"
    code, _, stderr = run_cli("convert", str(tmp_path / "good"), "-o", str(out))
    assert code == 0
    lines = [line for line in stderr.splitlines() if "nccl_trace_rank_9" in line]
    assert len(lines) == 1 and reason in lines[0], stderr
    assert "Traceback" not in stderr
    assert len(read_trace(str(out)).processes) == 4  # the four good ranks (rank 9 is not a member)


def test_nothing_readable_exits_2_and_writes_no_trace(tmp_path: Path):
    (tmp_path / "rank_0").write_bytes(b"")
    out = tmp_path / "t.pftrace"
    code, _, stderr = run_cli("convert", str(tmp_path / "rank_0"), "-o", str(out))
    assert code == 2 and "empty file" in stderr and not out.exists()
    code, _, stderr = run_cli("convert", str(tmp_path / "nowhere"), "-o", str(out))
    assert code == 2 and "nowhere" in stderr


def test_json_and_pickle_of_one_rank_normalise_alike(tmp_path: Path):
    job = nccl_layout.scenario_send_without_recv()
    job.dump(str(tmp_path / "p"))
    job.dump(str(tmp_path / "j"), json_ranks=(0, 1))
    from_pickle = read_dump(str(tmp_path / "p" / "nccl_trace_rank_0"))
    from_json = read_dump(str(tmp_path / "j" / "nccl_trace_rank_0.json"))
    # JSON dumps carry no stack frames; everything else is the same
    assert [e._replace(frames=()) for e in from_pickle.entries] == from_json.entries
    assert all(e.frames for e in from_pickle.entries)
    assert from_pickle.pg_status == from_json.pg_status
    assert (from_pickle.file_format, from_json.file_format) == ("pickle", "json")


def test_version_1_layout_is_normalised(tmp_path: Path):
    """Version 1.x: ``seq_id``, ``pg_config`` as {pg_id: [ranks]}, no process_group or dtypes."""
    for rank in (0, 1):
        entries = [
            {
                "record_id": i,
                "pg_id": 0,
                "seq_id": i + 1,
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": 1_000_000 + i * 1000 + rank,
                "input_sizes": [[4]],
                "output_sizes": [[4]],
                "state": "completed",
                "time_discovered_started_ns": 1_000_100 + i * 1000,
                "time_discovered_completed_ns": 1_000_500 + i * 1000,
                "retired": True,
                "frames": [],
            }
            for i in range(3 if rank == 0 else 2)
        ]
        dump = {"version": "1.5", "pg_config": {0: [0, 1]}, "entries": entries}
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    job = load_job([str(tmp_path)])
    assert not job.problems
    (group,) = job.groups
    assert group.members == (0, 1) and group.name == "0"
    assert [e.collective_seq for e in job.dumps[0].entries] == [1, 2, 3]


def test_version_2_0_lowercase_dtypes(tmp_path: Path):
    entry = {
        "record_id": 0,
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "collective_seq_id": 1,
        "p2p_seq_id": 0,
        "op_id": 1,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 5,
        "input_sizes": [[4]],
        "input_dtypes": ["float"],
        "output_sizes": [[4]],
        "output_dtypes": ["bfloat16"],
        "state": "scheduled",
        "is_p2p": False,
    }
    path = tmp_path / "rank_0.json"
    path.write_text(json.dumps({"version": "2.0", "pg_config": {}, "entries": [entry]}))
    (read,) = read_dump(str(path)).entries
    assert (read.input_dtypes, read.output_dtypes) == (("Float",), ("BFloat16",))


def test_a_malformed_entry_is_skipped_and_reported(tmp_path: Path):
    job = nccl_layout.scenario_stuck()
    job.ranks[0].entries[1]["time_created_ns"] = "yesterday"
    job.dump(str(tmp_path))
    loaded = load_job([str(tmp_path)])
    assert len(loaded.dumps[0].entries) == len(job.ranks[0].entries) - 1
    (warning,) = loaded.problems
    assert not warning.fatal and "time_created_ns" in warning.reason and "nccl_trace_rank_0" in warning.path


def test_what_the_reader_counts_of_a_dump_is_what_its_entries_say():
    # Each reading process counts a dump's time range and groups while it holds the entries; the
    # parent relies on those counts, and counts again only where a dump carries none.
    folder = Path(__file__).resolve().parent.parent / "samples" / "nccl" / "straggler"
    job = load_job([str(folder)], jobs=2)
    for dump in job.dumps.values():
        assert dump.time_range == time_range(dump.entries) and dump.time_range is not None
        assert dump.group_counts == group_counts(dump.entries)
        assert sum(dump.group_counts.values()) == len(dump.entries)
    uncounted = build_job({r: replace(d, time_range=None, group_counts=None) for r, d in job.dumps.items()})
    assert time_span(uncounted) == time_span(job)
    assert [(g.name, g.desc, g.members) for g in uncounted.groups] == [(g.name, g.desc, g.members) for g in job.groups]
