"""fr2perfetto: PyTorch Flight Recorder dumps of every rank in one Perfetto trace, and a verdict.

The pipeline, one sub-package per stage: ``read`` (files to a ``Job``) -> ``match`` (ops across ranks)
-> ``diagnose`` (findings and the verdict) -> ``layout`` (what the trace shows) -> ``render`` (one file
per output); ``base`` holds what every stage uses. On top: ``api`` (``load``, ``analyze``,
``write_trace``: the Python API, exported here), ``cli`` (the command line, built on it), ``capture``
and ``trigger`` (dumps from a running job), ``serve`` (opening a trace in the UI).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = ("Culprit", "Job", "NoDumps", "Report", "ReportFinding", "TraceStats", "analyze", "load", "write_trace")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """The API, imported when first asked for: ``from fr2perfetto import capture`` (in a training script,
    before torch) stays light."""
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'fr2perfetto' has no attribute {name!r}")
