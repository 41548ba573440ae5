"""Write a timeline as a Perfetto protobuf trace (``.pftrace``), streamed one packet at a time.

Event names, argument names and string values are interned on one packet sequence, so a name
shared by thousands of ranks is written once. Track descriptors are built with Perfetto's protobuf
classes; slice packets, which come by the million, are encoded by ``wire`` from the same schema, and
the common ones of a rank laid out from rows (``layout.rows``) by ``_speedups.encode_rows`` in C, byte for
byte the same.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, NamedTuple, TypeVar

from ..base.model import Entry, Frame
from ..base.speedups import SPEEDUPS as _speedups
from ..layout.rows import SliceRows
from ..layout.scene import ArgValue, Slice, SliceLook, Track, thread_label
from ..proto import perfetto_trace_pb2 as pb
from .wire import Field, varint

SEQUENCE_ID = 1

_TRACE_PACKET = Field(pb.Trace.DESCRIPTOR, "packet")
_P = pb.TracePacket.DESCRIPTOR
_TIMESTAMP = Field(_P, "timestamp")
_TRACK_EVENT = Field(_P, "track_event")
_INTERNED = Field(_P, "interned_data")
_NEEDS_STATE = Field(_P, "sequence_flags").int(pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
_E = pb.TrackEvent.DESCRIPTOR
_TYPE = Field(_E, "type")
_BEGIN = _TYPE.int(pb.TrackEvent.TYPE_SLICE_BEGIN)
_END = _TYPE.int(pb.TrackEvent.TYPE_SLICE_END)
_INSTANT = _TYPE.int(pb.TrackEvent.TYPE_INSTANT)
_COUNTER = _TYPE.int(pb.TrackEvent.TYPE_COUNTER)
_DOUBLE_COUNTER = Field(_E, "double_counter_value")
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
_SMALL_LENGTH = [varint(n) for n in range(128)]
_LENGTHS = [varint(n) for n in range(16384)]  # a slice packet's length is always below 16 KB
_NINE_BYTES = 1 << 56  # the smallest number whose varint takes nine bytes
_TRACE_PACKET_TAG, _TRACK_EVENT_TAG = _TRACE_PACKET.tag, _TRACK_EVENT.tag
_FLOW_TAG, _CORRELATION_TAG = _FLOW.tag, _CORRELATION.tag
_CALLSTACK = Field(_E, "callstack")
_INLINE = pb.TrackEvent.InlineCallstack.DESCRIPTOR
_CALL_FRAME = Field(_INLINE, "frames")
_FRAME_FIELDS = _INLINE.fields_by_name["frames"].message_type
_FUNCTION, _SOURCE, _LINE = (Field(_FRAME_FIELDS, n) for n in ("function_name", "source_file", "line_number"))


def _callstack(frames: tuple[Frame, ...]) -> bytes:
    """An inline callstack (``TrackEvent.callstack``), outermost frame first as the UI lists them."""
    body = b"".join(
        _CALL_FRAME.bytes(_FUNCTION.bytes(f.name.encode()) + _SOURCE.bytes(f.filename.encode()) + _LINE.int(f.line))
        for f in reversed(frames)
    )
    return _CALLSTACK.bytes(body)


_pack_u64 = struct.Struct("<Q").pack
_pack_double = struct.Struct("<d").pack
_K = TypeVar("_K")


class _TrackCodes(NamedTuple):
    """The encoded bits every slice of one track shares."""

    begin: bytes  # a begin event's type and track
    instant: bytes
    end_event: bytes  # a whole end event, framed as TracePacket.track_event


def _framed(packet: bytes) -> bytes:
    """A packet as the trace file holds it: a ``Trace.packet`` field."""
    size = len(packet)
    return _TRACE_PACKET_TAG + (_LENGTHS[size] if size < 16384 else varint(size)) + packet


@dataclass(slots=True)
class TraceStats:
    """What was written: the counts a person checks in the UI."""

    processes: int = 0
    tracks: int = 0
    slices: int = 0
    markers: int = 0  # instants that mark a problem, a snapshot, a log line
    enqueues: int = 0  # instants on the threads' tracks
    flow_ids: set[int] = field(default_factory=set)  # the flows of looks (ops, findings)
    launches: int = 0  # each from a rank's enqueue of an op to where it ran (a slice's own flows)

    @property
    def flows(self) -> int:
        return len(self.flow_ids) + self.launches

    def add(self, other: TraceStats) -> None:
        """Count what another writer wrote of the same trace."""
        self.processes += other.processes
        self.tracks += other.tracks
        self.slices += other.slices
        self.markers += other.markers
        self.enqueues += other.enqueues
        self.flow_ids |= other.flow_ids
        self.launches += other.launches

    def recount_as_enqueues(self, instants: int) -> None:
        """A thread's track was written: its instants, counted as markers by the slice writer (which
        does not know what they mean), are enqueues."""
        self.markers -= instants
        self.enqueues += instants


class PerfettoWriter:
    """Streams tracks and their slices to a binary file as Perfetto ``TracePacket``s.

    Every writer owns one packet sequence (``sequence_id``) and its interning state, so several
    writers may produce parts of one trace independently; the parts are concatenated.
    """

    def __init__(self, out: IO[bytes], sequence_id: int = SEQUENCE_ID) -> None:
        self._out = out
        self._sequence_id = sequence_id
        self._token = object()  # marks what this writer encoded: iids mean nothing to another writer
        self._sequence = Field(_P, "trusted_packet_sequence_id").int(sequence_id)
        # Every slice packet starts with these fields; only the timestamp's value follows.
        self._packet_head = self._sequence + _NEEDS_STATE + _TIMESTAMP.tag
        self._event_names: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._strings: dict[str, int] = {}
        self._encoded: dict[tuple[str, ArgValue], bytes] = {}  # (arg name, value) -> its DebugAnnotation
        self._arg_prefixes: dict[str, bytes] = {}
        # Ids and threads repeat from rank to rank: each is encoded once, as its DebugAnnotation.
        self._op_ids: dict[int, bytes] = {}
        self._record_ids: dict[int, bytes] = {}
        self._threads: dict[tuple[str, str], bytes] = {}
        self._fact_heads: tuple[bytes, bytes, bytes, bytes] | None = None
        self._new_interned: list[bytes] = []
        self.stats = TraceStats()
        first = pb.TracePacket(trusted_packet_sequence_id=sequence_id)
        first.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        self._write(first.SerializeToString())

    def finish(self) -> None:
        """Nothing is buffered: every packet is already written."""

    def _write(self, packet: bytes) -> None:
        self._out.write(_framed(packet))

    def metadata(self, packet: bytes) -> None:
        """Write a packet of metadata (the focus the link opens at) as it is."""
        self._write(packet)

    def explicit_process_order(self) -> None:
        """Ask the UI to order processes by their ``sibling_order_rank`` (by rank), not by how many
        slices they hold and their names as text (``rank 10`` before ``rank 2``): the root descriptor,
        uuid 0, with ``process_ordering: EXPLICIT`` (Perfetto's importer, ``track_event_tracker.cc``)."""
        packet = pb.TracePacket(trusted_packet_sequence_id=self._sequence_id)
        packet.track_descriptor.uuid = 0
        packet.track_descriptor.process_ordering = pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
        self._write(packet.SerializeToString())

    def range_of_interest(self, start_ns: int) -> None:
        """Ask the UI to open on the time from ``start_ns`` on (e.g. just before the hang)."""
        packet = pb.TracePacket(trusted_packet_sequence_id=self._sequence_id, timestamp=start_ns)
        packet.track_event_range_of_interest.start_us = start_ns // 1000
        self._write(packet.SerializeToString())

    def track(self, track: Track) -> None:
        """Describe a track; must come before any of its slices."""
        packet = pb.TracePacket(trusted_packet_sequence_id=self._sequence_id)
        desc = packet.track_descriptor
        desc.uuid = track.uuid
        if track.parent is not None:
            desc.parent_uuid = track.parent
        if track.pid is not None:
            desc.process.pid = track.pid
            desc.process.process_name = track.name
            desc.process.process_labels.extend(track.labels)
            desc.sibling_order_rank = track.order
            self.stats.processes += 1
        else:
            desc.name = track.name  # a global track (Findings) is shown above every process
            if track.parent is not None:
                desc.sibling_order_rank = track.order
        if track.counter_unit is not None:
            desc.counter.unit_name = track.counter_unit
            if track.counter_share:  # one y axis for this counter of every rank: the odd one stands out
                desc.counter.y_axis_share_key = track.counter_share
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
        if isinstance(value, (list, tuple)):
            body = b"".join(_ARRAY.bytes(self._value(item)) for item in value)
        else:
            body = self._value(value)
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

    def _look(self, look: SliceLook) -> bytes:
        """A look's name, args and flows, encoded once per writer (the iids in them are the writer's)."""
        encoded = look.encoded
        if encoded is None or encoded[0] is not self._token:
            parts = [_NAME_IID.int(self._iid(self._event_names, look.name, _EVENT_NAMES, _NAME))]
            if not (look.args or look.flow_ids or look.correlation_id is not None or look.callstack):
                encoded = look.encoded = (self._token, parts[0])  # a name alone (an enqueue's)
                return encoded[1]
            parts += [self._arg(name, value) for name, value in look.args]
            parts += [_FLOW_TAG + _pack_u64(flow) for flow in look.flow_ids]
            if look.correlation_id is not None:
                parts.append(_CORRELATION_TAG + varint(look.correlation_id))
            if look.callstack:
                parts.append(_callstack(look.callstack))
            self.stats.flow_ids.update(look.flow_ids)
            encoded = look.encoded = (self._token, b"".join(parts))
        return encoded[1]

    def _arg(self, name: str, value: ArgValue) -> bytes:
        """One encoded annotation; what repeats across ranks (strings, stacks, small ints) is encoded once."""
        kind = type(value)
        if kind is str or kind is tuple or (kind is int and 0 <= value < 1 << 32):  # type: ignore[operator]
            key = (name, value)
            chunk = self._encoded.get(key)
            if chunk is None:
                chunk = self._encoded[key] = self._annotation(name, value)
            return chunk
        if kind is int and _INT64_MIN <= value <= _INT64_MAX:  # type: ignore[operator]
            # Timestamps: unique, so encoded directly (a number's annotation is always short).
            body = self._arg_prefix(name) + _INT.tag + varint(value)  # type: ignore[arg-type]
            return _ANNOTATION.tag + _SMALL_LENGTH[len(body)] + body
        if kind is float:
            body = self._arg_prefix(name) + _DOUBLE.tag + _pack_double(value)
            return _ANNOTATION.tag + _SMALL_LENGTH[len(body)] + body
        return self._annotation(name, value)

    def _facts(
        self, head: Entry, last: Entry, timed: bool, start: int, start_bytes: bytes, end: int | None, end_bytes: bytes
    ) -> bytes:
        """A rank's ids and times, the same annotations as ``rank_facts``, without building them.

        The creation and completion times are usually the slice's own start and end, whose varints
        the caller has already made; ids and threads repeat from rank to rank.
        """
        created_head, started_head, completed_head, duration_head = self._fact_heads or self._make_fact_heads()
        op_id = self._op_ids.get(head.op_id) or self._id(self._op_ids, "op_id", head.op_id, head.op_id)
        record_id = self._record_ids.get(head.record_id) or self._id(
            self._record_ids, "record_id", head.record_id, head.record_id
        )
        created = head.time_created_ns
        if created >= _NINE_BYTES:  # the reader keeps every time at most 2**63 - 1
            parts = [op_id, record_id, created_head, start_bytes if created == start else varint(created)]
        else:
            parts = [op_id, record_id, self._arg("time_created_ns", created)]
        if timed:
            started, completed, duration = last.time_started_ns, last.time_completed_ns, last.duration_ms
            if started and started >= _NINE_BYTES:
                parts += (started_head, varint(started))
            else:
                parts.append(self._arg("time_started_ns", started or "unknown"))
            if completed and completed >= _NINE_BYTES:
                parts += (completed_head, end_bytes if completed == end else varint(completed))
            else:
                parts.append(self._arg("time_completed_ns", completed or "unknown"))
            if type(duration) is float:
                parts += (duration_head, _pack_double(duration))
            else:
                parts.append(self._arg("duration_ms", duration if duration is not None else "unknown"))
        if head.thread_name or head.thread_id:
            thread = (head.thread_name, head.thread_id)
            parts.append(self._threads.get(thread) or self._id(self._threads, "thread", thread, thread_label(head)))
        return b"".join(parts)

    def _make_fact_heads(self) -> tuple[bytes, bytes, bytes, bytes]:
        """What precedes the value in a timestamp's (nine-byte varint) or a duration's annotation."""
        heads = []
        for name, kind, size in (
            ("time_created_ns", _INT, 9), ("time_started_ns", _INT, 9), ("time_completed_ns", _INT, 9),
            ("duration_ms", _DOUBLE, 8),
        ):  # fmt: skip
            prefix = self._arg_prefix(name) + kind.tag
            heads.append(_ANNOTATION.tag + _SMALL_LENGTH[len(prefix) + size] + prefix)
        self._fact_heads = (heads[0], heads[1], heads[2], heads[3])
        return self._fact_heads

    def _id(self, table: dict[_K, bytes], name: str, key: _K, value: int | str) -> bytes:
        """An op id, record id or thread, encoded and remembered in ``table`` under ``key``."""
        chunk = self._annotation(name, value)
        if len(table) < 1 << 20:  # ids a stranger's dump never repeats must not fill memory
            table[key] = chunk
        return chunk

    def _arg_prefix(self, name: str) -> bytes:
        prefix = self._arg_prefixes.get(name)
        if prefix is None:
            iid = self._iid(self._arg_names, name, _ARG_NAMES, _NAME)
            prefix = self._arg_prefixes[name] = _ARG_NAME.int(iid)
        return prefix

    def events(self, track: Track) -> None:
        """Write a track's events: its counter's values, or its slices and instants (in start order;
        disjoint ones slice by slice, nested ones with ends in order of time)."""
        if track.points:
            self._counter(track.uuid, track.points)
        elif track.nested:
            self._nested(track.uuid, track.slices)
        elif track.slices:
            self.slices(track.uuid, track.slices)
        if track.enqueues:
            self.stats.recount_as_enqueues(len(track.slices))

    def slices(self, track_uuid: int, slices: Iterable[Slice]) -> None:
        """Write disjoint slices (and instants outside them) of one track, in time order."""
        codes = self._track_codes(track_uuid)
        if self._fact_heads is None:
            self._make_fact_heads()  # interns their names now, whichever path encodes the slices
        if _speedups is not None and isinstance(slices, SliceRows):
            data, slice_count, marker_count, launches = _speedups.encode_rows(
                *slices.numbered(), slices.facts(), self._fast_context(codes),
                lambda index: self._slice_packets(slices[index], codes),
            )  # fmt: skip
            self.stats.launches += launches
        else:
            slice_count = marker_count = 0
            out: list[bytes] = []
            for item in slices:
                out.append(self._slice_packets(item, codes))
                if item.end is None:
                    marker_count += 1
                else:
                    slice_count += 1
            data = b"".join(out)
        self._out.write(data)
        self.stats.slices += slice_count
        self.stats.markers += marker_count

    def _nested(self, track_uuid: int, slices: Sequence[Slice]) -> None:
        """Slices that nest (and instants inside them), in start order, outer ones first: each end is
        written once every event that begins before it is."""
        codes = self._track_codes(track_uuid)
        if self._fact_heads is None:
            self._make_fact_heads()
        ordered = sorted(slices, key=lambda s: (s.start, -(s.end if s.end is not None else s.start)))
        out: list[bytes] = []
        open_ends: list[int] = []
        for item in ordered:
            while open_ends and open_ends[-1] <= item.start:
                out.append(self._end_packet(open_ends.pop(), codes))
            out.append(self._begin_packet(item, codes))
            if item.end is None:
                self.stats.markers += 1
            else:
                self.stats.slices += 1
                open_ends.append(item.end)
        while open_ends:
            out.append(self._end_packet(open_ends.pop(), codes))
        self._out.write(b"".join(out))

    def _counter(self, track_uuid: int, points: list[tuple[int, float]]) -> None:
        head = _COUNTER + _TRACK_UUID.int(track_uuid)
        self._out.write(b"".join(
            _framed(self._sequence + _TIMESTAMP.int(at) + _TRACK_EVENT.bytes(head + _DOUBLE_COUNTER.double(value)))
            for at, value in points
        ))  # fmt: skip

    def _track_codes(self, track_uuid: int) -> _TrackCodes:
        track = _TRACK_UUID.int(track_uuid)
        return _TrackCodes(_BEGIN + track, _INSTANT + track, _TRACK_EVENT.bytes(_END + track))

    def _fast_context(self, codes: _TrackCodes) -> tuple[object, ...]:
        """What ``_speedups.encode_rows`` needs to encode the slices that ``_slice_packets`` would encode
        without interning anything new; see ``_speedups.c`` for the order."""
        return (
            self._token, self._packet_head, codes.begin, codes.instant, codes.end_event, self._new_interned,
            self._op_ids, self._record_ids, self._threads, self._fact_heads,
            _TRACE_PACKET_TAG, _TRACK_EVENT_TAG, _FLOW_TAG, _INTERNED.tag, self._look,
        )  # fmt: skip

    def _slice_packets(self, item: Slice, codes: _TrackCodes) -> bytes:
        """One slice's packets (begin and end), or an instant's (one)."""
        packet = self._begin_packet(item, codes)
        return packet if item.end is None else packet + self._end_packet(item.end, codes)

    def _begin_packet(self, item: Slice, codes: _TrackCodes) -> bytes:
        """A slice's begin packet, or an instant's."""
        look = item.look
        encoded = look.encoded
        look_chunk = encoded[1] if encoded is not None and encoded[0] is self._token else self._look(look)
        start, end, head = item.start, item.end, item.head
        start_bytes = varint(start)
        event = codes.instant if end is None else codes.begin
        if head is not None and item.last is not None:
            end_bytes = b"" if end is None else varint(end)
            event += look_chunk + self._facts(head, item.last, look.timed, start, start_bytes, end, end_bytes)
        else:
            event += look_chunk
        if item.flows:
            event += b"".join(_FLOW_TAG + _pack_u64(flow) for flow in item.flows)
            if head is not None:  # an enqueue's flow is counted at its other end
                self.stats.launches += len(item.flows)
        packet_head = self._packet_head + start_bytes
        if self._new_interned:
            packet_head += _INTERNED.bytes(b"".join(self._new_interned))
            self._new_interned.clear()
        size = len(event)
        return _framed(packet_head + _TRACK_EVENT_TAG + (_LENGTHS[size] if size < 16384 else varint(size)) + event)

    def _end_packet(self, end: int, codes: _TrackCodes) -> bytes:
        return _framed(self._packet_head + varint(end) + codes.end_event)
