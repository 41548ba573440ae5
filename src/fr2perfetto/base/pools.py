"""Worker processes that never outlive the command: killed when it is interrupted, dead when it dies
(and killed by ``cleanup.abandon`` when the command is stopped by a signal).

A convert stopped by SIGTERM (what Slurm and ``timeout`` send) or Ctrl-C must leave neither files
nor processes behind. ``ProcessPoolExecutor`` waits for its workers on the way out, which can take
as long as their work; so an interrupted pool's workers are killed at once, and each worker asks the
kernel to kill it if its parent dies first (``PR_SET_PDEATHSIG``, Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.process import BaseProcess

from .cleanup import worker_processes

_PR_SET_PDEATHSIG = 1
MAX_WORKERS = 4 * (os.cpu_count() or 1)


def _die_with_parent(parent: int) -> None:
    """In a worker: be killed when the parent dies; leave Ctrl-C to the parent, which kills us.

    The parent can die between our fork and this call, before it has even recorded us as one of its
    workers (so ``cleanup.abandon`` does not know us either); the death signal only covers a death to
    come, so a worker whose parent is already gone ends here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


@contextlib.contextmanager
def process_pool(
    workers: int, context: multiprocessing.context.BaseContext | None = None
) -> Iterator[ProcessPoolExecutor]:
    """A ``ProcessPoolExecutor`` whose workers are killed at once if the block is left by an exception
    (an interruption included), rather than waited for. At most ``MAX_WORKERS`` workers, whatever is
    asked: each costs a process's memory."""
    workers = max(1, min(workers, MAX_WORKERS))
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_die_with_parent, initargs=(os.getpid(),)
    )

    def processes_of() -> list[BaseProcess]:
        return list((getattr(pool, "_processes", None) or {}).values())

    try:
        with worker_processes(processes_of):
            yield pool
    except BaseException:
        processes = processes_of()
        for process in processes:
            with contextlib.suppress(OSError, ValueError):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            with contextlib.suppress(OSError, ValueError, AssertionError):
                process.join(2)
        raise
    pool.shutdown(wait=True)
