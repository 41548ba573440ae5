"""Serve a trace once to ui.perfetto.dev from 127.0.0.1, the way Perfetto's own open_trace_in_ui does.

The UI fetches ``http://127.0.0.1:9001/<file>`` (the one local port its content security policy
allows) when opened at its ``#!/?url=`` deep link; the server answers that one request with the CORS
header the UI needs, then stops. Ctrl-C stops it too.

Any local process can connect to that port, so the file is served only under a random token in its
path (which only the printed link holds); connections are served one at a time, each given a few
seconds, so that one idle connection cannot hold the real fetch; a fetch the browser aborts is
nothing to print a traceback about.
"""

from __future__ import annotations

import http.server
import os
import secrets
import urllib.parse
import webbrowser
from collections.abc import Callable

from .focus import link_arguments, read_focus

UI_ORIGIN = "https://ui.perfetto.dev"
UI_PORT = 9001
CONNECTION_SECONDS = 3.0  # how long one connection may take to send its request (and read the answer)


def deep_link(port: int, name: str, origin: str = UI_ORIGIN, focus: str = "") -> str:
    """The UI address that makes it fetch the trace from this machine (``focus``: the window, the slice
    to select and the startup commands, ``focus.link_arguments``)."""
    url = f"http://127.0.0.1:{port}/{urllib.parse.quote(name)}"
    return f"{origin}/#!/?url={urllib.parse.quote(url, safe=':/')}&referrer=fr2perfetto{focus}"


class _OneTraceHandler(http.server.BaseHTTPRequestHandler):
    server: _OneTraceServer
    timeout = CONNECTION_SECONDS  # the socket's: an idle or slow client is dropped

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", self.server.origin)
        self.send_header("Cache-Control", "no-cache")

    def do_OPTIONS(self) -> None:
        self.send_response(204)
        self._cors()
        self.send_header("Access-Control-Allow-Methods", "GET")
        self.end_headers()

    def do_GET(self) -> None:
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
        self.server.fetched = True

    def log_message(self, format: str, *args: object) -> None:
        pass  # the command prints its own one-line messages


class _OneTraceServer(http.server.HTTPServer):
    def __init__(self, path: str, port: int, origin: str) -> None:
        super().__init__(("127.0.0.1", port), _OneTraceHandler)
        self.path = os.path.abspath(path)
        self.name = f"{secrets.token_urlsafe(16)}/{os.path.basename(path)}"
        self.origin = origin
        self.fetched = False

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that went away (or never spoke) is not the command's error


def serve_once(
    path: str,
    *,
    port: int = UI_PORT,
    origin: str = UI_ORIGIN,
    open_browser: Callable[[str], bool] | None = None,
    announce: Callable[[str, bool], None] = lambda link, opened: None,
    serve: bool = True,
) -> bool:
    """Serve ``path`` until the UI fetched it once (True) or Ctrl-C (False).

    ``announce(link, opened)`` is told the deep link and whether a browser could be opened at it
    (a remote shell has none: then the person opens the printed link); ``serve`` false: only that.
    """
    server = _OneTraceServer(path, port, origin)
    try:
        link = deep_link(server.server_address[1], server.name, origin, link_arguments(read_focus(path)))
        try:
            opened = bool((open_browser or webbrowser.open_new_tab)(link))
        except Exception:  # no browser is not an error: the link is printed
            opened = False
        announce(link, opened)
        if not serve:
            return False
        server.timeout = 0.5
        while not server.fetched:
            server.handle_request()
        return True
    except KeyboardInterrupt:
        return False
    finally:
        server.server_close()
