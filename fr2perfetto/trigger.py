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


def trigger_dumps(folder: str) -> list[str]:
    """Write to every rank's debug pipe in ``folder``; return the pipes a rank was listening on."""
    written = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
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
            if error.errno in (errno.ENXIO, errno.ENOENT):
                continue
            raise
        try:
            os.write(handle, b"1\n")
            written.append(path)
        finally:
            os.close(handle)
    return written
