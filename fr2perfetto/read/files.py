"""Find dump files and tell each one's rank (and host, where the name has one) from its name."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

_SUFFIXES = (".json", ".pkl", ".pickle", ".pt")
_TRAILING_NUMBER = re.compile(r"(\d+)$")


@dataclass(frozen=True, slots=True)
class DumpName:
    """What a dump's file name says: its rank, and a host if the name carries one."""

    rank: int
    host: str | None


def parse_dump_name(path: str) -> DumpName | None:
    """Read the rank (the trailing number) and host from a file name, or None if it has no rank.

    ``nccl_trace_rank_7``, ``trace_7``, ``rank_7.json``, ``gloo_trace_rank_7.json`` give rank 7;
    ``nccl_trace_rank_node02_7`` gives rank 7 on host ``node02``.
    """
    stem = os.path.basename(path)
    for suffix in _SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    match = _TRAILING_NUMBER.search(stem)
    if not match:
        return None
    rank = int(match.group(1))
    if rank >= 2**31:
        return None  # not a rank: a timestamp or a hash
    tokens = re.split(r"[_]", stem[: match.start()].rstrip("_-"))
    host = None
    if "rank" in tokens:
        after = tokens[len(tokens) - 1 - tokens[::-1].index("rank") + 1 :]
        if after:
            host = "_".join(after)
    return DumpName(rank, host)


def expand_inputs(inputs: list[str]) -> tuple[list[str], list[str]]:
    """Turn directories, files and glob patterns into a sorted list of files.

    Returns (files, inputs that matched nothing). A directory contributes every regular file under it,
    hidden folders and files left out: the caller sorts them by kind (``inputs``).
    """
    files: list[str] = []
    unmatched: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = []
            for folder, folders, names in os.walk(item):
                folders[:] = sorted(f for f in folders if not f.startswith("."))
                found += [os.path.join(folder, n) for n in names if not n.startswith(".")
                          and os.path.isfile(os.path.join(folder, n))]  # fmt: skip
        elif os.path.isfile(item):
            found = [item]
        elif glob.has_magic(item):
            found = [p for p in glob.glob(item) if os.path.isfile(p)]
        else:
            found = []
        if not found:
            unmatched.append(item)
        files.extend(found)
    seen: set[str] = set()
    unique = [f for f in files if not (f in seen or seen.add(f))]
    return sorted(unique, key=_natural_key), unmatched


def _natural_key(path: str) -> tuple[object, ...]:
    parsed = parse_dump_name(path)
    return (os.path.dirname(path), parsed.rank if parsed else -1, path)
