"""Write a timeline as a Perfetto protobuf trace (``.pftrace``), streamed one packet at a time.

Event names, argument names and string values are interned on one packet sequence, so a name
shared by thousands of ranks is written once. Track descriptors are built with Perfetto's protobuf
classes; slice packets, which come by the million, are encoded by ``wire`` from the same schema.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..timeline import ArgBlock, ArgValue, Slice, Track
from .wire import Field, varint

SEQUENCE_ID = 1

_TRACE_PACKET = Field(pb.Trace.DESCRIPTOR, "packet")
_P = pb.TracePacket.DESCRIPTOR
_TIMESTAMP = Field(_P, "timestamp")
_TRACK_EVENT = Field(_P, "track_event")
_INTERNED = Field(_P, "interned_data")
_SEQUENCE = Field(_P, "trusted_packet_sequence_id").int(SEQUENCE_ID)
_NEEDS_STATE = Field(_P, "sequence_flags").int(pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
_E = pb.TrackEvent.DESCRIPTOR
_TYPE = Field(_E, "type")
_BEGIN = _TYPE.int(pb.TrackEvent.TYPE_SLICE_BEGIN)
_END = _TYPE.int(pb.TrackEvent.TYPE_SLICE_END)
_INSTANT = _TYPE.int(pb.TrackEvent.TYPE_INSTANT)
_TRACK_UUID = Field(_E, "track_uuid")
_NAME_IID = Field(_E, "name_iid")
_ANNOTATION = Field(_E, "debug_annotations")
_FLOW = Field(_E, "flow_ids")
_CORRELATION = Field(_E, "correlation_id")
_A = pb.DebugAnnotation.DESCRIPTOR
_ARG_NAME = Field(_A, "name_iid")
_BOOL = Field(_A, "bool_value")
_INT = Field(_A, "int_value")
_DOUBLE = Field(_A, "double_value")
_STRING = Field(_A, "string_value_iid")
_ARRAY = Field(_A, "array_values")
_I = pb.InternedData.DESCRIPTOR
_EVENT_NAMES = Field(_I, "event_names")
_ARG_NAMES = Field(_I, "debug_annotation_names")
_STRINGS = Field(_I, "debug_annotation_string_values")
_IID = Field(pb.EventName.DESCRIPTOR, "iid")
_NAME = Field(pb.EventName.DESCRIPTOR, "name")
_STR = Field(pb.InternedString.DESCRIPTOR, "str")

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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
        self._out = out
        self._event_names: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._strings: dict[str, int] = {}
        # (arg name, value), or a block of them -> encoded DebugAnnotations, for what repeats
        self._encoded: dict[object, bytes] = {}
        self._new_interned: list[bytes] = []
        self.stats = TraceStats()
        first = pb.TracePacket(trusted_packet_sequence_id=SEQUENCE_ID)
        first.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        self._write(first.SerializeToString())

    def finish(self) -> None:
        """Nothing is buffered: every packet is already written."""

    def _write(self, packet: bytes) -> None:
        self._out.write(_TRACE_PACKET.tag + varint(len(packet)) + packet)

    def range_of_interest(self, start_ns: int) -> None:
        """Ask the UI to open on the time from ``start_ns`` on (e.g. just before the hang)."""
        packet = pb.TracePacket(trusted_packet_sequence_id=SEQUENCE_ID, timestamp=start_ns)
        packet.track_event_range_of_interest.start_us = start_ns // 1000
        self._write(packet.SerializeToString())

    def track(self, track: Track) -> None:
        """Describe a track; must come before any of its slices."""
        packet = pb.TracePacket(trusted_packet_sequence_id=SEQUENCE_ID)
        desc = packet.track_descriptor
        desc.uuid = track.uuid
        if track.parent is not None:
            desc.parent_uuid = track.parent
        if track.pid is not None:
            desc.process.pid = track.pid
            desc.process.process_name = track.name
            desc.process.process_labels.extend(track.labels)
            self.stats.processes += 1
        else:
            desc.name = track.name  # a global track (Findings) is shown above every process
            if track.parent is not None:
                desc.sibling_order_rank = track.order
        if track.description:
            desc.description = track.description
        # Ranks list their groups in one fixed order, the same on every rank.
        desc.child_ordering = pb.TrackDescriptor.EXPLICIT
        self._write(packet.SerializeToString())
        self.stats.tracks += 1

    def _iid(self, table: dict[str, int], text: str, kind: Field, text_field: Field) -> int:
        iid = table.get(text)
        if iid is None:
            iid = table[text] = len(table) + 1
            self._new_interned.append(kind.bytes(_IID.int(iid) + text_field.bytes(text.encode())))
        return iid

    def _annotation(self, name: str, value: ArgValue) -> bytes:
        if isinstance(value, bool):
            body = _BOOL.int(int(value))
        elif isinstance(value, int):
            body = _INT.int(value) if _INT64_MIN <= value <= _INT64_MAX else self._string(str(value))
        elif isinstance(value, float):
            body = _DOUBLE.double(value)
        elif isinstance(value, (list, tuple)):
            body = b"".join(_ARRAY.bytes(self._value(item)) for item in value)
        else:
            body = self._string(value)
        return _ANNOTATION.bytes(_ARG_NAME.int(self._iid(self._arg_names, name, _ARG_NAMES, _NAME)) + body)

    def _value(self, value: ArgValue) -> bytes:
        if isinstance(value, bool):
            return _BOOL.int(int(value))
        if isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
            return _INT.int(value)
        if isinstance(value, float):
            return _DOUBLE.double(value)
        return self._string(str(value))

    def _string(self, text: str) -> bytes:
        return _STRING.int(self._iid(self._strings, text, _STRINGS, _STR))

    def slices(self, track_uuid: int, slices: Iterable[Slice]) -> None:
        """Write non-overlapping slices of one track, in time order."""
        track = _TRACK_UUID.int(track_uuid)
        end_event = _TRACK_EVENT.bytes(_END + track)
        encoded = self._encoded
        for item in slices:
            parts = [_INSTANT if item.end is None else _BEGIN, track,
                     _NAME_IID.int(self._iid(self._event_names, item.name, _EVENT_NAMES, _NAME))]  # fmt: skip
            for name, value in item.args:
                if isinstance(value, ArgBlock):  # args that many slices share: encoded once for all
                    if value.encoded is None:
                        value.encoded = b"".join(self._annotation(n, v) for n, v in value.items)
                    parts.append(value.encoded)
                # Strings, stacks and small numbers (seq ids, sizes) repeat across ranks: encode once.
                elif isinstance(value, (str, tuple)) or (type(value) is int and 0 <= value < 1 << 32):
                    key = (name, value)
                    chunk = encoded.get(key)
                    if chunk is None:
                        chunk = encoded[key] = self._annotation(name, value)
                    parts.append(chunk)
                else:
                    parts.append(self._annotation(name, value))
            for flow in item.flow_ids:
                parts.append(_FLOW.fixed64(flow))
            if item.flow_ids:
                self.stats.flow_ids.update(item.flow_ids)
            if item.correlation_id is not None:
                parts.append(_CORRELATION.int(item.correlation_id))
            head = _SEQUENCE + _NEEDS_STATE + _TIMESTAMP.int(item.start)
            if self._new_interned:
                head += _INTERNED.bytes(b"".join(self._new_interned))
                self._new_interned.clear()
            self._write(head + _TRACK_EVENT.bytes(b"".join(parts)))
            if item.end is None:
                self.stats.markers += 1
                continue
            self._write(_SEQUENCE + _NEEDS_STATE + _TIMESTAMP.int(item.end) + end_event)
            self.stats.slices += 1
