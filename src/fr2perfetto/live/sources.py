"""Where the watch reads a running job from, and nothing more: PyTorch's debug server over HTTP (its
frontend, to find the ranks' worker servers, then each worker), or a folder that the debug server (or the
capture helper) writes into. Every request is bounded: one deadline for all of it (connecting, the
headers, the body, however slowly a server sends them), a cap on the bytes read, and a fixed handler
that reads and changes nothing. What comes back is bytes, for ``read`` and ``progress`` to judge.

What the debug server serves, from torch 2.13's source (``torch/distributed/debug/``):

- ``start_debug_server`` (``__init__.py``) starts a worker server on every rank
  (``_WorkerServer("::", worker_port)``) and sets its address, ``http://<hostname>:<port>``, under
  ``rank<N>`` in the job's store (``_store.py``: prefix ``debug_server``); rank 0 also runs the frontend,
  a process of its own (port 25999 by default).
- The frontend (``_frontend.py``) answers GET. Each of its pages fetches every rank's worker
  (``fetch_all``: the store's addresses, ``<address>/handler/<name>?<args>``, sent by ``requests.post``
  or aiohttp's ``session.post``) and renders each under ``<h2>Rank <N>: <that URL></h2>``
  (``RAW_RESP_TEMPLATE``, ``JSON_RESP_TEMPLATE``); ``/wait_counters`` (``_debug_handlers.py``,
  ``WaitCountersHandler``) is the page with the smallest answers, ``/fr_trace_json`` the one with the
  largest.
- A worker routes ``POST /handler/<name>`` only (a GET there is a 404; the frontend's own fetches are
  POSTs), and ``GET /handler/`` lists its handlers as JSON. Those read here take no body and change
  nothing: ``fr_trace_json`` (``dump_fr_trace_json(true, true)`` in c10d's ``control_plane/Handlers.cpp``:
  the Flight Recorder gloo records into, as JSON; it takes no parameter), ``dump_nccl_trace_json``
  (NCCL's, ``ProcessGroupNCCL.cpp``; ``onlyactive=true`` leaves out completed entries, as the
  frontend's NCCL page asks, and any other parameter is refused with a 400) and ``dump_traceback``
  (``faulthandler``'s text of every thread, the form of the capture helper's snapshots).
- With ``dump_dir``, the frontend writes ``<name>_<YYYYmmdd_HHMMSS>.txt`` every ``dump_interval``
  seconds (``PeriodicDumper``): ``stacks_`` (every rank's stacks, each under ``=== Rank <N>: <its
  dump_traceback URL> ===``, failures as ``Error: <status>``), ``fr_trace_`` (tables made by torch's own
  analyzer from every rank's JSON, not a dump, and on gloo's groups it fails outright: nothing is
  written) and ``torchcomms_health_check_``. Not read here but for the stacks and what sits beside them.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import io
import ipaddress
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from .. import __version__
from ..base.model import StackSnapshot
from ..base.text import is_number
from ..read.files import open_regular
from ..read.inputs import TEXT_LIMIT, kind_of
from ..read.reader import DumpError, read_dump
from ..read.stacks import parse_stacks
from .progress import Failure, Sample, merge, sample_of_dump, sample_of_stacks

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

MAX_RESPONSE_BYTES = 256 << 20  # a Flight Recorder's JSON: about 0.5 KB an entry, 1 MB for 2000 entries
MAX_PAGE_BYTES = 16 << 20  # the frontend's page that lists the ranks
MAX_STACKS_BYTES = 4 << 20  # one rank's stacks
MAX_LIST_BYTES = 64 << 10  # a worker's list of handlers
MAX_RANKS = 1 << 14  # ranks watched at most: beyond it, a round of polls takes too long to tell anything
MAX_FOLDER_FILES = 100_000  # names looked at in a watched folder, each round
DEFAULT_PORT = 25999  # start_debug_server's frontend port

# (name, handler, query for a poll): NCCL's recorder first, where the worker has one; a poll asks NCCL
# only for the ops not completed (pg_status, which says where each group stands, comes with them)
RECORDERS = (("nccl", "dump_nccl_trace_json", "onlyactive=true"), ("gloo", "fr_trace_json", ""))
STACKS_HANDLER = "dump_traceback"
PAGES = ("/wait_counters", "/fr_trace_json")  # frontend pages that list every rank's worker, lightest first
_RANK_HEADER = re.compile(rb"<h2>Rank (\d{1,8}): (http://[^\s<>\"'/]{1,300})/handler/")
_STACKS_HEADER = re.compile(r"^=== Rank (\d{1,8}): (http://[^\s/]{1,300})/handler/", re.M)
_RANK_URL = re.compile(r"(\d{1,8})=(.+)")
_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}")
_GONE = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)


class WatchError(ValueError):
    """A target that cannot be watched: not a debug server, never answered, no such folder. One line."""


class FetchError(Exception):
    """A request that got no usable answer; the message is one line of the watch's own words (never the
    server's), ``gone`` whether nothing listens there any more, ``status`` the HTTP status if one came."""

    def __init__(self, reason: str, *, gone: bool = False, status: int | None = None) -> None:
        super().__init__(reason)
        self.gone = gone
        self.status = status


@dataclass(frozen=True, slots=True)
class Url:
    """A server's address, checked: plain HTTP, a host (a name or an IP address) and a port, nothing else."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"http://{self.netloc}"

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_url(text: str, default_port: int | None = None) -> Url:
    """``http://host:port`` (any path after it is dropped) as a ``Url``; ``ValueError`` in one line for
    anything else: another scheme, a user name, a host that is no name or address, a port out of range."""
    parts = urlsplit(text.strip())
    if parts.scheme != "http":
        raise ValueError("an address of the debug server starts with http:// (it speaks plain HTTP only)")
    if parts.username is not None or parts.password is not None:
        raise ValueError("a user name or password in the address: the debug server has none")
    host = parts.hostname or ""
    try:
        port = parts.port or default_port
    except ValueError:
        raise ValueError("its port is no port (1-65535)") from None
    if port is None or not 0 < port < 65536:
        raise ValueError("no port in the address (http://HOST:PORT)")
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        if not _HOST.fullmatch(host) or host.startswith(("-", ".")):
            raise ValueError("its host is neither a host name nor an IP address") from None
    return Url(host, port)


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read given only the time left before the deadline: however slowly a server
    dribbles them, reading stops at the deadline (``TimeoutError``)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _Wire:
    """What ``http.client.HTTPResponse`` asks of its socket: a file of its bytes, read to a deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))


def fetch(url: Url, path: str, *, method: str = "POST", timeout: float, max_bytes: int) -> bytes:
    """The body of a 200 answer to ``method path`` at ``url``, all of it (connecting, the request, the
    headers, the body) within ``timeout`` seconds and at most ``max_bytes`` long; else ``FetchError``.
    A POST carries no body; ``http.client`` reads the answer (its status line, at most 100 header lines
    of 64 KB, a body by its length, chunked, or to the end), every read bounded by the deadline."""
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((url.host, url.port), timeout=timeout)
    except TimeoutError:
        raise FetchError(f"no connection within {timeout:g} s") from None
    except socket.gaierror:
        raise FetchError(f"its host {url.host} is not known here", gone=True) from None
    except OSError as error:
        raise FetchError(_reason(error), gone=error.errno in _GONE) from None
    try:
        length = "Content-Length: 0\r\n" if method == "POST" else ""  # a POST with no body: nothing is sent
        head = (f"{method} {path} HTTP/1.1\r\nHost: {url.netloc}\r\nUser-Agent: fr2perfetto-watch/{__version__}\r\n"
                f"Accept: */*\r\nConnection: close\r\n{length}\r\n")  # fmt: skip
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(head.encode("ascii"))
        response = http.client.HTTPResponse(cast(socket.socket, _Wire(sock, deadline)), method=method)
        response.begin()
        if response.status != 200:
            raise FetchError(f"HTTP {response.status}", status=response.status)
        declared = response.getheader("Content-Length")
        if declared is not None and is_number(declared) and int(declared) > max_bytes:
            raise FetchError(f"an answer of {int(declared) / 2**20:.0f} MB, over the {max_bytes / 2**20:g} MB read")
        parts, size = [], 0
        while True:
            chunk = response.read(min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise FetchError(f"an answer over the {max_bytes / 2**20:g} MB read")
        return b"".join(parts)
    except TimeoutError:
        raise FetchError(f"no whole answer within {timeout:g} s") from None
    except http.client.HTTPException as error:
        raise FetchError(f"not an HTTP answer ({type(error).__name__})") from None
    except (ConnectionResetError, BrokenPipeError):
        raise FetchError("the connection was closed before an answer", gone=False) from None
    except OSError as error:
        raise FetchError(_reason(error)) from None
    finally:
        sock.close()


def _reason(error: OSError) -> str:
    if error.errno == errno.ECONNREFUSED:
        return "connection refused (nothing listens there)"
    return (error.strerror or type(error).__name__).lower()


# The frontend and the workers


def find_workers(target: Url, timeout: float) -> dict[int, Url]:
    """The workers of every rank, by rank, as the debug server's frontend at ``target`` lists them (or
    ``target`` itself as rank 0, where it is a worker). ``FetchError`` where it cannot be asked (the
    job may not have started), ``WatchError`` where it answers but is no debug server."""
    try:
        listed = fetch(target, "/handler/", method="GET", timeout=timeout, max_bytes=MAX_LIST_BYTES)
    except FetchError as error:
        if error.status is None:
            raise
        listed = b""
    if handlers_of(listed):
        return {0: target}
    for page in PAGES:
        try:
            text = fetch(target, page, method="GET", timeout=timeout, max_bytes=MAX_PAGE_BYTES)
        except FetchError as error:
            if error.status == 404:
                continue
            if error.status is not None:
                raise WatchError(f"{target}{page} answers HTTP {error.status}: is it PyTorch's debug server?") from None
            raise
        workers = ranks_on_page(text)
        if workers:
            return workers
    raise WatchError(f"{target} answers, but is not PyTorch's debug server: no rank is listed at "
                     f"{' or '.join(PAGES)} (give the frontend's address, port {DEFAULT_PORT} by default, or the "
                     "workers' addresses)")  # fmt: skip


def handlers_of(listed: bytes) -> list[str]:
    """The handler names a worker's ``GET /handler/`` lists (a JSON list of strings); empty for anything else."""
    try:
        names = json.loads(listed)
    except (ValueError, RecursionError):
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names[:1000]):
        return []
    return names[:1000] if any(name == RECORDERS[1][1] for name in names[:1000]) else []


def ranks_on_page(page: bytes) -> dict[int, Url]:
    """Each rank's worker as a frontend page lists it: ``<h2>Rank <N>: http://host:port/handler/...</h2>``,
    ranks in order from 0 (as the page's template numbers them; a header that breaks the order, such as
    one inside a rank's answer, is not taken), each address checked."""
    return _numbered(((int(rank), address.decode("ascii", "replace")) for rank, address in _RANK_HEADER.findall(page)))


def workers_gone(workers: dict[int, Url], timeout: float) -> bool:
    """Whether every worker's server went away (the connection refused, its host unknown): a read-only
    ``GET /handler/`` to each, stopping at the first that answers in any way (or is merely slow)."""
    for url in workers.values():
        try:
            fetch(url, "/handler/", method="GET", timeout=timeout, max_bytes=MAX_LIST_BYTES)
        except FetchError as error:
            if error.gone:
                continue
        return False
    return bool(workers)


def workers_in_stacks(text: str) -> dict[int, Url]:
    """Each rank's worker as the debug server's periodic ``stacks_<time>.txt`` names it in its headers."""
    return _numbered(((int(rank), address) for rank, address in _STACKS_HEADER.findall(text)))


def _numbered(headers: Iterable[tuple[int, str]]) -> dict[int, Url]:
    """The workers of (rank, address) headers in order from rank 0: a header that breaks the order is
    passed over, and the first address that is no URL ends the list."""
    workers: dict[int, Url] = {}
    for rank, address in headers:
        if rank != len(workers) or rank >= MAX_RANKS:
            continue
        try:
            workers[rank] = parse_url(address)
        except ValueError:
            break
    return workers


def parse_targets(targets: list[str]) -> list[tuple[int | None, Url]]:
    """The URLs given on the command line: ``URL`` (its rank: its place among them) or ``RANK=URL``;
    ``WatchError`` for one that is neither."""
    parsed: list[tuple[int | None, Url]] = []
    for text in targets:
        found = _RANK_URL.fullmatch(text.strip())
        rank, address = (int(found.group(1)), found.group(2)) if found else (None, text)
        try:
            parsed.append((rank, parse_url(address, DEFAULT_PORT if len(targets) == 1 and rank is None else None)))
        except ValueError as error:
            raise WatchError(f"{text}: {error}") from None
    return parsed


@dataclass(frozen=True, slots=True)
class Answer:
    """One rank's Flight Recorders (raw JSON, by recorder name) and stacks, or why not."""

    recorders: dict[str, bytes] = field(default_factory=dict)
    stacks: bytes | None = None
    failure: FetchError | None = None


class HttpSource:
    """The ranks' worker servers, polled through a pool of ``in_flight`` threads: never more requests at
    once, each bounded by ``timeout``, and a rank still being asked is not asked again."""

    def __init__(self, workers: dict[int, Url], *, timeout: float, in_flight: int,
                 max_bytes: int = MAX_RESPONSE_BYTES) -> None:  # fmt: skip
        self.workers = dict(sorted(workers.items()))
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.pool = ThreadPoolExecutor(max_workers=max(1, in_flight), thread_name_prefix="fr2perfetto-watch")
        self.busy: dict[int, Future[Answer]] = {}
        names = [name for name, _, _ in RECORDERS]
        # the recorders asked, by rank: all the worker has until one of them has entries, then those that do
        self.recorders: dict[int, list[str]] = {rank: list(names) for rank in self.workers}
        self.requests = 0  # sent so far
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"{len(self.workers)} worker servers" if len(self.workers) > 1 else str(self.workers[0])

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _count(self) -> None:
        with self._lock:
            self.requests += 1

    def learn_recorders(self) -> None:
        """Which recorders the workers have (``GET /handler/`` of rank 0's; where it does not say, both are tried)."""
        first = next(iter(self.workers.values()))
        with contextlib.suppress(FetchError):
            listed = fetch(first, "/handler/", method="GET", timeout=self.timeout, max_bytes=MAX_LIST_BYTES)
            names = handlers_of(listed)
            if names:
                have = [name for name, handler, _ in RECORDERS if handler in names]
                self.recorders = {rank: list(have) for rank in self.workers}

    def poll(self, budget: float) -> dict[int, Sample | Failure]:
        """Ask every rank not being asked already where it stands; what came back within ``budget``
        seconds (ranks still being asked are left out: no news)."""
        for rank in self.workers:
            if rank not in self.busy:
                self.busy[rank] = self.pool.submit(self._ask, rank, True, False)
        wait_for(list(self.busy.values()), timeout=max(0.0, budget))
        answers: dict[int, Sample | Failure] = {}
        for rank, future in list(self.busy.items()):
            if not future.done():
                continue
            del self.busy[rank]
            answers[rank] = self._judge(rank, future.result())
        return answers

    def _judge(self, rank: int, answer: Answer) -> Sample | Failure:
        if answer.failure is not None:
            return Failure(str(answer.failure), gone=answer.failure.gone)
        samples: list[Sample] = []
        with_entries: list[str] = []
        problems: list[str] = []
        for name, data in answer.recorders.items():
            try:
                dump = read_dump(f"rank_{rank}.json", data, max_bytes=self.max_bytes)
            except DumpError as error:
                problems.append(f"its {name} Flight Recorder could not be read ({error})")
                continue
            samples.append(sample_of_dump(dump))
            if dump.entries:
                with_entries.append(name)
        if not samples:
            return Failure(problems[0] if problems else "no Flight Recorder answered")
        if with_entries and len(with_entries) < len(self.recorders[rank]):
            self.recorders[rank] = with_entries
        return merge(samples)

    def _ask(self, rank: int, recorders: bool, stacks: bool, full: bool = False) -> Answer:
        """One rank's recorders (by poll: NCCL's active ops only; ``full``: every entry) and stacks. Never
        raises: a failure is in the answer (a recorder the worker lacks, a 404, is left out)."""
        url = self.workers[rank]
        got: dict[str, bytes] = {}
        failure: FetchError | None = None
        if recorders:
            for name, handler, query in RECORDERS:
                if name not in self.recorders[rank]:
                    continue
                path = f"/handler/{handler}" + (f"?{query}" if query and not full else "")
                try:
                    self._count()
                    got[name] = fetch(url, path, timeout=self.timeout, max_bytes=self.max_bytes)
                except FetchError as error:
                    if error.status == 404 and name != RECORDERS[-1][0]:
                        self.recorders[rank] = [n for n in self.recorders[rank] if n != name]
                        continue
                    failure = failure or error
            if not got:
                return Answer(failure=failure or FetchError("no Flight Recorder answered"))
        text = None
        if stacks:
            try:
                self._count()
                text = fetch(url, f"/handler/{STACKS_HANDLER}", timeout=self.timeout, max_bytes=MAX_STACKS_BYTES)
            except FetchError as error:
                if not got:
                    return Answer(failure=error)
        return Answer(got, text)

    def gather(self, ranks: Iterable[int] | None = None) -> dict[int, Answer]:
        """Every rank's whole recorders and stacks, through the same pool (waiting for polls in flight first)."""
        wait_for(list(self.busy.values()), timeout=self.timeout + 1)
        self.busy.clear()
        chosen = list(self.workers if ranks is None else ranks)
        futures = {rank: self.pool.submit(self._ask, rank, True, True, True) for rank in chosen}
        # each request is bounded by the timeout: a rank's two or three, then its place in the queue
        wait_for(list(futures.values()), timeout=(len(RECORDERS) + 1) * self.timeout * (1 + len(chosen)))
        return {rank: future.result() for rank, future in futures.items() if future.done()}


def start_http(targets: list[str], *, timeout: float, in_flight: int, wait: float,
               clock: Callable[[], float], sleep: Callable[[float], None],
               said: Callable[[str], None]) -> HttpSource:  # fmt: skip
    """The workers of the job at ``targets`` (the frontend's address, or the workers'), waiting up to
    ``wait`` seconds for a job that is not up yet; ``WatchError`` when it never answers or is no debug
    server."""
    parsed = parse_targets(targets)
    deadline = clock() + wait
    if len(parsed) == 1 and parsed[0][0] is None:
        target = parsed[0][1]
        waiting_said = False
        while True:
            try:
                workers = find_workers(target, timeout)
                break
            except FetchError as error:
                if clock() >= deadline:
                    raise WatchError(f"{target}: {error}, for {wait:g} s: the job never started its debug server "
                                     "there, or this is not its address") from None  # fmt: skip
                if not waiting_said:
                    said(f"waiting for the debug server at {target} ({error})")
                    waiting_said = True
                sleep(min(1.0, max(0.0, deadline - clock())))
    else:
        workers = {}
        for place, (rank, url) in enumerate(parsed):
            number = place if rank is None else rank
            if number in workers:
                raise WatchError(f"rank {number} is given twice")
            workers[number] = url
    source = HttpSource(workers, timeout=timeout, in_flight=in_flight)
    return source


# A folder


@dataclass(slots=True)
class _Seen:
    mtime_ns: int
    size: int


class FolderSource:
    """A folder that the debug server (``dump_dir``) or the capture helper writes into: each round, the
    files new or changed since the last (the top of the folder only): stack snapshots (where each rank
    is), Flight Recorder dumps (where it stands), and the capture helper's ``.ended`` files (how it
    ended). The worker addresses the debug server's snapshots name are kept, to take the evidence from."""

    def __init__(self, folder: str, *, max_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.seen: dict[str, _Seen] = {}
        self.workers: dict[int, Url] = {}
        self.endings: dict[int, str] = {}
        self.last_new: float | None = None  # when a file last appeared or changed
        self.intervals: list[float] = []  # between the debug server's snapshots, as seen
        self._last_snapshot: float | None = None
        self.ranks: set[int] = set()
        self.recorded: set[int] = set()  # ranks a dump of the folder was read for

    @property
    def label(self) -> str:
        return self.folder

    def close(self) -> None:
        pass

    def poll(self, now: float) -> dict[int, Sample | Failure]:
        answers: dict[int, Sample | Failure] = {}
        changed = self._changed()
        if changed:
            self.last_new = now
        stacks: list[StackSnapshot] = []
        for path, kind in changed:
            if kind == "dump":
                self._dump(path, answers)
            elif kind == "stacks":
                stacks += self._stacks(path, now, answers)
            elif kind == "ended":
                self._ended(path)
        for snapshot in sorted(stacks, key=lambda s: s.time_ns or 0):
            if snapshot.rank not in self.recorded:
                answers[snapshot.rank] = sample_of_stacks(snapshot)
            self.ranks.add(snapshot.rank)
        return answers

    def _changed(self) -> list[tuple[str, str]]:
        try:
            with os.scandir(self.folder) as entries:
                found = []
                for number, entry in enumerate(entries):
                    if number >= MAX_FOLDER_FILES:
                        break
                    kind = kind_of(entry.name)
                    if kind not in ("dump", "stacks", "ended") or not entry.is_file(follow_symlinks=False):
                        continue
                    status = entry.stat(follow_symlinks=False)
                    seen = _Seen(status.st_mtime_ns, status.st_size)
                    if self.seen.get(entry.path) != seen:
                        self.seen[entry.path] = seen
                        found.append((entry.path, kind))
        except OSError:
            return []
        return sorted(found)

    def _dump(self, path: str, answers: dict[int, Sample | Failure]) -> None:
        try:
            dump = read_dump(path, max_bytes=self.max_bytes)
        except DumpError:
            return  # half written, or not a dump: its next version is read
        self.recorded.add(dump.rank)
        self.ranks.add(dump.rank)
        answers[dump.rank] = sample_of_dump(dump)

    def _stacks(self, path: str, now: float, answers: dict[int, Sample | Failure]) -> list[StackSnapshot]:
        try:
            with open_regular(path) as handle:
                text = handle.read(TEXT_LIMIT).decode("utf-8", "replace")
        except OSError:
            return []
        snapshots = parse_stacks(text, path)
        workers = workers_in_stacks(text)
        if workers:  # the debug server's: every rank, those it could not reach with an error in their place
            self.workers = workers
            if self._last_snapshot is not None:
                self.intervals = [*self.intervals[-9:], now - self._last_snapshot]
            self._last_snapshot = now
            answered = {s.rank for s in snapshots}
            for rank in workers:
                self.ranks.add(rank)
                if rank not in answered:
                    answers[rank] = Failure("the debug server got no stacks of it")
        return snapshots

    def _ended(self, path: str) -> None:
        from ..read.files import parse_dump_name

        name = parse_dump_name(os.path.basename(path)[: -len(".ended")])
        if name is None:
            return
        with contextlib.suppress(OSError):
            with open_regular(path) as handle:
                text = handle.read(4096).decode("utf-8", "replace").strip()
            self.endings[name.rank] = text.splitlines()[0] if text else ""

    def interval(self) -> float | None:
        """The debug server's snapshot interval, as seen (the median of the last ones)."""
        if not self.intervals:
            return None
        ordered = sorted(self.intervals)
        return ordered[len(ordered) // 2]

    def finished(self) -> dict[int, str] | None:
        """How each rank ended, where every rank known has a ``.ended`` file that says it ended (not
        ``running``, a dump taken on request); None while any runs or is not known to have ended."""
        if not self.ranks or any(self.endings.get(rank, "running") == "running" for rank in self.ranks):
            return None
        return {rank: self.endings[rank] for rank in sorted(self.ranks)}
