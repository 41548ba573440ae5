"""Read a job's logs for the lines that say what went wrong on which rank.

Recognised, in the words PyTorch writes them (the file that writes each is named):

- the watchdog's timeout, ``[Rank 3] Watchdog caught collective operation timeout:
  WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600029
  milliseconds before timing out.`` (``ProcessGroupNCCL.cpp``, ``WorkNCCL::checkTimeout``);
- the heartbeat monitor: ``Heartbeat monitor timed out!`` and ``watchdog got stuck for 480 seconds``
  (``ProcessGroupNCCL.cpp``, ``HeartbeatMonitor::runLoop``);
- NCCL errors: ``NCCL error in: ...``, ``ncclSystemError``, ``unhandled cuda error`` (``NCCLUtils.hpp``,
  ``C10D_NCCL_CHECK``, and NCCL's own result names);
- failures in communication caused by another rank: gloo's timeouts and closed connections, NCCL's
  remote errors, ``DistBackendError`` (``comm_failure``: what happened to the rank, not what it did);
- CUDA errors: ``CUDA error: an illegal memory access was encountered`` (``c10/cuda/CUDAException.h``);
- Python tracebacks: the exception line that ends one, with its innermost frame;
- torchrun's ``ChildFailedError`` table: each failed rank with its exit code or signal
  (``torch/distributed/elastic/multiprocessing/errors/__init__.py``).

A line's rank comes from its prefix (``[rank3]:``, ``[Rank 3]``, torchrun's ``[default3]:``), else from
the file (torchrun's ``<log_dir>/.../attempt_0/<rank>/stderr.log``, a name with ``rank_3``); its time
from glog's ``E0810 03:04:11.061`` (the year from ``year_of``) or an ISO time, read as local time, else
none. Anything else is ignored: a log line never stops a command.
"""

from __future__ import annotations

import datetime
import os
import re

from ..base.model import (
    LOG_CHILD_FAILED,
    LOG_COMM_FAILURE,
    LOG_CUDA_ERROR,
    LOG_EXCEPTION,
    LOG_NCCL_ERROR,
    LOG_WATCHDOG_STUCK,
    LOG_WATCHDOG_TIMEOUT,
    MAX_RANK,
    LogEvent,
    plausible_time,
)
from ..base.text import safe_text
from .stacks import python_frame

MAX_EVENTS_PER_KIND = 20  # of one rank
MAX_LINE = 400  # of a line quoted
# Longer lines are read a window of this many characters at a time (``_Scan.rest``): every pattern
# below is then bounded per window, so a log costs time in proportion to its size, whatever it holds.
# Numbers have bounded digits for the same reason, and are checked for range as well.
MAX_SCAN = 4096

_RANK_PREFIX = re.compile(
    r"^\[(?:rank|default)(\d{1,8})\]:|\[Rank (\d{1,8})\]|\[PG ID \d{1,9} PG GUID [^\s\]]{1,128} Rank (\d{1,8})\]"
)
# the same, anywhere: where records were written into one line, each one's prefix starts it
_RECORD_PREFIX = re.compile(
    r"\[(?:rank|default)(\d{1,8})\]:|\[Rank (\d{1,8})\]|\[PG ID \d{1,9} PG GUID [^\s\]]{1,128} Rank (\d{1,8})\]"
)
_GLOG_TIME = re.compile(r"\[?[EWIF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")
_ISO_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?")
_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d{1,18}), OpType=(\w{1,64})"
    r"(?:, NumelIn=(\d{1,18}), NumelOut=(\d{1,18}))?, Timeout\(ms\)=(\d{1,18})\) ran for (\d{1,18}) milliseconds"
)
_STUCK = re.compile(r"Heartbeat monitor timed out|watchdog got stuck for (\d{1,12}) seconds")
_NCCL = re.compile(
    r"NCCL error|nccl(?:Remote|System|Internal|InvalidUsage|InvalidArgument|UnhandledCuda)Error|"
    r"unhandled cuda error|unhandled system error|remote process exited or there was a network error",
    re.IGNORECASE,
)
_CUDA = re.compile(r"CUDA error: (.+)")
# What a rank sees when a collective or a transfer fails because of another rank: gloo's timeouts
# (``unbound_buffer.cc``: "Timed out waiting 3000ms for recv operation to complete"; ``pair.cc``:
# "Application timeout caused pair closure", "Connection closed by peer"), NCCL's remote errors, c10d's
# DistBackendError and monitored_barrier's timeout (``ProcessGroupGloo.cpp``)
_COMM_FAILURE = re.compile(
    r"Timed out waiting \d{1,12}ms for (?:send|recv) operation|Application timeout caused pair closure|"
    r"Connection closed by peer|Connection reset by peer|DistBackendError|ncclRemoteError|"
    r"remote process exited or there was a network error|timed out in monitoredBarrier"
)
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION = re.compile(
    r"^([A-Za-z_][\w.]{0,200}(?:Error|Exception|Interrupt|Exit|Failure|Warning)|KeyboardInterrupt)(:.*)?$"
)
_CHILD_RANK = re.compile(r"^\s*rank\s*:\s*(\d{1,8})\b")
_CHILD_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d{1,10})\b")
_CHILD_TRACE = re.compile(r"^\s*traceback\s*:\s*(.*)$")
_CHILD_TIME = re.compile(r"^\s*time\s*:\s*(\S+)")
_SIGNAL = re.compile(r"Signal (\d{1,3}) \((\w{1,16})\)(?: received by PID \d{1,10})?")
_LOG_DIR_RANK = re.compile(r"attempt_\d{1,9}[/\\](\d{1,8})[/\\](?:stderr|stdout|error)")
_NAME_RANK = re.compile(r"rank[_-]?(\d{1,8})(?!\d)", re.IGNORECASE)
_INT32 = 1 << 31


def rank_of_file(path: str) -> int | None:
    """The rank a whole log file is of, where its path says (None: a combined log)."""
    found = _LOG_DIR_RANK.search(path.replace("!", "/"))
    if found:
        return int(found.group(1))
    found = _NAME_RANK.search(os.path.basename(path))
    return int(found.group(1)) if found else None


def parse_log(text: str, source: str, year_of: int | None = None, notes: list[str] | None = None) -> list[LogEvent]:
    """The events of one log file (``year_of``: the year of glog's times, which carry none). A time
    that is no plausible date is dropped (the event stays, untimed), and ``notes`` says how many.

    A line longer than ``MAX_SCAN`` (a log written without newlines) is read a window at a time
    (``_Scan.rest``): an error anywhere in it is found, at a cost in proportion to its length."""
    scan = _Scan(source, year_of or datetime.datetime.now().year)
    for number, raw in enumerate(text.splitlines(), start=1):
        scan.line(raw, number)
    if scan.dropped and notes is not None:
        notes.append(f"{scan.dropped} times in it are no plausible date (before 1990 or after 2199): ignored")
    return scan.events


# The patterns of one event a line may hold, in the order they are tried: the first that matches names it.
_KINDS = (
    (LOG_WATCHDOG_TIMEOUT, _TIMEOUT), (LOG_WATCHDOG_STUCK, _STUCK), (LOG_CUDA_ERROR, _CUDA),
    (LOG_COMM_FAILURE, _COMM_FAILURE), (LOG_NCCL_ERROR, _NCCL),
)  # fmt: skip
# A line longer than MAX_SCAN is read a window of MAX_SCAN at a time, every STEP characters, and is
# taken as messages of OVERLAP characters each, from where a pattern first matches: every message of
# the patterns above is shorter, so one that a window's end cuts is whole in the next. A window owns
# the messages that start in its first STEP characters (the next, the rest), so none is found twice;
# and a message is one event, named as a line is (``NCCL error in: ..., remote process exited``, with
# ``ncclRemoteError`` after it, is one failure in communication, not an NCCL error and then another).
OVERLAP = 1024
STEP = MAX_SCAN - OVERLAP

_Found = tuple[str, "re.Match[str]", int]  # the kind of event, the match that names it, where its message starts


def _line_event(line: str) -> _Found | None:
    """The event a line holds: the first kind (in ``_KINDS``' order) with a match in it; None: none."""
    for kind, pattern in _KINDS:
        if match := pattern.search(line):
            return kind, match, match.start()
    return None


def _message_event(window: str, after: int, owned: int) -> _Found | None:
    """The first message of a window of a long line that starts at or past ``after`` and before
    ``owned``: it starts where a pattern first matches, and is named as a line of its ``OVERLAP``
    characters would be (``_line_event``); None: no message starts there."""
    starts = [match.start() for _, pattern in _KINDS if (match := pattern.search(window, after))]
    begin = min(starts, default=owned)
    if begin >= owned:
        return None
    for kind, pattern in _KINDS:
        match = pattern.search(window, begin)
        if match is not None and match.start() < begin + OVERLAP:
            return kind, match, begin
    return None  # not reached: the pattern that matched at ``begin`` matches there again


class _Scan:
    """What reading a log has found so far: its events, and the tracebacks and torchrun failure tables
    still open, rank by rank."""

    def __init__(self, source: str, year: int) -> None:
        self.source, self.year = source, year
        self.file_rank = rank_of_file(source)
        self.events: list[LogEvent] = []
        self.counts: dict[tuple[int, str], int] = {}
        self.traceback: dict[int | None, tuple[int, str | None]] = {}  # rank -> (start line, innermost frame)
        self.child: dict[str, str] = {}
        self.dropped = 0  # times that are no plausible date

    def add(self, rank: int | None, kind: str, line: str, number: int, when: int | None, **details: str) -> None:
        """An event, unless its rank is none or out of range, or its rank has ``MAX_EVENTS_PER_KIND`` of it."""
        if rank is None or not 0 <= rank < MAX_RANK:
            return
        key = (rank, kind)
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] <= MAX_EVENTS_PER_KIND:
            text_line = safe_text(line.strip())[:MAX_LINE]
            self.events.append(LogEvent(rank, when, kind, text_line, f"{self.source}:{number}", details))

    def timed(self, line: str) -> int | None:
        """The time a line starts with, if it is a plausible date (else None, counted)."""
        when = _time(line, self.year)
        if when is not None and plausible_time(when) is None:
            self.dropped += 1
            return None
        return when

    def line(self, raw: str, number: int) -> None:
        """One line: its event, and its part in a traceback or a torchrun failure table (both read in its
        first ``MAX_SCAN`` characters); the messages past the first of a longer one, by ``rest``."""
        line = raw[:MAX_SCAN].rstrip()
        prefix = _RANK_PREFIX.search(line)
        rank = next((int(g) for g in prefix.groups() if g), None) if prefix else self.file_rank
        body = line[prefix.end() :] if prefix and prefix.start() == 0 else line
        longer = len(raw) > MAX_SCAN
        found = _message_event(line, 0, STEP) if longer else _line_event(line)
        if found is not None:
            # a long line may be records written without newlines: an event is of the record it is in
            of_rank, head = _record(raw, found[2], rank, line) if longer else (rank, line)
            self.event(found, of_rank, body, len(line) - len(body), head, number)
        stripped = body.strip()
        if stripped == _TRACEBACK:
            self.traceback[rank] = (number, None)
        elif rank in self.traceback and (frame := _python_frame(stripped)):
            self.traceback[rank] = (self.traceback[rank][0], frame)
        elif rank in self.traceback and _EXCEPTION.match(stripped):
            _, innermost = self.traceback.pop(rank)
            # a collective that failed because a peer went or timed out is what happened to this rank,
            # not what it did: a failure in communication, not an error of its own
            kind = LOG_COMM_FAILURE if _COMM_FAILURE.search(stripped) else LOG_EXCEPTION
            self.add(rank, kind, stripped, number, self.timed(line), where=innermost or "")
        failed = _child_failure(stripped, self.child, self.year)
        if failed is not None:
            failed_rank, what, failed_at, code = failed
            if plausible_time(failed_at) is None and failed_at is not None:
                self.dropped += 1
                failed_at = None
            self.add(failed_rank, LOG_CHILD_FAILED, what, number, failed_at, exitcode=code)
        if longer:
            self.rest(raw, number, rank, line, found[2] + OVERLAP if found is not None else 0)

    def event(self, found: _Found, rank: int | None, body: str, offset: int, head: str, number: int) -> None:
        """The event ``found`` in a line (or a window of one) whose ``body`` (past its rank prefix) starts
        at ``offset``; ``head``: where its time is. It is quoted from the body's start, or from where its
        message starts if that would not show it."""
        kind, match, begin = found
        if kind == LOG_COMM_FAILURE and rank in self.traceback and _EXCEPTION.match(body.strip()):
            return  # taken with its frame, as the exception that ends the traceback
        quoted = body if match.end() - offset <= MAX_LINE else body[max(0, begin - offset) :]
        when = self.timed(head)
        if kind == LOG_WATCHDOG_TIMEOUT:
            seq, op, numel_in, numel_out, timeout, ran = match.groups()
            self.add(rank, kind, quoted, number, when, seq=seq, op=op, timeout_ms=timeout, ran_ms=ran,
                     numel_in=numel_in or "", numel_out=numel_out or "")  # fmt: skip
        elif kind == LOG_CUDA_ERROR:
            self.add(rank, kind, quoted, number, when, error=match.group(1)[:200])
        else:
            self.add(rank, kind, quoted, number, when)

    def rest(self, raw: str, number: int, rank: int | None, head: str, after: int) -> None:
        """The messages of a long line from ``after`` on, window by window (see ``OVERLAP``), each quoted
        from where it starts, of the rank and at the time of the record it is in (``_record``)."""
        for start in range(0, len(raw) - OVERLAP, STEP):
            owned = MAX_SCAN if start + MAX_SCAN >= len(raw) else STEP
            window = raw[start : start + MAX_SCAN] if after - start < owned else ""
            while window and (found := _message_event(window, max(0, after - start), owned)) is not None:
                begin = found[2]
                of_rank, record = _record(raw, start + begin, rank, head)
                self.event(found, of_rank, window[begin:], begin, record, number)
                after = start + begin + OVERLAP


def _record(raw: str, at: int, rank: int | None, head: str) -> tuple[int | None, str]:
    """The rank of an event at ``at`` in a long line, and the text its time is in: those of the record it
    is part of where a rank prefix up to ``OVERLAP`` before it starts one (records written into one line
    without newlines), else the line's own (``rank``, ``head``)."""
    before = raw[max(0, at - OVERLAP) : at]
    prefixes = list(_RECORD_PREFIX.finditer(before))  # a few, in OVERLAP characters
    if not prefixes:
        return rank, head
    last = prefixes[-1]
    return next(int(g) for g in last.groups() if g), before[last.start() :]


def _python_frame(line: str) -> str | None:
    """``File "/job/train.py", line 140, in train_step`` as ``train_step (/job/train.py:140)``."""
    frame = python_frame(line, ", in ")
    return None if frame is None else f"{frame.name} ({frame.filename}:{frame.line})"


def _child_failure(line: str, child: dict[str, str], year: int) -> tuple[int, str, int | None, str] | None:
    """torchrun's failure table: ``time``, ``rank``, ``exitcode``, then ``traceback`` (the last field);
    at the last: (rank, what happened, when, exit code)."""
    if match := _CHILD_TIME.match(line):
        child.clear()
        child["time"] = match.group(1)
    elif match := _CHILD_RANK.match(line):
        child["rank"] = match.group(1)
    elif match := _CHILD_EXIT.match(line):
        child["exitcode"] = match.group(1)
    elif (match := _CHILD_TRACE.match(line)) and "rank" in child and "exitcode" in child:
        code = int(child["exitcode"])
        if not -_INT32 <= code < _INT32:
            child.clear()
            return None
        signal = _SIGNAL.search(match.group(1))
        # torchrun's own sentence for a signal (``ProcessFailure``: "Signal 6 (SIGABRT) received by PID
        # 4003") is quoted as it wrote it; any other traceback is the job's text, and is not
        how = f'killed by {signal.group(2)}: "{signal.group(0)}"' if signal else f"exit code {code}"
        when = _time(child.get("time", "").replace("_", " "), year)
        failed = (int(child["rank"]), f"rank {child['rank']} failed ({how}) [torchrun]", when, str(code))
        child.clear()
        return failed
    return None


def _time(line: str, year: int) -> int | None:
    try:
        if match := _ISO_TIME.search(line):
            y, mo, d, h, mi, s, frac = match.groups()
            moment = datetime.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s))
        elif match := _GLOG_TIME.search(line):
            mo, d, h, mi, s, frac = match.groups()
            moment = datetime.datetime(year, int(mo), int(d), int(h), int(mi), int(s))
        else:
            return None
        seconds = int(moment.timestamp())  # local time, as logs are written
    except (ValueError, OverflowError, OSError):
        return None
    nanos = int((frac or "0").ljust(9, "0")[:9])
    return seconds * 1_000_000_000 + nanos
