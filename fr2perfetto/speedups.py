"""The optional C speed-ups (``_speedups.c``), or None where they could not be built.

Each function in them has a Python twin that gives the same result; callers use the C one when
``SPEEDUPS`` is not None. Tests turn them off by setting a module's ``_speedups`` to None.
"""

from __future__ import annotations

from types import ModuleType

SPEEDUPS: ModuleType | None
try:
    from . import _speedups as SPEEDUPS  # type: ignore[attr-defined,no-redef]
except ImportError:  # installed without a C compiler
    SPEEDUPS = None
