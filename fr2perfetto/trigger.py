"""Ask running NCCL ranks to dump their Flight Recorder buffers, through PyTorch's debug pipes.

With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<prefix>`` each rank makes a named pipe ``<prefix><rank>.pipe``
and dumps (to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``) when anything is written to it.
``fr2perfetto.capture.configure`` sets both to files in one folder.
"""

from __future__ import annotations

import errno
import os
import stat

PIPE_PREFIX = "fr_pipe_rank_"


def trigger_dumps(folder: str, problems: list[str] | None = None) -> list[str]:
    """Write to every rank's debug pipe in ``folder``; return the pipes a rank was listening on.

    Never blocks, and never stops at a bad pipe: one that cannot be written to (its buffer full, no
    right to it) is said in ``problems`` and the others are still written to."""
    written: list[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError as error:
        if problems is not None:
            problems.append(f"{folder}: cannot list it ({error.strerror or error})")
        return []
    for name in names:
        path = os.path.join(folder, name)
        if not (name.startswith(PIPE_PREFIX) and name.endswith(".pipe")):
            continue
        try:
            if not stat.S_ISFIFO(os.stat(path).st_mode):
                continue
            # Non-blocking: a pipe nobody reads (a rank that is gone) must not hang the command.
            handle = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno not in (errno.ENXIO, errno.ENOENT) and problems is not None:
                problems.append(f"{path}: cannot open it ({error.strerror or error})")
            continue
        try:
            os.write(handle, b"1\n")
            written.append(path)
        except OSError as error:  # full (a rank that stopped reading it), or gone meanwhile
            if problems is not None:
                reason = (
                    "its buffer is full: the rank is not reading it"
                    if error.errno == errno.EAGAIN
                    else (error.strerror or str(error))
                )
                problems.append(f"{path}: not written ({reason})")
        finally:
            os.close(handle)
    return written
