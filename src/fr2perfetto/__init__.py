"""fr2perfetto: PyTorch Flight Recorder dumps of every rank in one Perfetto trace, and a verdict.

The Python API (``fr2perfetto.api``; the command line is built on it):

- ``load(paths, ...) -> Job``: read the dumps (files, folders, archives, globs) and what lies beside them.
- ``analyze(job, inputs=...) -> Report``: the verdict, culprits, findings and next steps.
- ``write_trace(job, path, report=...) -> (TraceStats, View)``: write the Perfetto (or Chrome JSON) trace.
- ``watch(target, stall=..., on_progress=..., on_hang=...) -> Report | None``: watch a running job through
  PyTorch's debug server; when it stands still, take every rank's evidence and return its verdict.
- ``Report``: the verdict; ``to_dict()`` and ``to_json()`` are what ``fr2perfetto analyze --json`` prints.
- ``Culprit``: a rank to blame, its host where known, and why.
- ``ReportFinding``: one thing wrong with the job: kind, summary, evidence, culprits, group, op.
- ``Job``: all that was read of one job (``load``'s result); ``Job.problems``: what could not be read.
- ``NoDumps``: raised by ``load`` when no dump at all could be read.
- ``TraceStats``: what ``write_trace`` wrote.

The pipeline, one sub-package per stage: ``read`` (files to a ``Job``) -> ``match`` (ops across ranks)
-> ``diagnose`` (findings and the verdict) -> ``layout`` (what the trace shows) -> ``render`` (one file
per output); ``base`` holds what every stage uses. On top: ``api`` (the Python API above, exported
here), ``cli`` (the command line), ``capture`` and ``trigger`` (dumps from a running job), ``serve``
(opening a trace in the UI).
"""

# Nothing is imported here, not even typing: ``from fr2perfetto import capture`` runs in a training
# script before torch, and ``import fr2perfetto`` must not bring protobuf or perfetto with it.

__version__ = "0.1.0"

# For type checkers only, which take ``if TYPE_CHECKING:`` as true: without these imports the lazy
# ``__getattr__`` below would make ``fr2perfetto.analyze`` and the rest ``object`` to them. The flag is
# defined here, not imported from typing, which ``import fr2perfetto`` must not load.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .api import Culprit, Job, NoDumps, Report, ReportFinding, TraceStats, analyze, load, watch, write_trace

# Spelled out, not built from _API: type checkers (and ruff) read a literal ``__all__`` as what the
# package exports, and a strict mypy refuses ``from fr2perfetto import load`` where it is not.
__all__ = [
    "Culprit", "Job", "NoDumps", "Report", "ReportFinding", "TraceStats", "__version__", "analyze", "load",
    "watch", "write_trace",
]  # fmt: skip
_API = tuple(name for name in __all__ if name != "__version__")


def __getattr__(name: str) -> object:
    """The API, imported when first asked for (PEP 562), so that ``import fr2perfetto`` stays light."""
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'fr2perfetto' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What the module has, the API included before it is imported: for ``dir()``, completion and
    ``help()`` (which lists the classes and functions that ``dir`` names and ``__all__`` exports)."""
    return sorted({*globals(), *_API})
