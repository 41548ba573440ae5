"""Random mutations of real dumps: the reader fails only with its own error, never hangs, and the C reader
reads every entry exactly as the Python reader does."""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fr2perfetto.match.ops import match_ops
from fr2perfetto.read import reader
from fr2perfetto.read.job import build_job
from fr2perfetto.read.reader import DumpError, read_dump

from .conftest import ROOT
from .test_columns import columns_agree

REAL_PICKLE = (ROOT / "samples" / "gloo" / "skip" / "gloo_trace_rank_0").read_bytes()
REAL_JSON = (ROOT / "samples" / "gloo" / "healthy" / "gloo_trace_rank_1.json").read_bytes()
NCCL_PICKLE = (ROOT / "samples" / "nccl" / "demo" / "nccl_trace_rank_1").read_bytes()
REAL = [REAL_PICKLE, REAL_JSON, NCCL_PICKLE]

WEIRD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _read_in_python(data: bytes):
    """Read with the C reader turned off: the Python reader alone."""
    with mock.patch.object(reader, "_speedups", None):
        return read_dump("/fuzz/nccl_trace_rank_3", data)


def _shapes_agree(data: bytes) -> None:
    from fr2perfetto import _speedups
    from fr2perfetto.read import pickle_shape

    limit = pickle_shape.max_nodes(len(data))
    assert _speedups.scan_pickle(data, pickle_shape.MAX_DEPTH, limit) == pickle_shape.scan(data, 64, limit)


def _read(data: bytes) -> None:
    """The C reader and the Python reader read the same; the C and Python shape checks of a pickle agree;
    the C reader's columns are the reference's."""
    columns_agree("/fuzz/nccl_trace_rank_3", data)
    if data[:1] == b"\x80":
        _shapes_agree(data)
    try:
        dump = read_dump("/fuzz/nccl_trace_rank_3", data)
    except DumpError as error:
        assert "\n" not in str(error)
        with pytest.raises(DumpError):
            _read_in_python(data)
        return
    other = _read_in_python(data)
    assert repr(dump.entries) == repr(other.entries)  # repr: a NaN is never equal to itself
    assert (dump.skipped_entries, dump.skipped_reason) == (other.skipped_entries, other.skipped_reason)
    # what reads must also match and lay out without error
    match_ops(build_job({dump.rank: dump}))


@settings(max_examples=150, deadline=10_000, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(REAL) - 1),
    cut=st.integers(0, 10_000),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
)
def test_byte_mutations(which: int, cut: int, flips: list[tuple[int, int]]):
    data = bytearray(REAL[which])
    data = data[: len(data) - cut % len(data)] if cut else data
    for position, value in flips:
        if data:
            data[position % len(data)] = value
    _read(bytes(data))


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for index, value in enumerate(obj[:3]):
            found += _paths(value, (*prefix, index))
    return found


DECODED = [pickle.loads(REAL_PICKLE), json.loads(REAL_JSON), pickle.loads(NCCL_PICKLE)]
PATHS = [_paths(d) for d in DECODED]


@settings(max_examples=300, deadline=10_000, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(DECODED) - 1),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.booleans(), WEIRD_VALUES), min_size=1, max_size=5),
)
def test_structure_mutations(which: int, edits: list[tuple[int, bool, Any]]):
    """Drop keys, put values of the wrong type, or huge numbers anywhere in a real dump."""
    doc = copy.deepcopy(DECODED[which])
    paths = PATHS[which]
    for index, drop, value in edits:
        path = paths[index % len(paths)]
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if drop and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    data = json.dumps(doc, default=list).encode() if which == 1 else pickle.dumps(doc, protocol=2)
    _read(data)


def _deep(depth: int) -> Any:
    value: Any = ()
    for _ in range(depth):
        value = (value,)
    return value


def _shared(levels: int) -> Any:
    value: Any = ()
    for _ in range(levels):
        value = (value, value)  # pickled once per level (the memo): 2**levels nodes to walk or hash
    return value


HOSTILE_VALUES = st.one_of(
    WEIRD_VALUES,
    st.sampled_from([_deep(70), _shared(30), "\ud800", "x\udfffy", ("\ud800", "tp"), [[2**63]], [_deep(70)]]),
    st.integers(min_value=2**24 - 2, max_value=2**64),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.builds(lambda n: f"[0, {n}]", st.integers(min_value=2**24 - 2, max_value=2**70)),
    st.builds(lambda n: f"nccl:send 0->{n}", st.integers(min_value=2**24 - 2, max_value=2**70)),
)


@settings(max_examples=300, deadline=10_000, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.sampled_from([0, 2]),
    edits=st.lists(st.tuples(st.integers(0, 10**6), HOSTILE_VALUES), min_size=1, max_size=4),
)
@example(which=2, edits=[(307, "\u00b2")])  # a group named "²": str.isdigit() holds, int() refuses it
@pytest.mark.slow
def test_hostile_shapes(which: int, edits: list[tuple[int, Any]]):
    """Deep nesting, shared-tuple bombs, lone surrogates, ranks and numbers out of range, anywhere in a
    real pickle (pg_status keys included): the shape check refuses the first two in C and in Python
    alike, and whatever reads has text every output can encode."""
    doc = copy.deepcopy(DECODED[which])
    paths = PATHS[which]
    for index, value in edits:
        path = paths[index % len(paths)]
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = value
            if index % 7 == 0 and isinstance(doc.get("pg_status"), dict):
                doc["pg_status"][_deep(70) if index % 2 else "\ud800"] = {}
        except (KeyError, IndexError, TypeError):
            continue
    data = pickle.dumps(doc, protocol=2)
    _shapes_agree(data)
    _read(data)
    with contextlib.suppress(DumpError):
        dump = read_dump("/fuzz/nccl_trace_rank_3", data)
        for entry in dump.entries:
            for text in (entry.group_name, entry.group_desc, entry.op, entry.thread_name, entry.thread_id,
                         *entry.input_dtypes, *(f.name + f.filename for f in entry.frames)):  # fmt: skip
                text.encode("utf-8")
