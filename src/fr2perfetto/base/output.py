"""Write output files atomically: a crash or Ctrl-C never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO

from .cleanup import partial_path


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[bytes]]:
    """Open a temporary file beside ``path``; on success rename it to ``path``, else remove it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".fr2perfetto-", suffix=".partial", dir=directory)
    try:
        with partial_path(temporary), os.fdopen(handle, "wb", buffering=1 << 20) as out:
            yield out
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes it private; a trace is an ordinary file
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
