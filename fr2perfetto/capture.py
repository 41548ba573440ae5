"""Capture Flight Recorder dumps from any job, NCCL or gloo: a few lines in the training script.

    from fr2perfetto import capture
    capture.configure("/shared/fr_dumps")      # before init_process_group
    dist.init_process_group(...)
    capture.install()                          # dump on an exception, on SIGUSR1 and at exit

Every rank then writes ``<folder>/<prefix><rank>`` (``nccl_trace_rank_`` on GPUs, ``gloo_trace_rank_``
otherwise), which ``fr2perfetto convert <folder>`` reads as is. The only module of fr2perfetto that needs
torch, and it imports torch only when called.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from types import TracebackType
from typing import Any

from .trigger import PIPE_PREFIX

_state: dict[str, Any] = {"folder": None, "installed": False, "dumped": False}
_lock = threading.Lock()


def configure(folder: str, *, buffer_size: int = 2000, timing: bool = False, stack_traces: bool = True) -> None:
    """Set the Flight Recorder environment for this process; call before ``init_process_group``.

    ``timing`` turns on NCCL start events (start times, durations, ``started`` states) at some cost.
    """
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    _state["folder"] = folder
    prefix = os.path.join(folder, "nccl_trace_rank_")
    settings = {
        "TORCH_FR_BUFFER_SIZE": str(buffer_size),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(buffer_size),
        # NCCL writes its own dumps here on a watchdog timeout, and when its debug pipe is written to.
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(folder, PIPE_PREFIX),
        "TORCH_NCCL_TRACE_CPP_STACK": "0",
        "TORCH_INCLUDE_STACK_TRACE": "1" if stack_traces else "0",
    }
    if timing:
        settings["TORCH_NCCL_ENABLE_TIMING"] = "1"
    for key, value in settings.items():
        os.environ.setdefault(key, value)


def dump(folder: str | None = None, *, reason: str = "") -> str | None:
    """Write this rank's Flight Recorder buffer now; return the file, or None if there is nothing to dump."""
    import torch
    import torch.distributed as dist

    folder = folder or _state["folder"] or os.environ.get("FR2PERFETTO_DUMP_DIR") or "."
    if not dist.is_available() or not dist.is_initialized():
        return None
    c10d = torch._C._distributed_c10d
    rank = dist.get_rank()
    if torch.cuda.is_available() and hasattr(c10d, "_dump_nccl_trace"):
        data, name = c10d._dump_nccl_trace(), f"nccl_trace_rank_{rank}"
    else:
        data, name = c10d._dump_fr_trace(), f"gloo_trace_rank_{rank}"
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    partial = f"{path}.partial"
    with open(partial, "wb") as out:
        out.write(data)
    os.replace(partial, path)  # a reader never sees half a dump
    if reason:
        print(f"fr2perfetto: rank {rank} dumped its Flight Recorder to {path} ({reason})", file=sys.stderr)
    return path


def _dump_once(reason: str) -> None:
    with _lock:
        if _state["dumped"]:
            return
        _state["dumped"] = True
    try:
        dump(reason=reason)
    except Exception as error:  # dumping must never hide the original failure
        print(f"fr2perfetto: could not dump the Flight Recorder: {error}", file=sys.stderr)


def install(*, on_exception: bool = True, on_signal: int | None = signal.SIGUSR1, on_exit: bool = True) -> None:
    """Dump this rank's buffer when the script dies of an exception, gets ``on_signal``, or exits."""
    if _state["installed"]:
        return
    _state["installed"] = True
    if on_exception:
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            _dump_once(f"{kind.__name__}: {value}"[:200])
            previous(kind, value, tb)

        sys.excepthook = hook
    if on_signal is not None:

        def on_signal_received(signum: int, frame: object) -> None:
            with _lock:
                _state["dumped"] = False  # a signal asks for a fresh dump each time
            _dump_once(f"signal {signal.Signals(signum).name}")

        signal.signal(on_signal, on_signal_received)
    if on_exit:
        atexit.register(_dump_once, "exit")
