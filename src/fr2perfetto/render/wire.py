"""Protobuf wire encoding for the few hot message shapes of a trace, driven by Perfetto's own schema.

Building a Python protobuf object per slice costs more than everything else in a conversion, so the
packets that repeat by the million (slice begin and end) are encoded here directly. Field numbers and
types are read from the descriptors of ``perfetto_trace_pb2`` at import time, never typed in by hand,
and the tests parse every trace back with that same schema.
"""

from __future__ import annotations

import builtins
import struct

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_VARINT_TYPES = {
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM,
}  # fmt: skip
_FIXED64_TYPES = {FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_SFIXED64}
_LENGTH_TYPES = {FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES}
_SMALL = [bytes([n]) for n in range(128)]
# 14 bits as two varint groups: with more to follow (_MIDDLE), or as the last two (_LAST).
_MIDDLE = [bytes([(n & 0x7F) | 0x80, (n >> 7) | 0x80]) for n in range(1 << 14)]
_LAST = [bytes([(n & 0x7F) | 0x80, n >> 7]) for n in range(1 << 14)]
_pack_double = struct.Struct("<d").pack
_pack_u64 = struct.Struct("<Q").pack


def varint(value: int) -> bytes:
    """Base-128 varint; negative numbers as 64-bit two's complement, as protobuf does for int64."""
    if 0 <= value < 128:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64
    # Fourteen bits at a time from tables. A timestamp's top bits are shared by every timestamp of
    # the same quarter second, so they come from a cache.
    if value < 1 << 14:
        return _LAST[value]
    if value < 1 << 28:
        high = value >> 14
        return _MIDDLE[value & 0x3FFF] + (_SMALL[high] if high < 128 else _LAST[high])
    groups = _HIGH_GROUPS.get(value >> 28)
    if groups is None:
        groups = _high_groups(value >> 28)
    return _MIDDLE[value & 0x3FFF] + _MIDDLE[(value >> 14) & 0x3FFF] + groups


_HIGH_GROUPS: dict[int, bytes] = {}


def _high_groups(value: int) -> bytes:
    """The varint groups of a value's bits from the 29th on (``value`` is already shifted); cached."""
    key = value
    parts = []
    while value >= 1 << 14:
        parts.append(_MIDDLE[value & 0x3FFF])
        value >>= 14
    parts.append(_SMALL[value] if value < 128 else _LAST[value])
    if len(_HIGH_GROUPS) > 65536:
        _HIGH_GROUPS.clear()
    encoded = _HIGH_GROUPS[key] = b"".join(parts)
    return encoded


class Field:
    """One field of one message: its tag, and an encoder for a value of it."""

    __slots__ = ("kind", "tag")

    def __init__(self, message: Descriptor, name: str) -> None:
        field = message.fields_by_name[name]
        if field.type in _VARINT_TYPES:
            wire, self.kind = 0, "varint"
        elif field.type in _FIXED64_TYPES:
            wire, self.kind = 1, "double" if field.type == FieldDescriptor.TYPE_DOUBLE else "fixed64"
        elif field.type in _LENGTH_TYPES:
            wire, self.kind = 2, "length"
        else:
            raise TypeError(f"{message.name}.{name}: unsupported field type {field.type}")
        self.tag = varint(field.number << 3 | wire)

    def int(self, value: int) -> bytes:
        return self.tag + varint(value)

    # In the class body ``int`` is the method above: the type is spelled ``builtins.int`` for type checkers.
    def fixed64(self, value: builtins.int) -> bytes:
        return self.tag + _pack_u64(value)

    def double(self, value: float) -> bytes:
        return self.tag + _pack_double(value)

    def bytes(self, value: bytes) -> bytes:
        return self.tag + varint(len(value)) + value
