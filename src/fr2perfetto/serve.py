"""Serve a trace once to ui.perfetto.dev from 127.0.0.1, the way Perfetto's own open_trace_in_ui does.

The UI fetches ``http://127.0.0.1:9001/<file>`` (the one local port its content security policy
allows) when opened at its ``#!/?url=`` deep link; the server answers that one request with the CORS
header the UI needs, then stops. Ctrl-C stops it too.

Any local process can connect to that port, so the file is served only under a random token in its
path (which only the printed link holds). Connections are served at once and side by side, each in a
thread of its own: one that is slow or says nothing delays no other, and each must have sent its whole
request within ``REQUEST_SECONDS`` (a deadline for the request, not for each read: a client that sends a
byte every second gains nothing), after which it is closed. A fetch the browser aborts is nothing to print
a traceback about.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import secrets
import socket
import threading
import urllib.parse
import webbrowser
from collections.abc import Callable
from typing import Any

from .layout.focus import link_arguments, read_focus

UI_ORIGIN = "https://ui.perfetto.dev"
UI_PORT = 9001
REQUEST_SECONDS = 3.0  # how long one connection may take to send its whole request
SEND_SECONDS = 30.0  # how long sending the answer may wait on one write
MAX_CONNECTIONS = 32  # served at once; more are closed unanswered


def deep_link(port: int, name: str, origin: str = UI_ORIGIN, focus: str = "") -> str:
    """The UI address that makes it fetch the trace from this machine (``focus``: the window, the slice
    to select and the startup commands, ``focus.link_arguments``)."""
    url = f"http://127.0.0.1:{port}/{urllib.parse.quote(name)}"
    return f"{origin}/#!/?url={urllib.parse.quote(url, safe=':/')}&referrer=fr2perfetto{focus}"


class _OneTraceHandler(http.server.BaseHTTPRequestHandler):
    server: _OneTraceServer
    timeout = REQUEST_SECONDS  # the socket's, for each read; the deadline below bounds them all

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(REQUEST_SECONDS, self._too_slow)
        self._deadline.daemon = True
        self._deadline.start()

    def _too_slow(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)  # the blocked read returns, and the thread ends

    def _request_read(self) -> None:
        """The whole request is in: no deadline for it any more, a generous one for each write."""
        self._deadline.cancel()
        self.connection.settimeout(SEND_SECONDS)

    def finish(self) -> None:
        self._deadline.cancel()
        with contextlib.suppress(OSError):
            super().finish()

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", self.server.origin)
        self.send_header("Cache-Control", "no-cache")

    def do_OPTIONS(self) -> None:
        self._request_read()
        self.send_response(204)
        self._cors()
        self.send_header("Access-Control-Allow-Methods", "GET")
        self.end_headers()

    def do_GET(self) -> None:
        self._request_read()
        if urllib.parse.unquote(self.path.split("?")[0]) != "/" + self.server.name:  # the token is in it
            self.send_error(404, "Not found")
            return
        size = os.path.getsize(self.server.path)
        self.send_response(200)
        self._cors()
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        try:
            with open(self.server.path, "rb") as trace:
                while chunk := trace.read(1 << 20):
                    self.wfile.write(chunk)
        except OSError:
            return  # the fetch was aborted (or timed out): serve the next one
        self.server.fetched.set()

    def log_message(self, format: str, *args: object) -> None:
        pass  # the command prints its own one-line messages


class _OneTraceServer(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a connection still open when the trace was fetched does not hold the command

    def __init__(self, path: str, port: int, origin: str) -> None:
        super().__init__(("127.0.0.1", port), _OneTraceHandler)
        self.path = os.path.abspath(path)
        self.name = f"{secrets.token_urlsafe(16)}/{os.path.basename(path)}"
        self.origin = origin
        self.fetched = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: this one is not served
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that went away (or never spoke) is not the command's error


def link_to(trace_url: str, path: str, origin: str = UI_ORIGIN) -> str:
    """The deep link that opens the trace ``path`` (its focus read from it) where it is served already,
    at ``trace_url`` (by a server that lets the UI's origin fetch it)."""
    return f"{origin}/#!/?url={urllib.parse.quote(trace_url, safe=':/')}&referrer=fr2perfetto" + link_arguments(
        read_focus(path)
    )


def serve_once(
    path: str,
    *,
    port: int = UI_PORT,
    origin: str = UI_ORIGIN,
    open_browser: Callable[[str], bool] | None = None,
    announce: Callable[[str, bool], None] = lambda link, opened: None,
) -> bool:
    """Serve ``path`` until the UI fetched it once (True) or Ctrl-C (False).

    ``announce(link, opened)`` is told the deep link and whether a browser could be opened at it
    (a remote shell has none: then the person opens the printed link).
    """
    server = _OneTraceServer(path, port, origin)
    try:
        link = deep_link(server.server_address[1], server.name, origin, link_arguments(read_focus(path)))
        try:
            opened = bool((open_browser or webbrowser.open_new_tab)(link))
        except Exception:  # no browser is not an error: the link is printed
            opened = False
        announce(link, opened)
        server.timeout = 0.5
        while not server.fetched.is_set():
            server.handle_request()
        return True
    except KeyboardInterrupt:
        return False
    finally:
        server.server_close()
