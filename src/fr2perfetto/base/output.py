"""Write output files atomically: a crash or Ctrl-C never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import IO

from .cleanup import scratch_file


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[bytes]]:
    """Open a temporary file beside ``path``; on success rename it to ``path``, else remove it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with scratch_file(directory, ".fr2perfetto-", ".partial") as (handle, temporary):
        try:
            with os.fdopen(handle, "wb", buffering=1 << 20) as out:
                yield out
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)  # made private while partial; a trace is an ordinary file
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
