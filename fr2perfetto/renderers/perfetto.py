"""Write a timeline as a Perfetto protobuf trace (``.pftrace``), streamed one packet at a time.

Event names, argument names and string values are interned on one packet sequence, so a name
shared by thousands of ranks is written once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from ..timeline import ArgValue, Slice, Track

SEQUENCE_ID = 1


@dataclass(slots=True)
class TraceStats:
    """What was written: the counts a person checks in the UI."""

    processes: int = 0
    tracks: int = 0
    slices: int = 0
    markers: int = 0
    flow_ids: set[int] = field(default_factory=set)

    @property
    def flows(self) -> int:
        return len(self.flow_ids)


class PerfettoWriter:
    """Streams tracks and their slices to a binary file as Perfetto ``TracePacket``s."""

    def __init__(self, out: IO[bytes]) -> None:
        self._builder = StreamingTraceProtoBuilder(out)
        self._event_names: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._string_values: dict[str, int] = {}
        self._started = False
        self.stats = TraceStats()

    def _packet(self) -> pb.TracePacket:
        packet = self._builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if not self._started:
            packet.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self._started = True
        return packet

    def range_of_interest(self, start_ns: int) -> None:
        """Ask the UI to open on the time from ``start_ns`` on (e.g. just before the hang)."""
        packet = self._packet()
        packet.timestamp = start_ns
        packet.track_event_range_of_interest.start_us = start_ns // 1000
        self._builder.write_packet(packet)

    def track(self, track: Track) -> None:
        """Describe a track; must come before any of its slices."""
        packet = self._packet()
        desc = packet.track_descriptor
        desc.uuid = track.uuid
        if track.parent is not None:
            desc.parent_uuid = track.parent
        if track.parent is None and track.pid is None:
            desc.name = track.name  # a global track (Findings): shown above every process
        elif track.pid is not None:
            desc.process.pid = track.pid
            desc.process.process_name = track.name
            desc.process.process_labels.extend(track.labels)
            self.stats.processes += 1
        else:
            desc.name = track.name
            desc.sibling_order_rank = track.order
        if track.description:
            desc.description = track.description
        # Ranks list their groups in one fixed order, the same on every rank.
        desc.child_ordering = pb.TrackDescriptor.EXPLICIT
        self._builder.write_packet(packet)
        self.stats.tracks += 1

    def slices(self, track_uuid: int, slices: Iterable[Slice]) -> None:
        """Write non-overlapping slices of one track, in time order."""
        for item in slices:
            begin = self._packet()
            begin.timestamp = item.start
            begin.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            event = begin.track_event
            event.track_uuid = track_uuid
            event.type = pb.TrackEvent.TYPE_INSTANT if item.end is None else pb.TrackEvent.TYPE_SLICE_BEGIN
            event.name_iid = self._intern(self._event_names, item.name, begin.interned_data.event_names)
            for name, value in item.args:
                annotation = event.debug_annotations.add()
                annotation.name_iid = self._intern(self._arg_names, name, begin.interned_data.debug_annotation_names)
                self._set_value(annotation, value, begin.interned_data)
            if item.flow_ids:
                event.flow_ids.extend(item.flow_ids)
                self.stats.flow_ids.update(item.flow_ids)
            if item.correlation_id is not None:
                event.correlation_id = item.correlation_id
            self._builder.write_packet(begin)
            if item.end is None:
                self.stats.markers += 1
                continue
            end = self._packet()
            end.timestamp = item.end
            end.track_event.track_uuid = track_uuid
            end.track_event.type = pb.TrackEvent.TYPE_SLICE_END
            self._builder.write_packet(end)
            self.stats.slices += 1

    def _set_value(self, annotation: pb.DebugAnnotation, value: ArgValue, interned: pb.InternedData) -> None:
        if isinstance(value, bool):
            annotation.bool_value = value
        elif isinstance(value, int):
            annotation.int_value = value
        elif isinstance(value, float):
            annotation.double_value = value
        elif isinstance(value, list):
            for item in value:
                self._set_value(annotation.array_values.add(), item, interned)
        else:
            annotation.string_value_iid = self._intern(
                self._string_values, value, interned.debug_annotation_string_values
            )

    @staticmethod
    def _intern(table: dict[str, int], text: str, new_entries: object) -> int:
        iid = table.get(text)
        if iid is None:
            iid = table[text] = len(table) + 1
            entry = new_entries.add()  # type: ignore[attr-defined]
            entry.iid = iid
            if hasattr(entry, "name"):
                entry.name = text
            else:
                entry.str = text.encode()
        return iid
