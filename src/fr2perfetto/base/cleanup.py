"""What to remove and kill if the command is stopped by a signal: partial files and worker processes.

A signal can land anywhere, inside a callback whose exception Python ignores among them, so stopping
does not rely on unwinding: the handler (installed by the command line) removes every partial file
and kills every worker registered here, then ends the process. Only the process that registered them
acts on them: a forked worker inherits the handler, never the right to delete its parent's files.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from functools import partial
from multiprocessing.process import BaseProcess
from typing import TypeVar

_owner = os.getpid()
_paths: dict[str, None] = {}
_process_sources: list[Callable[[], list[BaseProcess]]] = []


_Made = TypeVar("_Made")


def _registered(folder: str, prefix: str, suffix: str, make: Callable[[str], _Made]) -> tuple[str, _Made]:
    """A fresh path in ``folder``, registered, then made by ``make(path)``: a signal at any moment finds
    it registered or not yet made. The caller forgets it (``_paths.pop``) once it is gone."""
    while True:
        path = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}{suffix}")
        _paths[path] = None
        try:
            return path, make(path)
        except BaseException as error:
            _paths.pop(path, None)
            if not isinstance(error, FileExistsError):  # a name taken already: another one
                raise


def _new_file(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)


@contextlib.contextmanager
def scratch_file(folder: str, prefix: str, suffix: str) -> Iterator[tuple[int, str]]:
    """A new private file in ``folder`` (its descriptor and path), removed if the command is stopped
    while the block runs; the block moves or removes it, and only then is it forgotten."""
    path, handle = _registered(folder, prefix, suffix, _new_file)
    try:
        yield handle, path
    finally:
        _paths.pop(path, None)


@contextlib.contextmanager
def scratch_folder(folder: str, prefix: str) -> Iterator[str]:
    """A new private folder in ``folder``, removed with what it holds when the block ends, or at once
    if the command is stopped; forgotten only once it is removed."""
    path, _ = _registered(folder, prefix, "", partial(os.mkdir, mode=0o700))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _paths.pop(path, None)


@contextlib.contextmanager
def worker_processes(source: Callable[[], list[BaseProcess]]) -> Iterator[None]:
    """While the block runs, the processes ``source()`` lists are killed if the command is stopped."""
    _process_sources.append(source)
    try:
        yield
    finally:
        _process_sources.remove(source)


def abandon() -> None:
    """Kill the registered workers and remove the registered partial files (in the registering process)."""
    if os.getpid() != _owner:
        return
    killed: list[BaseProcess] = []
    for source in list(_process_sources):
        with contextlib.suppress(Exception):
            for process in source():
                with contextlib.suppress(Exception):
                    process.kill()
                    killed.append(process)
    # A worker killed a moment ago may still be writing its part file: a folder removed before it has
    # ended could be made non-empty again, and be left behind.
    deadline = time.monotonic() + WORKER_END_SECONDS
    for process in killed:
        with contextlib.suppress(Exception):
            process.join(max(0.0, deadline - time.monotonic()))
    for path in list(_paths):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
                if os.path.isdir(path):  # a file appeared while it was removed: once more
                    shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)


WORKER_END_SECONDS = 2.0  # how long a stopped command waits for its killed workers to end, at most
