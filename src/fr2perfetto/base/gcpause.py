"""Pause Python's cyclic garbage collector while a job is read and converted.

A large job is millions of long-lived objects (entries, tuples, strings) that hold no reference
cycles. Each time enough of them have been made, the collector walks all that survive, so with it
running, reading 256 dumps takes several times as long as unpickling them. Reference counting still
frees everything as usual; cycles made meanwhile are collected when the pause ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block (if it was on); restore it after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
