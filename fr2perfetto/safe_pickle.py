"""Load a pickle that may hold plain data only, without ever running code from it.

Flight Recorder dumps are protocol-2 pickles of dicts, lists, tuples, strings, numbers, booleans
and None. Anything that needs a class or a callable (``GLOBAL``, ``STACK_GLOBAL``, ``REDUCE`` of a
looked-up callable, ``INST``, ``OBJ``, extension codes, persistent ids) is refused before it can run.
"""

from __future__ import annotations

import io
import pickle


class RefusedPickle(pickle.UnpicklingError):
    """The pickle asked for something other than plain data."""


class PlainDataUnpickler(pickle.Unpickler):
    """An unpickler whose every route to a class or callable raises ``RefusedPickle``."""

    def find_class(self, module: str, name: str) -> object:
        # Every opcode that could call code gets its callable from here (or persistent_load).
        raise RefusedPickle(f"refused: the pickle asks for {module}.{name}; a dump holds plain data only")

    def persistent_load(self, pid: object) -> object:
        raise RefusedPickle("refused: the pickle uses a persistent id; a dump holds plain data only")


def loads_plain(data: bytes) -> object:
    """Unpickle ``data`` if it holds plain data only; raise ``pickle.UnpicklingError`` otherwise."""
    return PlainDataUnpickler(io.BytesIO(data)).load()
