"""Watch a running job and catch a hang while it hangs: ``fr2perfetto watch``, ``fr2perfetto.watch()``.

PyTorch's debug server (``torch.distributed.debug.start_debug_server``) serves each rank's Flight Recorder
and stacks while the job runs; the watch asks every rank where it stands, a few at a time, and when no
rank has moved for the stall it takes every rank's Flight Recorder and stacks, twice, into a folder that
``fr2perfetto analyze`` reads, and gives the verdict on it, before any watchdog fires.

- ``sources``: the debug server over HTTP (bounded requests) and watched folders: bytes in, nothing judged.
- ``progress``: pure state: per rank and per group the last op enqueued, started, completed, and when
  each last moved; the live line; whether the job stands still.
- ``evidence``: the evidence written into a folder of its own, in the names ``analyze`` reads.
- ``watcher``: the loop that polls, says, and acts (takes the evidence, analyses it).
"""

from __future__ import annotations

from .progress import Status
from .sources import WatchError
from .watcher import Hang, Outcome, Settings, watch_job

__all__ = ["Hang", "Outcome", "Settings", "Status", "WatchError", "watch_job"]
