"""Output on terminals and files that cannot encode everything: ASCII stand-ins, never a traceback.

Under ``LC_ALL=C`` or ``PYTHONIOENCODING=ascii`` (CI logs, cron, old terminals) the standard streams
encode ASCII only, and one middle dot in a report would end the command with ``UnicodeEncodeError``.
``tolerate_any_encoding`` makes such a stream write each character it cannot encode as a plain stand-in
(a dot for a middle dot, ``-`` for a dash or a line of a box) or, failing that, as ``?``.
"""

from __future__ import annotations

import codecs
from typing import TextIO

ERRORS = "fr2perfetto-ascii"
STAND_INS = {
    "\u00b7": ".", "\u2022": "*", "\u2014": "-", "\u2013": "-", "\u2026": "...", "\u2192": "->",
    "\u2190": "<-", "\u2500": "-", "\u2501": "-", "\u2502": "|", "\u2503": "|", "\u00d7": "x",
    "\u2265": ">=", "\u2264": "<=", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
    "\u2713": "ok", "\u2717": "x", "\u00a0": " ",
}  # fmt: skip


def _stand_in(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start : error.end]
    return "".join(STAND_INS.get(char, "?") for char in text), error.end


codecs.register_error(ERRORS, _stand_in)


def tolerate_any_encoding(stream: TextIO) -> None:
    """Make ``stream`` write what its encoding cannot hold as ASCII stand-ins (a UTF encoding: as it was)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        utf = codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        utf = False
    reconfigure = getattr(stream, "reconfigure", None)
    if not utf and reconfigure is not None:
        reconfigure(errors=ERRORS)
