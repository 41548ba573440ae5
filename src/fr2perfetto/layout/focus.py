"""Where the UI should open a trace: the first problem, framed, its culprits' tracks pinned and expanded.

The Perfetto UI's deep link (``#!/?url=...``) takes ``visStart``/``visEnd`` (the initial window, trace ns;
ignored unless within the trace), ``ts``/``dur`` (select the first slice with that start and duration:
the first finding's) and ``startupCommands`` (its stable automation commands,
``dev.perfetto.ExpandTracksByRegex`` and ``dev.perfetto.PinTracksByRegex``, each told to match names).
What a link needs is worked out when the trace is written and kept in the trace itself, as a metadata entry
(``ChromeEventBundle.metadata``, name ``fr2perfetto.focus``, a JSON value), so that ``fr2perfetto open``
builds the link from any trace it wrote, however long ago.
"""

from __future__ import annotations

import gzip
import json
import re
import urllib.parse
from typing import Any

from google.protobuf.message import DecodeError

from ..proto import perfetto_trace_pb2 as pb

METADATA_NAME = "fr2perfetto.focus"
FINDINGS_TRACK = "Findings"
MIN_MARGIN_NS = 1_000_000
READ_AHEAD_PACKETS = 64  # the focus is written among the first packets of a trace


def focus_of(
    window: list[int],
    selected: tuple[int, int] | None,
    bounds: tuple[int, int],
    culprit_processes: list[str],
) -> dict[str, Any] | None:
    """The focus of a trace: ``window`` holds the times to frame (where each rank's part in the first
    finding's op begins, as drawn), ``selected`` the (start, duration) of that finding's slice, ``bounds``
    the first and last time the trace draws (the UI ignores a window that leaves them),
    ``culprit_processes`` the culprits' process names. None: nothing to frame."""
    if not window:
        return None
    first, last = min(window), max(window)
    margin = max(MIN_MARGIN_NS, (last - first) // 5)
    lo, hi = bounds
    start, end = max(lo, first - margin), min(hi, last + margin)
    if start >= end:
        start, end = lo, hi
    # The UI titles a process "<name> <pid>": the pid may follow the name.
    names = "|".join(_escape(name) for name in [FINDINGS_TRACK, *dict.fromkeys(culprit_processes)])
    pattern = f"^({names})( [0-9]+)?$"
    focus: dict[str, Any] = {"visStart": start, "visEnd": end, "pin": pattern, "expand": pattern}
    if selected is not None:
        focus["select"] = {"ts": selected[0], "dur": selected[1]}
    return focus


def _escape(text: str) -> str:
    """``text`` as a regular expression that matches it, escaping only what is special in one (the UI's
    JavaScript RegExp and Python's agree on those; an escaped space is an error in JavaScript's unicode
    mode)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


def metadata_packet(focus: dict[str, Any], sequence_id: int) -> bytes:
    packet = pb.TracePacket(trusted_packet_sequence_id=sequence_id)
    entry = packet.chrome_events.metadata.add()
    entry.name = METADATA_NAME
    entry.string_value = json.dumps(focus, sort_keys=True)
    encoded: bytes = packet.SerializeToString()  # perfetto's schema is untyped (Any): said here
    return encoded


def read_focus(path: str) -> dict[str, Any] | None:
    """The focus kept in a trace fr2perfetto wrote (None: none, or not such a trace), read from its
    first packets only."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            for _ in range(READ_AHEAD_PACKETS):
                tag = handle.read(1)
                if tag != b"\x0a":  # Trace.packet, length-delimited
                    return None
                size = _varint(handle)
                if size is None or size > 1 << 24:
                    return None
                packet = pb.TracePacket()
                packet.ParseFromString(handle.read(size))
                for entry in packet.chrome_events.metadata:
                    if entry.name == METADATA_NAME:
                        return _checked(json.loads(entry.string_value))
    except (OSError, ValueError, EOFError, DecodeError):
        return None
    return None


def _checked(value: Any) -> dict[str, Any] | None:
    """A focus as ``focus_of`` makes it, or None (a trace edited or made by something else)."""
    if not isinstance(value, dict):
        return None
    times_ok = all(type(value.get(key)) is int for key in ("visStart", "visEnd"))
    patterns_ok = all(isinstance(value.get(key), str) for key in ("pin", "expand"))
    select = value.get("select")
    select_ok = select is None or (
        isinstance(select, dict) and all(type(select.get(key)) is int for key in ("ts", "dur"))
    )
    return value if times_ok and patterns_ok and select_ok else None


def _varint(handle: Any) -> int | None:
    shift = result = 0
    while shift < 64:
        byte: bytes = handle.read(1)
        if not byte:
            return None
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return result
        shift += 7
    return None


def link_arguments(focus: dict[str, Any] | None) -> str:
    """The deep link's arguments after ``url=...``: window, selection, startup commands."""
    if not focus:
        return ""
    parts = [f"visStart={int(focus['visStart'])}", f"visEnd={int(focus['visEnd'])}"]
    select = focus.get("select") or {}
    if select:  # the UI selects the first slice of the trace with this start and duration
        parts += [f"ts={int(select['ts'])}", f"dur={int(select['dur'])}"]
    # "name": match track names; without it, newer UIs stop to ask name or path.
    commands = [
        {"id": "dev.perfetto.ExpandTracksByRegex", "args": [focus["expand"], "name"]},
        {"id": "dev.perfetto.PinTracksByRegex", "args": [focus["pin"], "name"]},
    ]
    parts.append("startupCommands=" + urllib.parse.quote(json.dumps(commands, separators=(",", ":")), safe=""))
    return "&" + "&".join(parts)
