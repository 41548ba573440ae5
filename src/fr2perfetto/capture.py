"""Capture Flight Recorder dumps from any job, NCCL or gloo: a few lines in the training script.

    from fr2perfetto import capture
    capture.configure("/shared/fr_dumps")      # before init_process_group
    dist.init_process_group(...)
    capture.install()                          # dump on request, on an exception, when stopped, at exit

Every rank then writes ``<folder>/<prefix><rank>`` (``nccl_trace_rank_`` on GPUs, ``gloo_trace_rank_``
otherwise), which ``fr2perfetto convert <folder>`` reads as is, and beside it ``<file>.ended``: how the
process ended (``exit``, ``exception: ...``, ``signal SIGTERM``), or ``running`` for a dump taken on
request. A dump taken on request also writes where the rank's threads are,
``stacks_rank_<rank>_<time>.txt``: what gloo's dumps cannot show (its sends and recvs are not
recorded). The only module of fr2perfetto that needs torch, and it imports torch only when called.

When dumps are written:

- On request (``kill -USR1 <pid>``), served by a thread of its own: a rank blocked in a collective
  (the very case a dump is asked for) never runs Python code in its main thread, where signal handlers
  run, until the collective returns. Python's C-level handler, which runs in whatever thread the
  signal lands on, writes the signal's number to a wakeup pipe (``signal.set_wakeup_fd``), and the
  thread reads it and dumps.
- At exit, always, over any dump taken on request: a job that finished is not a hung one.
- On an exception that ends the script (``sys.excepthook``), and ``destroy_process_group`` is wrapped
  to dump before the group is gone (after it, nothing is left to dump).
- When stopped by SIGTERM or SIGHUP. torchrun, when one rank fails, sends SIGTERM to the others (and
  SIGKILL some seconds later): each of them dumps on the SIGTERM. A rank that dies of an exception also
  asks every rank it can reach to dump at once: ranks of the same run on its host by SIGUSR1, NCCL ranks
  anywhere through their debug pipes (``fr2perfetto trigger``).

  A stop never hangs the rank. CPython runs a Python signal handler in the main thread, between two
  bytecodes, so torchrun's second SIGTERM (it sends two, a moment apart) can run the stop handler again
  inside the first one's dump, which holds the dump lock. So a stop is claimed once (a second stop
  signal is noted and nothing more), and a handler that finds its own thread inside a dump (at exit,
  before ``destroy_process_group``, on an exception) leaves it to complete and carries the stop out
  after it. The only lock a dump waits for is one another thread holds (the request thread's dump), and
  that wait is bounded. Each file is renamed into place whole, so a rank killed at any point leaves a
  whole dump or none.

  And a rank whose main thread is blocked in a collective (the hung rank, whose dump matters most)
  runs no Python handler until the collective returns, which may be never: torchrun's SIGKILL would
  come first and take the evidence with it. The request thread sees every signal's number too (the
  wakeup pipe), so when the main thread has not claimed a stop within ``STOP_GRACE_SECONDS``, the
  thread claims it, dumps, and ends the process with status 128 + the signal's number (only the main
  thread may restore a signal's default action, and it is blocked).

  The rest of the review: a dump request (SIGUSR1) during a stop waits for the stop's dump and then
  writes nothing (the stop's dump says how the rank ended, and no later dump replaces it); an exception
  inside a dump is printed in one line and the stop goes on, without a dump; a stop during the dump at
  exit is carried out after that dump, which already says how the rank ended, so none is written again.

Handlers that were installed before are kept and called after the dump. What the helper says goes to the
``fr2perfetto.capture`` logger (a job silences or routes it by name); where ``configure`` was not called,
``FR2PERFETTO_DUMP_DIR`` names the dump folder (else the current one).

What it touches, and nothing else:

- Files: only inside the dump folder, which must be a folder (not a link to one) of the user the rank
  runs as; anything else is refused in one line, unwritten. Each file is written under a new hidden name
  of its own, created without following links (``O_CREAT | O_EXCL | O_NOFOLLOW``, relative to the
  folder opened once), then renamed over its final name: a link planted in the folder is replaced, never
  written through.
- Processes: a rank leaves a rank file, ``fr_pid_rank_<rank>``, with its host, pid, the start time of
  its process and the run's identity (a nonce the ranks agree on through the process group's store).
  A rank wakes another only when all four still hold (``trigger.signal_ranks``), so a file left by an
  earlier run never signals a process that now has its pid. The file is removed when the rank ends.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from .trigger import PID_PREFIX, PIPE_PREFIX, RankProcess, process_start, rank_file_text, signal_ranks, trigger_dumps

WARM_UP_SECONDS = 0.5  # while no request comes, a warm-up dump is tried this often until one held entries
WARM_DUMP_BYTES = 400  # a dump with no entry is smaller than this
# What it says goes through this logger: a job silences it, or routes it to its own handlers, by name.
# Dumps are said at WARNING (a rank stopping, or asked for its evidence, is news), failures at ERROR; with
# no logging set up, Python prints both to stderr, as the helper always has.
log = logging.getLogger("fr2perfetto.capture")
RUN_KEY = "fr2perfetto/run"  # where the ranks agree on their run's nonce, in the default group's store
_state: dict[str, Any] = {"folder": None, "installed": False, "request_signal": None, "run": None, "rank_file": None}
_lock = threading.Lock()  # one dump at a time: the request thread's and the main thread's
LOCK_WAIT_SECONDS = 10.0  # how long a dump waits for another thread's dump in progress, at most
# How long the request thread leaves a stop to the main thread before it carries the stop out itself:
# far below the time launchers give a stopped process before SIGKILL (torchrun: 30 s).
STOP_GRACE_SECONDS = 2.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# Threads inside ``dump``. Python runs a signal handler in the main thread between two bytecodes, so a
# second SIGTERM (torchrun sends two, a moment apart) may run the stop handler again inside the first
# one's dump, or inside a dump at exit: waiting there for ``_lock``, which that very dump holds, would
# hang the rank for good. A handler that finds its own thread here notes the stop and returns; the dump
# in progress completes, once, and then carries the stop out (``_deferred_stop``).
_dumping: set[int] = set()


class UnsafeFolder(OSError):
    """A dump folder that capture will not write into; the message is one line."""


def configure(folder: str, *, buffer_size: int = 2000, timing: bool = False, stack_traces: bool = True) -> None:
    """Set the Flight Recorder environment for this process; call before ``init_process_group``.

    ``folder`` is made if missing (private to the user); one that is a link or belongs to another user
    raises ``UnsafeFolder``. ``timing`` turns on NCCL start events (start times, durations,
    ``started`` states) at some cost.
    """
    folder = os.path.abspath(folder)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.close(_open_folder(folder))
    _state["folder"] = folder
    prefix = os.path.join(folder, "nccl_trace_rank_")
    settings = {
        "TORCH_FR_BUFFER_SIZE": str(buffer_size),
        # NCCL writes its own dumps here on a watchdog timeout, and when its debug pipe is written to.
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(folder, PIPE_PREFIX),
        "TORCH_FR_CPP_STACK": "0",
        "TORCH_INCLUDE_STACK_TRACE": "1" if stack_traces else "0",
    }
    if timing:
        settings["TORCH_NCCL_ENABLE_TIMING"] = "1"
    for key, value in settings.items():
        os.environ.setdefault(key, value)


def _folder(folder: str | None = None) -> str:
    return folder or _state["folder"] or os.environ.get("FR2PERFETTO_DUMP_DIR") or "."


def _open_folder(folder: str) -> int:
    """The dump folder, opened: a folder of this process's user, not a link; else ``UnsafeFolder``."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if os.path.islink(folder):
            raise UnsafeFolder(f"{folder}: a symbolic link, not a folder: refusing to write dumps through it") from None
        raise UnsafeFolder(f"{folder}: cannot open it as a folder ({error.strerror or error})") from None
    owner = os.fstat(handle).st_uid
    if owner != os.geteuid():
        os.close(handle)
        raise UnsafeFolder(
            f"{folder}: belongs to user {owner}, not to this process's user {os.geteuid()}: refusing to write there"
        )
    return handle


def write_into_folder(folder: str, name: str, data: bytes) -> str:
    """Write ``data`` as ``folder/name``: under a new hidden name created without following links, then
    renamed over ``name`` (a reader never sees half a file; a link at ``name`` is replaced, not followed)."""
    if os.sep in name or name.startswith("."):
        raise ValueError(f"not a plain file name: {name!r}")
    folder_fd = _open_folder(folder)
    try:
        temporary, handle = "", -1
        for _ in range(16):
            temporary = f".{name}.{secrets.token_hex(6)}.partial"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                handle = os.open(temporary, flags, 0o644, dir_fd=folder_fd)
                break
            except FileExistsError:
                continue
        if handle < 0:
            raise UnsafeFolder(f"{folder}: could not make a file of its own there")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder_fd)
            raise
    finally:
        os.close(folder_fd)
    return os.path.join(folder, name)


def dump(folder: str | None = None, *, reason: str = "", ended: str = "running") -> str | None:
    """Write this rank's Flight Recorder buffer now; return the file, or None if there is nothing to dump
    (or if called again from a signal handler inside a dump of the same thread: that dump goes on).

    ``ended`` goes into ``<file>.ended``: how the process ended, or ``running``."""
    me = threading.get_ident()
    if me in _dumping:
        return None
    _dumping.add(me)
    try:
        return _dump(folder, reason, ended)
    finally:
        _dumping.discard(me)
        stop = _state.pop("deferred_stop", None) if threading.current_thread() is threading.main_thread() else None
        if stop is not None:
            stop()


def _dump(folder: str | None, reason: str, ended: str) -> str | None:
    import torch
    import torch.distributed as dist

    folder = _folder(folder)
    if not dist.is_available() or not dist.is_initialized():
        return None
    c10d = torch._C._distributed_c10d
    rank = dist.get_rank()
    # by the backend, not torch.cuda.is_available(): its first call takes a second or more
    if "nccl" in str(dist.get_backend()).lower() and hasattr(c10d, "_dump_nccl_trace"):
        data, name = c10d._dump_nccl_trace(), f"nccl_trace_rank_{rank}"
    else:
        # torch's stubs leave out this private function (the hasattr above speaks for NCCL's)
        data, name = c10d._dump_fr_trace(), f"gloo_trace_rank_{rank}"  # type: ignore[attr-defined]
    # The request thread and the main thread may dump at once; the other thread's dump ends (it waits for
    # nothing of this thread's), but on a filesystem that hangs the wait is bounded all the same.
    if not _lock.acquire(timeout=LOCK_WAIT_SECONDS):
        raise TimeoutError(f"another dump of this rank took more than {LOCK_WAIT_SECONDS:.0f} s")
    try:
        if ended == "running" and _state.get("ended"):
            return os.path.join(folder, name)  # a request served late never overwrites the dump of how it ended
        # how it ended first: whoever sees the new dump sees its .ended beside it
        write_into_folder(folder, f"{name}.ended", f"{ended}\n".encode())
        path = write_into_folder(folder, name, data)
        if ended != "running":
            _state["ended"] = ended
        else:  # asked while it runs, perhaps hung: where its threads are says what the dump cannot
            _write_stacks(folder, rank)
    finally:
        _lock.release()
    if reason:
        log.warning("fr2perfetto: rank %d dumped its Flight Recorder to %s (%s)", rank, path, reason)
    return path


def _write_stacks(folder: str, rank: int) -> None:
    """Write where every thread of this process is (``faulthandler``'s traceback, the form PyTorch's
    debug server writes) as ``stacks_rank_<rank>_<local time>.txt`` beside the dump: a request taken a
    few times, seconds apart, shows which rank stays where (``fr2perfetto analyze`` reads them)."""
    import faulthandler
    import tempfile

    now = time.time()
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now)) + f"_{int(now % 1 * 1e6):06d}"
    with tempfile.TemporaryFile() as scratch:  # faulthandler writes to a file descriptor
        faulthandler.dump_traceback(scratch, all_threads=True)
        scratch.seek(0)
        write_into_folder(folder, f"stacks_rank_{rank}_{stamp}.txt", scratch.read())


def _try_dump(reason: str, ended: str = "running") -> None:
    try:
        dump(reason=reason, ended=ended)
    except Exception as error:  # dumping must never hide the original failure
        log.error("fr2perfetto: could not dump the Flight Recorder: %s", error)


def install(
    *,
    on_exception: bool = True,
    on_signal: int | None = signal.SIGUSR1,
    on_exit: bool = True,
    on_stop: bool = True,
    wake_others: bool = True,
) -> None:
    """Dump this rank's buffer on ``on_signal`` (from a thread, even while the main thread is blocked),
    when the script dies of an exception (and ask the other ranks to dump: ``wake_others``), when it is
    stopped by SIGTERM or SIGHUP (``on_stop``), before ``destroy_process_group``, and at exit."""
    if _state["installed"]:
        return
    _state["installed"] = True
    if on_signal is not None:
        _serve_requests(on_signal)
        _leave_rank_file(on_signal)
    if on_exception:
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            what = f"{kind.__name__}: {value}"[:200]
            _try_dump(what, ended=f"exception: {what}")
            _stop_serving()
            if wake_others:
                _wake_others()
            previous(kind, value, tb)

        sys.excepthook = hook
    if on_stop:
        _state["stop_watched"] = True
        for stop in STOP_SIGNALS:
            _chain(stop, _dump_on_stop, once=True)
    _wrap_destroy()
    atexit.register(_at_exit if on_exit else _stop_serving)


def _at_exit() -> None:
    if not _state.get("ended"):  # an exception, a signal or destroy_process_group dumped already
        _try_dump("exit", ended="exit")
    _stop_serving()


def _stop_serving() -> None:
    """Once the process ends: remove its rank file, and ignore dump requests, which would otherwise end
    it by their default action (and change its exit status) once Python's handlers are gone."""
    _remove_rank_file()
    signum = _state.get("request_signal")
    if signum is not None:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, signal.SIG_IGN)


def _dump_on_stop(signum: int) -> None:
    if _state.get("ended"):  # at exit, on an exception or before destroy_process_group: said already
        return
    name = signal.Signals(signum).name
    _try_dump(f"signal {name}", ended=f"signal {name}")


def _claim_stop() -> bool:
    """Whether the caller is the first to handle a stop: one ``setdefault`` with a token of its own,
    which no handler can interrupt halfway, so exactly one caller, of either thread, gets True."""
    token = object()
    return _state.setdefault("stop_owner", token) is token


def _stop_if_main_cannot(signum: int) -> None:
    """In the request thread, told of stop signal ``signum``: unless the main thread claims the stop
    within ``STOP_GRACE_SECONDS`` (it is blocked in C++, running no Python handler), claim it, dump, and
    end the process."""
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline:
        if "stop_owner" in _state:
            return
        time.sleep(0.02)
    if not _claim_stop():
        return
    name = signal.Signals(signum).name
    _try_dump(f"signal {name}, its main thread blocked", ended=f"signal {name}")
    _remove_rank_file()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(128 + signum)  # a shell's status for a process ended by this signal


def _chain(signum: int, action: Callable[[int], None], *, once: bool = False) -> None:
    """Run ``action`` on ``signum``, then what was there before (the default action included).

    With ``once`` (a stop): a stop signal that comes while a stop is handled is noted and nothing more
    (the first one ends the process); one that comes inside a dump of the main thread (at exit, before
    ``destroy_process_group``, on an exception, or asked for) is carried out when that dump completes.
    Both checks are single operations on a dict or a set, which a handler cannot interrupt halfway."""
    previous = signal.getsignal(signum)

    def handler(number: int, frame: FrameType | None) -> None:
        if once:
            if not _claim_stop():
                return  # a second stop while the first is carried out (by this thread or the request thread)
            if threading.get_ident() in _dumping:
                _state["deferred_stop"] = lambda: carry_out(number, frame)
                return
        carry_out(number, frame)

    def carry_out(number: int, frame: FrameType | None) -> None:
        action(number)
        if callable(previous):
            previous(number, frame)
        elif previous != signal.SIG_IGN:
            _stop_serving()  # the default action ends the process without running atexit
            signal.signal(number, signal.SIG_DFL)  # the default: end the process, as before
            os.kill(os.getpid(), number)

    signal.signal(signum, handler)


def _serve_requests(signum: int) -> None:
    """Dump on ``signum`` from a thread: the signal's number arrives through the wakeup pipe, which
    Python's C-level handler writes to in whatever thread the signal lands on."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    previous = signal.getsignal(signum)

    def handler(number: int, frame: FrameType | None) -> None:
        # Runs later, in the main thread, when it runs Python again: the thread has dumped already.
        if callable(previous):
            previous(number, frame)

    signal.signal(signum, handler)
    _state["request_signal"] = signum

    def serve() -> None:
        warm = False
        while True:
            if not warm and not select.select([read_end], [], [], WARM_UP_SECONDS)[0]:
                warm = _warm_up()
                continue
            try:
                numbers = os.read(read_end, 512)
            except OSError:
                return
            if not numbers:
                return
            if previous_fd >= 0:  # whoever had the wakeup fd before (asyncio) still gets its bytes
                with contextlib.suppress(OSError):
                    os.write(previous_fd, numbers)
            if signum in numbers:
                _try_dump(f"signal {signal.Signals(signum).name}")
            stops = [number for number in STOP_SIGNALS if number in numbers]
            if stops and _state.get("stop_watched"):
                _stop_if_main_cannot(stops[0])

    threading.Thread(target=serve, name="fr2perfetto-dump-requests", daemon=True).start()


def _warm_up() -> bool:
    """Take a dump and throw it away: a process's first dump of recorded entries takes a second or two
    (the recorder symbolizes stacks for the first time), and a request must be served at once. True
    once a dump held entries."""
    try:
        import torch

        # a private function that torch's stubs leave out, as in _dump
        return len(torch._C._distributed_c10d._dump_fr_trace()) > WARM_DUMP_BYTES  # type: ignore[attr-defined]
    except Exception:
        return True  # nothing to warm up: do not try again


def _wrap_destroy() -> None:
    """Dump before ``destroy_process_group`` (of the default group): after it nothing is left to dump."""
    import torch.distributed as dist

    original = dist.destroy_process_group
    if getattr(original, "_fr2perfetto", False):
        return

    def destroy_process_group(group: Any = None) -> Any:
        if group is None:
            _try_dump("destroy_process_group", ended="exit")
        return original(group)

    destroy_process_group._fr2perfetto = True  # type: ignore[attr-defined]
    dist.destroy_process_group = destroy_process_group


def _run_identity() -> str:
    """A nonce every rank of this run agrees on: the first rank to ask sets it in the default group's
    store, the others read it (``compare_set`` is atomic). Where there is no store, this process's own."""
    import torch.distributed as dist

    mine = secrets.token_hex(16)
    with contextlib.suppress(Exception):
        store = dist.distributed_c10d._get_default_store()
        return store.compare_set(RUN_KEY, "", mine).decode("ascii", "replace")
    return mine


def _leave_rank_file(signum: int) -> None:
    """Leave ``<folder>/fr_pid_rank_<rank>``: who this rank is, so that a failing rank of the same run
    on this host can wake it (``trigger.signal_ranks``)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    start = process_start(os.getpid())
    if start is None:
        return  # no /proc: nobody could check it is still us, so nobody may signal us
    run = _state["run"] = _run_identity()
    me = RankProcess(dist.get_rank(), socket.gethostname(), os.getpid(), start, run, int(signum))
    name = f"{PID_PREFIX}{me.rank}"
    try:
        write_into_folder(_folder(), name, rank_file_text(me).encode())
        _state["rank_file"] = (name, rank_file_text(me))
    except (OSError, ValueError) as error:
        log.error("fr2perfetto: other ranks cannot wake this one: %s", error)


def _remove_rank_file() -> None:
    """Remove this rank's file, if it is still the one it wrote."""
    left = _state.get("rank_file")
    if not left:
        return
    _state["rank_file"] = None
    name, text = left
    with contextlib.suppress(OSError):
        folder_fd = _open_folder(_folder())
        try:
            handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
            try:
                same = os.read(handle, 4096) == text.encode()
            finally:
                os.close(handle)
            if same:
                os.unlink(name, dir_fd=folder_fd)
        finally:
            os.close(folder_fd)


def _wake_others() -> None:
    """Ask every rank within reach to dump now: the ranks of this run on this host by their request
    signal, NCCL ranks anywhere through their debug pipes."""
    folder, run = _folder(), _state.get("run")
    if run is not None:
        with contextlib.suppress(OSError):
            signal_ranks(folder, run)
    with contextlib.suppress(OSError):
        trigger_dumps(folder)
