"""A stand-in for PyTorch's debug server on 127.0.0.1, for the watch's tests and its measurements: a frontend
that lists every rank's worker (as ``/wait_counters`` does, ``_frontend.py``'s template) and a worker per
rank that answers as torch 2.13's do (``POST /handler/fr_trace_json``, ``POST /handler/dump_traceback``,
``GET /handler/``; a GET of a handler is a 404), from a made-up gloo job whose ranks all-reduce on the
default group. A rank may be made to stop (``stop``), to answer slowly, with garbage, a byte at a time, or
far too much (``behaviour``); ``close`` makes every server go away at once.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

T0 = 1_796_000_000_000_000_000
STEP_NS = 100_000_000


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler held on purpose (a silent server) must not hold the test

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up on a garbled answer: what the test wants, not worth a traceback


class FakeJob:
    """``ranks`` ranks; each all-reduces ``rate`` times a second while ``running``; the Flight Recorder
    keeps the last ``entries`` ops. ``stop(rank)``: that rank stops before its next op, the others wait in it."""

    def __init__(
        self, ranks: int, *, rate: float = 10.0, entries: int = 50, frames: bool = False, ops: int = 0
    ) -> None:
        self.ranks = ranks
        self.rate = rate
        self.entries = entries
        self.frames = frames
        self.ops = [ops] * ranks  # ops each rank issued so far
        self.stuck: int | None = None
        self.behaviour: dict[int, str] = {}
        self.frontend_behaviour = "ok"
        self.desc = "default_pg"
        self.requests = [0] * ranks  # POSTs each worker got
        self.gets = 0
        self.in_flight = 0  # POSTs being answered now, and the most there ever were at once
        self.most_in_flight = 0
        self.lock = threading.Lock()
        self.running = True
        self._cache: dict[tuple[int, int], bytes] = {}
        self.workers = [self._serve(self._worker_handler(rank)) for rank in range(ranks)]
        self.frontend = self._serve(self._frontend_handler())
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.frontend.server_address[1]}"

    def worker_url(self, rank: int) -> str:
        return f"http://127.0.0.1:{self.workers[rank].server_address[1]}"

    def stop(self, rank: int) -> None:
        """Rank ``rank`` stops before its next op; the others issue that op and wait in it."""
        with self.lock:
            self.stuck = rank

    def close(self) -> None:
        """Every server goes away (a job that ended)."""
        self.running = False
        for server in [self.frontend, *self.workers]:
            server.shutdown()
            server.server_close()

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> _Server:
        server = _Server(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return server

    def _tick(self) -> None:
        while self.running:
            time.sleep(1 / self.rate)
            with self.lock:
                for rank in range(self.ranks):
                    if self.stuck is None:
                        self.ops[rank] += 1
                    elif rank != self.stuck:
                        self.ops[rank] = self.ops[self.stuck] + 1  # into the op the stuck rank never issues

    # What a rank answers

    def recorder(self, rank: int) -> bytes:
        with self.lock:
            done = self.ops[rank]
            waiting = self.stuck is not None and rank != self.stuck
        key = (rank, done * 2 + waiting)
        if key not in self._cache:
            self._cache = {k: v for k, v in self._cache.items() if k[0] != rank}
            self._cache[key] = json.dumps(self._dump(rank, done, waiting), separators=(",", ":")).encode()
        return self._cache[key]

    def _dump(self, rank: int, done: int, waiting: bool) -> dict[str, Any]:
        first = max(1, done - self.entries + 1)
        frames = (
            [{"name": "all_reduce", "filename": "/torch/distributed/distributed_c10d.py", "line": 3245},
             {"name": "train_step", "filename": "/job/train.py", "line": 19}]
            if self.frames else []
        )  # fmt: skip
        entries = [
            {"collective_seq_id": seq, "input_dtypes": ["Float"], "input_sizes": [[4]], "is_p2p": False, "op_id": seq,
             "output_dtypes": ["Float"], "output_sizes": [[4]], "p2p_seq_id": 0, "pg_id": 0,
             "process_group": ["0", self.desc], "profiling_name": "gloo:all_reduce", "record_id": seq - 1,
             "retired": seq < done, "state": "scheduled", "thread_id": "1", "thread_name": "python",
             "time_created_ns": T0 + seq * STEP_NS, "time_discovered_completed_ns": 0,
             "time_discovered_started_ns": 0, "timeout_ms": 300000, **({"frames": frames} if frames else {})}
            for seq in range(first, done + 1)
        ]  # fmt: skip
        completed = done - 1 if waiting else done
        return {
            "comm_lib_version": "",
            "entries": entries,
            "nccl_comm_state": {},
            "pg_config": {"": {"desc": "", "name": "", "ranks": str(list(range(self.ranks)))}},
            "pg_status": {
                "0": {
                    "last_completed_collective": str(completed),
                    "last_enqueued_collective": str(done),
                    "last_started_collective": "-1",
                }
            },
            "version": "2.10",
        }

    def stacks(self, rank: int) -> bytes:
        if self.stuck == rank:
            inner = '  File "/job/train.py", line 17 in train_step\n'
        else:
            inner = '  File "/torch/distributed/distributed_c10d.py", line 3245 in all_reduce\n'
            inner += '  File "/job/train.py", line 19 in train_step\n'
        return (f"Thread 0x00007f0000000001 (most recent call first):\n{inner}"
                '  File "/job/train.py", line 30 in <module>\n').encode()  # fmt: skip

    # The servers

    def _worker_handler(self, rank: int) -> type[BaseHTTPRequestHandler]:
        job = self

        class Worker(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with job.lock:
                    job.gets += 1
                if self.path == "/handler/":
                    self._send(200, b'["torch_profile","dump_traceback","pyspy_dump","wait_counter_values",'
                                    b'"fr_trace_json","ping"]')  # fmt: skip
                else:
                    self._send(404, b"")

            def do_POST(self) -> None:
                with job.lock:
                    job.requests[rank] += 1
                    job.in_flight += 1
                    job.most_in_flight = max(job.most_in_flight, job.in_flight)
                try:
                    self._answer()
                finally:
                    with job.lock:
                        job.in_flight -= 1

            def _answer(self) -> None:
                behaviour = job.behaviour.get(rank, "ok")
                if behaviour == "slow":
                    time.sleep(30)
                    return
                if behaviour == "garbage":
                    self._send(200, b"\x1b[31mnot json at all\x00" * 100)
                    return
                if behaviour == "dribble":  # headers, then a byte now and then, for ever
                    self.send_response(200)
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    for _ in range(600):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                if behaviour == "huge":
                    self.send_response(200)
                    self.end_headers()
                    chunk = b"x" * (1 << 20)
                    for _ in range(1 << 14):
                        self.wfile.write(chunk)
                    return
                if self.path.startswith("/handler/fr_trace_json"):
                    self._send(200, job.recorder(rank), "application/json")
                elif self.path.startswith("/handler/dump_traceback"):
                    self._send(200, job.stacks(rank), "text/plain")
                else:
                    self._send(404, b"Handler not found")

            def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

        return Worker

    def _frontend_handler(self) -> type[BaseHTTPRequestHandler]:
        job = self

        class Frontend(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                behaviour = job.frontend_behaviour
                if behaviour == "silent":
                    time.sleep(30)
                    return
                if behaviour == "garbage":
                    body = b"<html>\x1b]0;pwned\x07 a page, but no rank on it</html>"
                elif self.path == "/wait_counters":
                    page = "<h2>Rank {}: {}/handler/wait_counter_values?</h2><pre>{{}}</pre>"
                    headers = (page.format(rank, job.worker_url(rank)) for rank in range(job.ranks))
                    body = ("<!doctype html><section>" + "".join(headers)).encode()
                else:
                    self.send_error(404, f"Handler not found: {self.path}")
                    return
                self.send_response(200)
                self.send_header("Content-type", "text/html")
                self.end_headers()
                self.wfile.write(body)

        return Frontend
