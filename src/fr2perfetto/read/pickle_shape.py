"""Measure what a pickle would build, before it is built: how deep it nests and how many nodes it holds.

A few hundred bytes of pickle can describe a tuple nested a million deep (hashing it, which building
a dict with it as a key already does, overflows the C stack and kills the process), or a tuple that
holds the same tuple twice, thirty times over (a few bytes, 2**30 nodes to hash or walk). So before a
dump is unpickled, its opcodes are run on a model of the unpickler's stack that keeps, for each
object, only how deep it nests and how many nodes it holds counted as a walk would count them
(shared ones each time they are met), and the pickle is refused when either passes a bound.

Immutable containers (tuples, frozensets), the only ones that can be hashed, are measured exactly:
they are built from complete items. A list or dict that grows after it was put in another container
or memoised is counted as it was then, which is exact as long as nothing holds it yet: so a list, dict
or set that has been shared (fetched from the memo, or duplicated) may not grow any more. No pickler
writes that (an object is complete before it is referred to again, unless it holds itself, which a
dump never does), and it is the one way a few bytes could make one list that thousands of entries
hold grow to millions of items after the count was taken.

The model stops at the first opcode that needs a class or callable (``GLOBAL``, ``REDUCE``...): the
unpickler refuses those itself (``safe_pickle``). Only a dump that ``_speedups.pickle_columns`` does not
read (a 1.x dump, one PyTorch's pickler did not write, or where the speed-ups are not built) gets here.
``scan`` here and ``_speedups.scan_pickle`` agree.
"""

from __future__ import annotations

import struct

from ..base.speedups import SPEEDUPS as _speedups

MAX_DEPTH = 64  # a dump nests 5 deep (dict, entry list, entry, sizes, dims)


def max_nodes(size: int) -> int:
    """The node count a pickle of ``size`` bytes may describe: a real dump holds less than one node per
    byte, counting the frames its entries share once per entry."""
    return 1_000_000 + 16 * size


def check(data: bytes) -> str | None:
    """Why a pickle must not be unpickled (one line), or None: in C where the speed-ups are built (the
    reference reader reads a dump of 2000 entries in 20 ms, in 120 ms with ``scan`` here)."""
    limit = max_nodes(len(data))
    if _speedups is not None:
        return _speedups.scan_pickle(data, MAX_DEPTH, limit)  # type: ignore[no-any-return]
    return scan(data, MAX_DEPTH, limit)


# What each opcode does to the model, for opcodes with a fixed-size argument: its length.
_FIXED = {
    0x80: 1, ord("K"): 1, ord("M"): 2, ord("J"): 4, ord("G"): 8, ord("h"): 1, ord("j"): 4,
    ord("q"): 1, ord("r"): 4, 0x95: 8,
}  # fmt: skip
_SCALAR_FIXED = {ord("K"), ord("M"), ord("J"), ord("G")}
_SCALARS = {ord("N"), 0x88, 0x89}
_LINE_SCALARS = {ord("F"), ord("I"), ord("L"), ord("S"), ord("V")}
# length-prefixed data: opcode -> width of its length
_COUNTED = {
    ord("T"): 4, ord("U"): 1, ord("X"): 4, 0x8C: 1, 0x8D: 8, ord("B"): 4, ord("C"): 1, 0x8E: 8, 0x96: 8,
    0x8A: 1, 0x8B: 4,
}  # fmt: skip
_EMPTY = {ord("]"), ord("}"), ord(")"), 0x8F}
_NEEDS_CODE = {ord(c) for c in "cRbioPQ"} | {0x81, 0x82, 0x83, 0x84, 0x92, 0x93, 0x97, 0x98}
_CAP = 1 << 62
_GROWS_SHARED = "corrupt pickle: a list or dict grows after it is shared"


def scan(data: bytes, max_depth: int, max_nodes: int) -> str | None:
    """The model itself (see the module's docstring); ``check`` picks it or its C twin.

    A memo index is at most the pickle's length (each memoised object took an opcode to make)."""
    max_memo = len(data)
    depths: list[int] = []  # the unpickler's stack: each object's depth and node count
    nodes: list[int] = []
    # and, for a list, dict or set, a number of its own (0: any other object), so that it is known
    # as the same object wherever it is on the stack or in the memo
    idents: list[int] = []
    shared: set[int] = set()  # the lists, dicts and sets fetched from the memo or duplicated
    made = 0  # containers numbered so far
    marks: list[int] = []
    memo: dict[int, tuple[int, int, int]] = {}
    pos, end = 0, len(data)
    unpack = struct.unpack_from

    def pop_to_mark() -> tuple[int, int] | str:
        if not marks:
            return "corrupt pickle: no mark to pop to"
        at = marks.pop()
        deepest = max(depths[at:], default=0)
        total = min(sum(nodes[at:]), _CAP)
        del depths[at:], nodes[at:], idents[at:]
        return deepest, total

    def push(depth: int, count: int, ident: int = 0) -> None:
        depths.append(depth)
        nodes.append(count)
        idents.append(ident)

    while pos < end:
        op = data[pos]
        pos += 1
        if op == ord("."):
            return None
        if op in _NEEDS_CODE:
            return None  # the unpickler refuses it (and everything after it is never built)
        width = _FIXED.get(op)
        if width is not None:
            if pos + width > end:
                return "truncated or corrupt pickle"
            argument = data[pos : pos + width]
            pos += width
            if op in _SCALAR_FIXED:
                push(0, 1)
            elif op in (ord("h"), ord("j")):
                index = argument[0] if op == ord("h") else unpack("<I", argument)[0]
                if index not in memo:
                    return "corrupt pickle: memo index not defined"
                push(*memo[index])
                shared.add(idents[-1] or -1)
            elif op in (ord("q"), ord("r")):
                index = argument[0] if op == ord("q") else unpack("<I", argument)[0]
                if index >= max_memo:
                    return "corrupt pickle: memo index too large"
                if not depths:
                    return "corrupt pickle: nothing to memoise"
                memo[index] = (depths[-1], nodes[-1], idents[-1])
            elif op == 0x80 and argument[0] > 5:
                return f"unsupported pickle protocol {argument[0]}"
            continue
        width = _COUNTED.get(op)
        if width is not None:
            if pos + width > end:
                return "truncated or corrupt pickle"
            length = int.from_bytes(data[pos : pos + width], "little", signed=op == 0x8B)
            pos += width
            if length < 0 or pos + length > end:
                return "truncated or corrupt pickle"
            pos += length
            push(0, 1)
            continue
        if op in _LINE_SCALARS or op in (ord("g"), ord("p")):
            newline = data.find(b"\n", pos)
            if newline < 0:
                return "truncated or corrupt pickle"
            line = data[pos:newline]
            pos = newline + 1
            if op == ord("g") or op == ord("p"):
                try:
                    index = int(line)
                except ValueError:
                    return "corrupt pickle: memo index not a number"
                if op == ord("g"):
                    if index not in memo:
                        return "corrupt pickle: memo index not defined"
                    push(*memo[index])
                    shared.add(idents[-1] or -1)
                else:
                    if not 0 <= index < max_memo:
                        return "corrupt pickle: memo index too large"
                    if not depths:
                        return "corrupt pickle: nothing to memoise"
                    memo[index] = (depths[-1], nodes[-1], idents[-1])
                continue
            push(0, 1)
            continue
        if op in _SCALARS:
            push(0, 1)
        elif op in _EMPTY:
            made += 1
            push(1, 1, made if op != ord(")") else 0)
        elif op == ord("("):
            marks.append(len(depths))
        elif op == 0x94:  # MEMOIZE
            if not depths:
                return "corrupt pickle: nothing to memoise"
            if len(memo) >= max_memo:
                return "corrupt pickle: memo too large"
            memo[len(memo)] = (depths[-1], nodes[-1], idents[-1])
        elif op in (ord("t"), ord("l"), ord("d"), 0x91):  # TUPLE, LIST, DICT, FROZENSET from the mark
            popped = pop_to_mark()
            if isinstance(popped, str):
                return popped
            made += 1
            push(popped[0] + 1, min(popped[1] + 1, _CAP), made if op in (ord("l"), ord("d")) else 0)
        elif op in (0x85, 0x86, 0x87):  # TUPLE1..3
            count = op - 0x84
            if len(depths) - (marks[-1] if marks else 0) < count:
                return "corrupt pickle: stack underflow"
            deepest = max(depths[-count:])
            total = min(sum(nodes[-count:]) + 1, _CAP)
            del depths[-count:], nodes[-count:], idents[-count:]
            push(deepest + 1, total)
        elif op in (ord("a"), ord("s")):  # APPEND, SETITEM: into the container below
            count = 1 if op == ord("a") else 2
            if len(depths) - (marks[-1] if marks else 0) < count + 1:
                return "corrupt pickle: stack underflow"
            deepest = max(depths[-count:])
            total = sum(nodes[-count:])
            del depths[-count:], nodes[-count:], idents[-count:]
            if idents[-1] in shared:
                return _GROWS_SHARED
            depths[-1] = max(depths[-1], deepest + 1)
            nodes[-1] = min(nodes[-1] + total, _CAP)
        elif op in (ord("e"), ord("u"), 0x90):  # APPENDS, SETITEMS, ADDITEMS: from the mark
            popped = pop_to_mark()
            if isinstance(popped, str):
                return popped
            if not depths:
                return "corrupt pickle: stack underflow"
            if idents[-1] in shared:
                return _GROWS_SHARED
            depths[-1] = max(depths[-1], popped[0] + 1)
            nodes[-1] = min(nodes[-1] + popped[1], _CAP)
        elif op == ord("0"):  # POP: an object, or a mark where the stack above it is empty
            if marks and marks[-1] == len(depths):
                marks.pop()
            elif depths:
                depths.pop()
                nodes.pop()
                idents.pop()
            else:
                return "corrupt pickle: stack underflow"
        elif op == ord("1"):  # POP_MARK
            popped = pop_to_mark()
            if isinstance(popped, str):
                return popped
        elif op == ord("2"):  # DUP
            if not depths:
                return "corrupt pickle: stack underflow"
            push(depths[-1], nodes[-1], idents[-1])
            shared.add(idents[-1] or -1)
        else:
            return f"corrupt pickle: unknown opcode 0x{op:02x}"
        if depths and (depths[-1] > max_depth or nodes[-1] > max_nodes):
            if depths[-1] > max_depth:
                return f"corrupt pickle: nested more than {max_depth} deep"
            return f"corrupt pickle: describes more than {max_nodes} nodes"
    return "truncated or corrupt pickle"
