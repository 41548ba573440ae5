"""The C speed-ups are built for the stable ABI of Python 3.10 (one cp310-abi3 wheel serves every CPython
from 3.10 on), and the tuples they make (entries, slices) are the tuples Python makes, down to their hash:
a Python that caches a tuple's hash (3.14 on) would give 0 for one made without tuple.__new__."""

from __future__ import annotations

import configparser
import re
from pathlib import Path
from typing import Any

import pytest

from fr2perfetto.base.model import Entry
from fr2perfetto.base.speedups import SPEEDUPS
from fr2perfetto.read import columns, reader

from .conftest import ROOT
from .helpers import NOW
from .helpers import make_entry as _entry

SAMPLES = ROOT / "samples"


def _hash(value: object) -> object:
    """hash(value), or what says it has none (a tuple holding a list, a look)."""
    try:
        return hash(value)
    except TypeError:
        return "unhashable"


def _hashes_as_python_makes_it(made: tuple[Any, ...]) -> bool:
    return _hash(made) == _hash(tuple(made)) and made == tuple(made)


def test_the_module_is_the_stable_abi_build_that_setup_cfg_tags():
    assert SPEEDUPS is not None and SPEEDUPS.__file__ is not None
    # an abi3 name: the editable install rebuilt it, and no module built for one Python shadows it
    assert Path(SPEEDUPS.__file__).name == "_speedups.abi3.so", SPEEDUPS.__file__
    # the version the source limits itself to and the wheel's tag name the same Python
    source = (ROOT / "src" / "fr2perfetto" / "_speedups.c").read_text()
    [limit] = re.findall(r"^#define Py_LIMITED_API (0x[0-9A-Fa-f]{8})$", source, re.MULTILINE)
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    tag = config["bdist_wheel"]["py_limited_api"]
    assert tag == "cp310" and int(limit, 16) == 0x030A0000


def test_entries_the_c_reader_makes_hash_as_python_makes_them(monkeypatch: pytest.MonkeyPatch):
    path = str(SAMPLES / "nccl" / "straggler" / "nccl_trace_rank_0")
    made_in_c = reader.read_dump(path).entries
    with monkeypatch.context() as patch:
        patch.setattr(reader, "_speedups", None)
        made_in_python = reader.read_dump(path).entries
    assert made_in_c == made_in_python and len(made_in_c) == 30
    assert all(type(e) is Entry and _hashes_as_python_makes_it(e) for e in made_in_c)
    assert {hash(e) for e in made_in_c} == {hash(e) for e in made_in_python}


def test_entries_made_from_columns_hash_as_python_makes_them():
    assert SPEEDUPS is not None
    made = columns.from_entries(0, [_entry(op_id=n, record_id=n, time_created_ns=NOW + n) for n in range(5)])
    made_in_c = columns.to_entries(made, SPEEDUPS.entries_from_columns)
    assert all(_hashes_as_python_makes_it(e) for e in made_in_c)
    assert set(made_in_c) == set(columns.to_entries(made, columns.entries_in_python))
