"""Write a timeline as Chrome's JSON Trace Event Format (``.json``), for tools that read only that.

Same processes, tracks (as threads), slices, args, markers, flows and findings as the Perfetto trace,
as far as the format carries them. What it loses: interning (files are larger), track descriptions,
correlation ids, the UI's opening range; a flow joining N slices becomes N-1 ``s``/``f`` pairs; times
are whole microseconds (a start rounded up, an end down, so that what touches or nests still does).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import IO

from ..layout.scene import ArgValue, Slice, Track
from .perfetto import TraceStats

FINDINGS_PID = 0


def _json_value(value: ArgValue) -> object:
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


class ChromeJsonWriter:
    """Streams events into one JSON object ``{"traceEvents": [...]}``; flows are written at the end."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._first = True
        self._where: dict[int, tuple[int, int]] = {}  # track uuid -> (pid, tid)
        self._next_tid: dict[int, int] = {}
        self._flows: dict[int, list[tuple[int, int, int]]] = {}
        self._thread_names: dict[tuple[int, int], str] = {}
        self.stats = TraceStats()
        out.write(b'{"displayTimeUnit": "ns", "traceEvents": [\n')

    def _event(self, event: dict[str, object]) -> None:
        self._out.write((b"" if self._first else b",\n") + json.dumps(event, ensure_ascii=False).encode())
        self._first = False

    def range_of_interest(self, start_ns: int) -> None:
        """Not expressible in this format."""

    def metadata(self, packet: bytes) -> None:
        """Perfetto's metadata has no place in this format: the link opens it whole."""

    def explicit_process_order(self) -> None:
        """Processes are ordered by their ``process_sort_index`` in this format: nothing to ask."""

    def track(self, track: Track) -> None:
        self.stats.tracks += 1
        if track.pid is not None or track.parent is None:  # a rank's process, or the Findings track
            pid = track.pid if track.pid is not None else FINDINGS_PID
            self._where[track.uuid] = (pid, 0)
            self._event({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": track.name}})
            order = track.order if track.pid is not None else -1
            self._event({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": order}})
            if track.labels:
                self._event(
                    {"ph": "M", "name": "process_labels", "pid": pid, "args": {"labels": ",".join(track.labels)}}
                )
            if track.pid is not None:
                self.stats.processes += 1
            return
        pid, parent_tid = self._where[track.parent]
        if track.counter_unit is not None:  # a counter is its process's, by name: no thread of its own
            self._where[track.uuid] = (pid, 0)
            return
        tid = self._next_tid.get(pid, 0) + 1
        self._next_tid[pid] = tid
        self._where[track.uuid] = (pid, tid)
        name = track.name
        if parent_tid:  # a stream under a group's (a pair's sends and recvs): named with the group
            name = f"{self._thread_names[(pid, parent_tid)]} {track.name}"
        self._thread_names[(pid, tid)] = name
        self._event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        self._event({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})

    def events(self, track: Track) -> None:
        """A track's slices and instants (nested ones as complete events that nest), or its counter's
        values, as counter events of its process."""
        if track.points:
            pid, _ = self._where[track.uuid]
            for at, value in track.points:
                self._event({"ph": "C", "name": track.name, "pid": pid, "ts": at // 1000, "args": {track.counter_unit
                             or "value": value}})  # fmt: skip
            return
        self.slices(track.uuid, track.slices)
        if track.enqueues:
            self.stats.recount_as_enqueues(len(track.slices))

    def slices(self, track_uuid: int, slices: Iterable[Slice]) -> None:
        """Slices as complete events in whole microseconds: a start rounded up, an end rounded down, so
        that slices that touch or nest in nanoseconds still touch or nest (an epoch time in microseconds
        with a fraction is past a double's precision, and would overlap its neighbour by a rounding)."""
        pid, tid = self._where[track_uuid]
        for item in slices:
            ts = -(-item.start // 1000)
            event: dict[str, object] = {"name": item.name, "pid": pid, "tid": tid, "ts": ts}
            event["args"] = {n: _json_value(v) for n, v in item.args}
            if item.end is None:
                event.update(ph="i", s="t")
                self.stats.markers += 1
            else:
                event.update(ph="X", dur=max(0, item.end // 1000 - ts))
                self.stats.slices += 1
            self._event(event)
            for flow in item.flow_ids:
                self._flows.setdefault(flow, []).append((ts, pid, tid))

    def finish(self) -> None:
        """Write the flows, as s/f pairs joining each slice of a flow to the next one in time."""
        pair = 0
        for flow, ends in self._flows.items():
            self.stats.flow_ids.add(flow)
            ends.sort()
            for (ts_a, pid_a, tid_a), (ts_b, pid_b, tid_b) in itertools.pairwise(ends):
                pair += 1
                common = {"name": "flow", "cat": "fr2perfetto", "id": pair}
                self._event({**common, "ph": "s", "ts": ts_a, "pid": pid_a, "tid": tid_a})
                self._event({**common, "ph": "f", "bp": "e", "ts": ts_b, "pid": pid_b, "tid": tid_b})
        self._out.write(b"\n]}\n")
