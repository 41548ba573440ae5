"""What several test files need: an entry as the reader makes it, the work a function does, and a wait
for what another process does."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from subprocess import Popen
from typing import Any

from gloo_jobs import free_port  # noqa: F401  (samples/ is on sys.path: conftest)

from fr2perfetto.base.model import Entry

NOW = 1_760_000_000_000_000_000  # a time in 2025, in ns: a nine-byte varint like every real timestamp


def make_entry(**fields: object) -> Entry:
    """A completed all_reduce of rank 0 on the default group, as read from a dump; ``fields`` change it."""
    base = dict(
        rank=0, group_name="0", group_desc="default_pg", pg_id=0, record_id=7, collective_seq=1, p2p_seq=0,
        op_id=7, backend="nccl", op="all_reduce", p2p_local=None, is_p2p=False, input_sizes=((4,),),
        output_sizes=((4,),), input_dtypes=("Float",), output_dtypes=("Float",), state="completed",
        retired=True, time_created_ns=NOW, time_started_ns=NOW + 10, time_completed_ns=NOW + 90,
        duration_ms=0.08, timeout_ms=600000, thread_id="12", thread_name="pt_main_thread", frames=(),
    )  # fmt: skip
    base.update(fields)
    return Entry(**base)  # type: ignore[arg-type]


def count_lines(function: Any, *args: Any) -> int:
    """How many lines of Python ``function`` runs on ``args``: the work, counted, not timed."""
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        function(*args)
    finally:
        sys.settrace(None)
    return count


def wait_until(condition: Callable[[], object], guard: float, every: float = 0.1) -> bool:
    """Poll ``condition`` until it holds or ``guard`` seconds (a hang guard, not a time limit) pass;
    whether it held at the end."""
    deadline = time.monotonic() + guard
    while not condition() and time.monotonic() < deadline:
        time.sleep(every)
    return bool(condition())


def wait_ready(processes: Iterable[Popen[bytes]], word: bytes = b"ready") -> None:
    """Wait until each process has printed its first line, and check that it is ``word``."""
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == word
