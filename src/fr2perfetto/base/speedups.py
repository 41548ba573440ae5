"""The optional C speed-ups (``_speedups.c``), or None where they could not be built or are turned off.

Each function in them has a Python twin that gives the same result; callers use the C one when
``SPEEDUPS`` is not None. ``FR2PERFETTO_NO_SPEEDUPS=1`` turns them off (to rule them out when
something looks wrong); tests turn them off by setting a module's ``_speedups`` to None.
"""

from __future__ import annotations

import os
from types import ModuleType

SPEEDUPS: ModuleType | None = None
# Why SPEEDUPS is None (empty while they are on): `fr2perfetto --version` says it, and how to get them.
TURNED_OFF = "pure Python, as FR2PERFETTO_NO_SPEEDUPS asks"
NOT_BUILT = "not built when fr2perfetto was installed"
OFF_BECAUSE = TURNED_OFF
if os.environ.get("FR2PERFETTO_NO_SPEEDUPS", "") in ("", "0"):
    try:
        from .. import _speedups as SPEEDUPS  # type: ignore[no-redef]

        OFF_BECAUSE = ""
    except ImportError as error:  # installed without a C compiler, or built for another Python
        import importlib.util

        SPEEDUPS = None
        # No module file at all: nothing was compiled. A file that does not load (built against another
        # Python, a missing library) says why in its error.
        built = importlib.util.find_spec("fr2perfetto._speedups") is not None
        OFF_BECAUSE = f"built but not loadable: {error}" if built else NOT_BUILT
