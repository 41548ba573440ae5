"""Read a written trace back with Perfetto's own schema and check the invariants the UI relies on."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


@dataclass
class TraceSummary:
    # Processes and tracks are known by what names a rank ("rank 5" of the title "rank 5 · CULPRIT");
    # ``titles`` keeps what the UI shows.
    processes: dict[int, str] = field(default_factory=dict)  # pid -> process name (its rank part)
    titles: dict[str, str] = field(default_factory=dict)  # process name -> its full title
    process_labels: dict[str, list[str]] = field(default_factory=dict)  # process name -> labels
    tracks: dict[int, tuple[str, int | None]] = field(default_factory=dict)  # uuid -> (name, parent)
    slices: dict[int, list[tuple[int, int, str, dict[str, object]]]] = field(default_factory=lambda: defaultdict(list))
    instants: dict[int, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    flows: Counter[int] = field(default_factory=Counter)
    slice_flows: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (track, start) -> flow ids
    process_order: dict[str, int] = field(default_factory=dict)  # process name -> its sibling_order_rank
    counters: dict[int, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))  # uuid -> values
    counter_axes: dict[int, str] = field(default_factory=dict)  # counter track uuid -> its y axis share key
    explicit_process_order: bool = False  # the root descriptor (uuid 0) asks for it
    sequences: set[int] = field(default_factory=set)  # trusted packet sequence ids

    def process_of(self, uuid: int) -> str:
        """Name of the process a track belongs to."""
        while True:
            name, parent = self.tracks[uuid]
            if parent is None:
                return name
            uuid = parent

    def markers(self) -> dict[int, list[tuple[int, str]]]:
        """Instants that mark something (never issued, queued, a snapshot, a log line): not the enqueues
        on the tracks of the threads that enqueued ops."""
        return {u: items for u, items in self.instants.items() if not self.is_thread_track(u)}

    def is_thread_track(self, uuid: int) -> bool:
        return self.tracks[uuid][0].startswith(("thread ", "enqueued (thread"))

    def tracks_named(self, text: str) -> list[int]:
        return [uuid for uuid, (name, _) in self.tracks.items() if text in name]

    def all_slices(self) -> list[tuple[int, int, int, str, dict[str, object]]]:
        return [(uuid, *s) for uuid, items in self.slices.items() for s in items]


def _value(annotation: pb.DebugAnnotation, strings: dict[int, str]) -> object:
    kind = annotation.WhichOneof("value")
    if kind == "string_value_iid":
        return strings[annotation.string_value_iid]
    if kind is not None:
        return getattr(annotation, kind)
    if annotation.array_values:
        return [_value(v, strings) for v in annotation.array_values]
    return None


def read_trace(path: str) -> TraceSummary:
    """Parse ``path`` and assert: tracks described before use, interned ids defined before use (per
    packet sequence, each starting with cleared state),
    slices balanced and nested per track with time never going back, flows with two ends or more."""
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    summary = TraceSummary()
    # Interned ids are scoped to a packet sequence: each sequence has its own tables.
    tables: dict[int, tuple[dict[int, str], dict[int, str], dict[int, str]]] = {}
    open_slices: dict[int, list[tuple[int, str, dict[str, object]]]] = defaultdict(list)
    last_time: dict[int, int] = {}
    for packet in trace.packet:
        sequence = packet.trusted_packet_sequence_id
        if sequence not in tables:
            assert packet.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED, (
                f"sequence {sequence} does not start by clearing its incremental state"
            )
            tables[sequence] = ({}, {}, {})
            summary.sequences.add(sequence)
        event_names, arg_names, strings = tables[sequence]
        if packet.HasField("interned_data"):
            for item in packet.interned_data.event_names:
                event_names[item.iid] = item.name
            for item in packet.interned_data.debug_annotation_names:
                arg_names[item.iid] = item.name
            for item in packet.interned_data.debug_annotation_string_values:
                strings[item.iid] = item.str.decode()
        if packet.HasField("track_descriptor") and packet.track_descriptor.uuid == 0:
            root = packet.track_descriptor
            summary.explicit_process_order = root.process_ordering == pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
            continue
        if packet.HasField("track_descriptor"):
            desc = packet.track_descriptor
            assert desc.uuid not in summary.tracks, f"track {desc.uuid} described twice"
            parent = desc.parent_uuid if desc.HasField("parent_uuid") else None
            if parent is not None:
                assert parent in summary.tracks, "child track described before its parent"
            name = desc.process.process_name if desc.HasField("process") else desc.name
            if desc.HasField("process"):
                title, name = name, name.split(" · ")[0]
                summary.titles[name] = title
                assert desc.process.pid not in summary.processes, "two processes share a pid"
                summary.processes[desc.process.pid] = name
                summary.process_labels[name] = list(desc.process.process_labels)
                if desc.HasField("sibling_order_rank"):
                    summary.process_order[name] = desc.sibling_order_rank
            summary.tracks[desc.uuid] = (name, parent)
            if desc.HasField("counter"):
                summary.counter_axes[desc.uuid] = desc.counter.y_axis_share_key
        if packet.HasField("track_event"):
            event = packet.track_event
            uuid = event.track_uuid
            assert uuid in summary.tracks, f"event on undescribed track {uuid}"
            assert packet.timestamp >= last_time.get(uuid, 0), f"time goes back on track {uuid}"
            last_time[uuid] = packet.timestamp
            if event.type == pb.TrackEvent.TYPE_COUNTER:
                assert uuid in summary.counter_axes, f"a counter value on track {uuid}, which is no counter"
                summary.counters[uuid].append((packet.timestamp, event.double_counter_value))
                continue
            if event.type == pb.TrackEvent.TYPE_SLICE_END:
                assert open_slices[uuid], f"slice end without begin on track {uuid}"
                start, name, args = open_slices[uuid].pop()
                summary.slices[uuid].append((start, packet.timestamp, name, args))
                continue
            assert event.name_iid in event_names, "event name iid used before it was interned"
            name = event_names[event.name_iid]
            args = {}
            for a in event.debug_annotations:
                assert a.name_iid in arg_names, "arg name iid used before it was interned"
                args[arg_names[a.name_iid]] = _value(a, strings)
            for flow in event.flow_ids:
                summary.flows[flow] += 1
            if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
                open_slices[uuid].append((packet.timestamp, name, args))
                summary.slice_flows[(uuid, packet.timestamp)] = list(event.flow_ids)
            elif event.type == pb.TrackEvent.TYPE_INSTANT:
                summary.instants[uuid].append((packet.timestamp, name))
    assert not any(open_slices.values()), "unbalanced slices: some never end"
    assert all(count >= 2 for count in summary.flows.values()), "a flow id with a single end"
    return summary
