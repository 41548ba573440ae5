"""The optional C speed-ups (``_speedups.c``), or None where they could not be built or are turned off.

Each function in them has a Python twin that gives the same result; callers use the C one when
``SPEEDUPS`` is not None. ``FR2PERFETTO_NO_SPEEDUPS=1`` turns them off (to rule them out when
something looks wrong); tests turn them off by setting a module's ``_speedups`` to None.
"""

from __future__ import annotations

import os
from types import ModuleType

SPEEDUPS: ModuleType | None = None
if os.environ.get("FR2PERFETTO_NO_SPEEDUPS", "") in ("", "0"):
    try:
        from .. import _speedups as SPEEDUPS  # type: ignore[attr-defined, no-redef]
    except ImportError:  # installed without a C compiler
        SPEEDUPS = None
