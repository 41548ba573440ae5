"""Ask running ranks to dump their Flight Recorder buffers: NCCL ranks through PyTorch's debug pipes, any
rank set up with ``fr2perfetto.capture`` on this host by its request signal.

With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<prefix>`` each NCCL rank makes a named pipe ``<prefix><rank>.pipe``
and dumps (to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``) when anything is written to it.
``fr2perfetto.capture.configure`` sets both to files in one folder, and ``capture.install`` leaves a
rank file, ``fr_pid_rank_<rank>``, saying who the rank is: its host, pid, the start time of that process
and the run it belongs to. A process is signalled only when it is still that process: same host, same
pid, same start time (pids are reused; start times are not), and, where a run is given, the same run.
So a rank file left from an earlier job never signals whatever process now holds its pid.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import stat
from dataclasses import dataclass

PIPE_PREFIX = "fr_pipe_rank_"
PID_PREFIX = "fr_pid_rank_"
MAX_RANK_FILE = 4096  # bytes: a rank file is one short line


@dataclass(frozen=True, slots=True)
class RankProcess:
    """What a rank file says of the process of a rank."""

    rank: int
    host: str
    pid: int
    start: int  # the process's start time, in clock ticks after boot (/proc/<pid>/stat, field 22)
    run: str  # the job run it belongs to (a nonce shared by its ranks)
    signal: int  # the signal it dumps on


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    # the command name, field 2, is in parentheses and may hold anything: count fields after the last ')'
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def rank_file_text(process: RankProcess) -> str:
    return json.dumps({"rank": process.rank, "host": process.host, "pid": process.pid, "start": process.start,
                       "run": process.run, "signal": process.signal}) + "\n"  # fmt: skip


def read_rank_file(dir_fd: int, name: str) -> RankProcess | None:
    """The rank file ``name`` in the folder open as ``dir_fd``, if it is one: a regular file of this
    process's user (never followed through a link), in the form ``rank_file_text`` writes."""
    try:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid():
            return None
        value = json.loads(os.read(handle, MAX_RANK_FILE))
        process = RankProcess(**{key: value[key] for key in RankProcess.__dataclass_fields__})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    finally:
        os.close(handle)
    bounds = (
        (process.rank, 0, 1 << 24), (process.pid, 1, 1 << 31), (process.start, 0, 1 << 62), (process.signal, 1, 65),
    )  # fmt: skip
    if not all(type(n) is int and low <= n < high for n, low, high in bounds):
        return None
    return process if isinstance(process.host, str) and isinstance(process.run, str) else None


def signal_ranks(folder: str, run: str | None = None, problems: list[str] | None = None) -> list[int]:
    """Send each rank on this host whose rank file is in ``folder`` its dump signal, if it is still the
    process the file names (and of ``run``, when given); return the ranks signalled."""
    host, me = socket.gethostname(), os.getpid()
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        if problems is not None:
            problems.append(f"{folder}: cannot open it ({error.strerror or error})")
        return []
    signalled = []
    try:
        for name in sorted(os.listdir(dir_fd)):
            if not name.startswith(PID_PREFIX):
                continue
            process = read_rank_file(dir_fd, name)
            if process is None or process.host != host or process.pid == me or (run is not None and process.run != run):
                continue
            if _signal_if_same(process):
                signalled.append(process.rank)
    finally:
        os.close(dir_fd)
    return signalled


def _signal_if_same(process: RankProcess) -> bool:
    """Signal ``process`` if the pid still belongs to it. Through a pidfd where the system has them, so
    that the pid cannot be reused between the check and the signal."""
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(process.pid)
    try:
        if process_start(process.pid) != process.start:
            return False  # gone, or its pid now belongs to another process
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, process.signal)
        else:
            os.kill(process.pid, process.signal)
        return True
    except OSError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


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
            if not stat.S_ISFIFO(os.lstat(path).st_mode):
                continue
            # Non-blocking: a pipe nobody reads (a rank that is gone) must not hang the command.
            handle = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            if error.errno not in (errno.ENXIO, errno.ENOENT) and problems is not None:
                problems.append(f"{path}: cannot open it ({error.strerror or error})")
            continue
        try:
            if not stat.S_ISFIFO(os.fstat(handle).st_mode):
                continue  # replaced by something else since it was looked at
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
