"""Draw a trace written by fr2perfetto as an SVG picture (for the README), read back with Perfetto's schema.

    python samples/picture.py TRACE.pftrace OUT.svg

A sketch of what ui.perfetto.dev shows: a row per track (the Findings track first, then each rank's
thread, stream and counter tracks), slices as boxes, enqueues as ticks, markers as diamonds, counters
as step lines on one scale, flows as lines (between the ranks' slices of one op, and fainter, from
each enqueue to what ran).
"""

from __future__ import annotations

import colorsys
import html
import itertools
import sys
import zlib
from collections import defaultdict

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from fr2perfetto.layout.streams import LAUNCH_FLOW_BASE

WIDTH, ROW, LABEL = 1100, 16, 290


def _colour(name: str) -> str:
    if name.startswith(("⚠", "✗")) or name.startswith(("missing", "deadlock", "p2p", "no_dump")):
        return "#d9534f"
    if name.startswith(("⏳", "⏸", "⛓")):
        return "#f0ad4e"
    hue = zlib.crc32(name.split(" #")[0].encode()) % 360
    red, green, blue = colorsys.hls_to_rgb(hue / 360, 0.62, 0.55)  # hex: every SVG renderer reads it
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


def draw(trace_path: str) -> str:
    trace = pb.Trace()
    with open(trace_path, "rb") as f:
        trace.ParseFromString(f.read())
    names: dict[int, str] = {}
    tracks: dict[int, tuple[str, int | None]] = {}
    rows: list[int] = []
    slices: dict[int, list[tuple[int, int, str, list[int]]]] = defaultdict(list)
    instants: dict[int, list[tuple[int, str, list[int]]]] = defaultdict(list)
    counters: dict[int, list[tuple[int, float]]] = defaultdict(list)
    open_: dict[int, list[tuple[int, str, list[int]]]] = defaultdict(list)
    for p in trace.packet:
        for item in p.interned_data.event_names:
            names[item.iid] = item.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            label = d.process.process_name if d.HasField("process") else d.name
            tracks[d.uuid] = (label, d.parent_uuid if d.HasField("parent_uuid") else None)
            if d.HasField("parent_uuid"):
                rows.append(d.uuid)
        if p.HasField("track_event"):
            e = p.track_event
            if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
                open_[e.track_uuid].append((p.timestamp, names[e.name_iid], list(e.flow_ids)))
            elif e.type == pb.TrackEvent.TYPE_SLICE_END:
                start, name, flows = open_[e.track_uuid].pop()
                slices[e.track_uuid].append((start, p.timestamp, name, flows))
            elif e.type == pb.TrackEvent.TYPE_INSTANT:
                instants[e.track_uuid].append((p.timestamp, names[e.name_iid], list(e.flow_ids)))
            elif e.type == pb.TrackEvent.TYPE_COUNTER:
                counters[e.track_uuid].append((p.timestamp, e.double_counter_value))
    times = [t for items in slices.values() for s in items for t in s[:2]]
    t0, t1 = min(times), max(times)
    scale = (WIDTH - LABEL - 10) / max(t1 - t0, 1)

    def x(t: int) -> float:
        return LABEL + (t - t0) * scale

    highest = max((v for points in counters.values() for _, v in points), default=0.0) or 1.0

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{ROW * (len(rows) + 2)}" '
        'font-family="sans-serif" font-size="10">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    ends: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for row, uuid in enumerate(rows, start=1):
        y = row * ROW
        name, parent = tracks[uuid]
        while parent in tracks and tracks[parent][1] is not None:  # up to the rank's process
            parent = tracks[parent][1]
        process = tracks[parent][0] if parent in tracks else ""
        label = f"{process} · {name}" if process and process != "Findings" and "· rank" not in name else name
        out.append(f'<text x="4" y="{y + 12}">{html.escape(label[:50])}</text>')
        out.append(f'<line x1="{LABEL}" y1="{y + ROW}" x2="{WIDTH}" y2="{y + ROW}" stroke="#eee"/>')
        for start, end, sname, flows in slices[uuid]:
            w = max(x(end) - x(start), 1.5)
            out.append(
                f'<rect x="{x(start):.1f}" y="{y + 2}" width="{w:.1f}" height="{ROW - 4}" '
                f'fill="{_colour(sname)}"><title>{html.escape(sname)}</title></rect>'
            )
            if w > 60:
                out.append(
                    f'<text x="{x(start) + 3:.1f}" y="{y + 12}" font-size="9">{html.escape(sname[: int(w / 6)])}</text>'
                )
            for flow in flows:
                ends[flow].append((x(start), y + ROW / 2))
        for t, iname, flows in instants[uuid]:
            cx, cy = x(t), y + ROW / 2
            if iname[:1].isascii():  # an enqueue, on its thread's track: a tick
                out.append(
                    f'<line x1="{cx:.1f}" y1="{y + 3}" x2="{cx:.1f}" y2="{y + ROW - 3}" stroke="#777">'
                    f"<title>{html.escape(iname)}</title></line>"
                )
            else:  # a marker: never issued, queued behind a held stream, a snapshot, a log line
                out.append(
                    f'<path d="M{cx:.1f},{cy - 6} l6,6 l-6,6 l-6,-6 z" fill="{_colour(iname)}">'
                    f"<title>{html.escape(iname)}</title></path>"
                )
            for flow in flows:
                ends[flow].append((cx, cy))
        if counters[uuid]:

            def level(value: float, y: int = y) -> str:
                return f"{y + ROW - 2 - (ROW - 4) * value / highest:.1f}"

            steps, before = [], 0.0
            for t, value in sorted(counters[uuid]):
                steps += [f"{x(t):.1f},{level(before)}", f"{x(t):.1f},{level(value)}"]
                before = value
            steps.append(f"{WIDTH - 10},{level(before)}")
            out.append(f'<polyline points="{" ".join(steps)}" fill="none" stroke="#8e44ad" stroke-width="1.2"/>')
    for flow, points in ends.items():
        points.sort()
        launch = flow >= LAUNCH_FLOW_BASE  # from an enqueue to what ran: fainter than the flows between ranks
        for (ax, ay), (bx, by) in itertools.pairwise(points):
            out.append(
                f'<line x1="{ax:.1f}" y1="{ay:.1f}" x2="{bx:.1f}" y2="{by:.1f}" '
                f'stroke="{"#999" if launch else "#555"}" stroke-width="0.6" opacity="{0.35 if launch else 0.6}"/>'
            )
    out.append("</svg>")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[2], "w") as f:
        f.write(draw(sys.argv[1]))
