"""The protobuf schemas fr2perfetto writes, imported from here whatever protobuf the environment has (5.29
on): its report, ``fr2perfetto_report_pb2`` (generated from ``proto/`` by ``make proto``), and Perfetto's
trace, ``perfetto_trace_pb2`` (from the perfetto package, imported when first asked for).

Generated code refuses a protobuf runtime older than the protoc that made it (ours: 7.35; Perfetto's: 6.31),
and protobuf 5 any other major, whereas a training environment often pins protobuf 5 (older tensorboard,
wandb and onnx releases do). The messages both modules build use nothing newer than 5.29 has, so where the
runtime refuses them, they are imported again with its check off (protobuf's own switch,
``TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK``, set for that import alone): a test converts and analyses
under protobuf 5.29 and compares every byte with what the newest protobuf writes. Older than 5.26, protobuf
lacks the ``runtime_version`` module that generated code imports: ``pyproject.toml`` asks for 5.29 or later.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING

from google.protobuf.runtime_version import VersionError

if TYPE_CHECKING:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as perfetto_trace_pb2

_CHECK_OFF = "TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK"
_LAZY = {"perfetto_trace_pb2": "perfetto.protos.perfetto.trace.perfetto_trace_pb2"}


@contextmanager
def _runtime_check_off() -> Iterator[None]:
    """Protobuf's version check of generated code off while the block runs; the environment as it was after."""
    before = os.environ.get(_CHECK_OFF)
    os.environ[_CHECK_OFF] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_CHECK_OFF, None)
        else:
            os.environ[_CHECK_OFF] = before


def import_generated(name: str) -> ModuleType:
    """The generated module ``name``, imported even where the protobuf runtime is older than its protoc.

    A refused import stops at the check, the module's first statement, before it registers anything, so
    importing it again is clean."""
    try:
        return importlib.import_module(name)
    except VersionError:
        with _runtime_check_off():
            return importlib.import_module(name)


if TYPE_CHECKING:  # its committed stub (.pyi) says what the messages hold; import_generated, a ModuleType
    from . import fr2perfetto_report_pb2
else:
    fr2perfetto_report_pb2 = import_generated(f"{__name__}.fr2perfetto_report_pb2")


def __getattr__(name: str) -> ModuleType:
    """Perfetto's trace schema, imported when first asked for: ``analyze`` never needs it."""
    if name in _LAZY:
        module = globals()[name] = import_generated(_LAZY[name])
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
