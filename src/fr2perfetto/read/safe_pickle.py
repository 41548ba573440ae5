"""Load a pickle that may hold plain data only, without ever running code from it.

Flight Recorder dumps are protocol-2 pickles of dicts, lists, tuples, strings, numbers, booleans
and None. Anything that needs a class or a callable (``GLOBAL``, ``STACK_GLOBAL``, ``REDUCE`` of a
looked-up callable, ``INST``, ``OBJ``, extension codes, persistent ids) is refused before it can run.

A few bytes can also ask the unpickler for gigabytes (a memo index of 2**32 makes it allocate and
clear a table that large), so on Linux the load runs with a cap on the address space it may add. And
a few bytes can describe a tuple nested a million deep, or one that holds the same tuple twice thirty
times over: ``pickle_shape`` measures what a pickle would build before anything is built.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator

from .pickle_shape import check as check_shape

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

BASE_HEADROOM = 512 * 1024 * 1024
HEADROOM_PER_BYTE = 64  # unpickled dumps take about 10 times their file size


class RefusedPickle(pickle.UnpicklingError):
    """The pickle asked for something other than plain data."""


class PlainDataUnpickler(pickle.Unpickler):
    """An unpickler whose every route to a class or callable raises ``RefusedPickle``."""

    def find_class(self, module: str, name: str) -> object:
        # Every opcode that could call code gets its callable from here (or persistent_load).
        raise RefusedPickle(f"refused: the pickle asks for {module}.{name}; a dump holds plain data only")

    def persistent_load(self, pid: object) -> object:
        raise RefusedPickle("refused: the pickle uses a persistent id; a dump holds plain data only")


def _address_space() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def memory_headroom(limit: int) -> Iterator[None]:
    """Let the process grow by at most ``limit`` bytes of address space (Linux); else a no-op."""
    current = _address_space() if resource is not None else None
    if current is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    wanted = current + limit
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft <= wanted:
        yield  # an existing, tighter cap stays
        return
    resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def loads_plain(data: bytes) -> object:
    """Unpickle ``data`` if it holds plain data only; raise ``pickle.UnpicklingError`` otherwise.

    ``MemoryError`` means the pickle asked for far more memory than a dump of its size needs.
    """
    why = check_shape(data)
    if why is not None:
        raise RefusedPickle(why)
    # A buffered reader lets the C unpickler take the bytes in large chunks; a bare BytesIO makes
    # it call read() once per opcode, which takes three times as long.
    stream = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 17)
    with memory_headroom(BASE_HEADROOM + HEADROOM_PER_BYTE * len(data)):
        return PlainDataUnpickler(stream).load()
