"""fr2perfetto: PyTorch Flight Recorder dumps of every rank in one Perfetto trace, and a verdict.

The pipeline is load (``job.load_job``) -> match (``match.match_ops``) -> diagnose
(``diagnose.diagnose``) -> emit (``renderers``); ``cli`` is a thin layer on top.
"""

__version__ = "0.1.0"
