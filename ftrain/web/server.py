"""The HTTP side of `ftrain ui`: the standard library's threading HTTP server in front of one asyncio loop
that owns the connection to the log (each request thread hands its read to the loop and waits).

Private to its user: it listens on 127.0.0.1 (or a Unix socket made 0600), and every request must carry the
token printed at start, as `?token=` once (answered with a cookie, HttpOnly and SameSite=Strict, and a
redirect to the same page without it), the cookie, or `Authorization: Bearer`. A request without it gets 401
and nothing else, and one log line. Only GET and HEAD exist: there is no write path. Every page is sent with
a Content-Security-Policy that allows the package's own stylesheet and script and nothing inline.
"""

import asyncio
import hmac
import os
import socket
import socketserver
import threading
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import structlog

from ftrain.errors import NotFound
from ftrain.events.schema import now
from ftrain.web import pages
from ftrain.web.reader import Reader

T = TypeVar("T")
log = structlog.get_logger(__name__)

POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
ASSETS = {"/static/ui.css": "text/css; charset=utf-8", "/static/ui.js": "text/javascript; charset=utf-8"}
LIVE_POLL_S = 0.5
"""How often an open live stream asks the log for its last sequence."""
KEEPALIVE_S = 15.0
READ_TIMEOUT_S = 120.0


class Served:
    """What every request thread shares: the loop that reads, the reader, the token, and a stop flag."""

    def __init__(self, loop: asyncio.AbstractEventLoop, reader: Reader, token: str, cookie: str) -> None:
        self.loop, self.reader, self.token, self.cookie = loop, reader, token, cookie
        self.stopping = threading.Event()

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run a read on the loop and wait for it."""

        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(READ_TIMEOUT_S)

    def valid(self, offered: str | None) -> bool:
        """Whether `offered` is the token (compared in constant time)."""
        return offered is not None and hmac.compare_digest(offered.encode(), self.token.encode())


class Handler(BaseHTTPRequestHandler):
    """One request: authorize, route, render."""

    server: "UiServer | UnixUiServer"
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a client may take to send a request: an idle or stalled one frees its thread
    server_version = "ftrain-ui"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        """Quiet: the refusals are logged by `_refuse`, one line each."""

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_GET(self) -> None:
        self._handle(head=False)

    def _handle(self, *, head: bool) -> None:
        served = self.server.served
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if (offered := query.get("token", [None])[0]) is not None and served.valid(offered):
            rest = urlencode([(k, v) for k, vs in query.items() if k != "token" for v in vs], doseq=False)
            cookie = f"{served.cookie}={served.token}; Path=/; HttpOnly; SameSite=Strict"
            here = "/" + url.path.lstrip("/")  # never `//host`: a redirect stays on this server
            self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head,
                       {"Location": here + (f"?{rest}" if rest else ""), "Set-Cookie": cookie})  # fmt: skip
            return
        if not (served.valid(self._cookie()) or served.valid(self._bearer())):
            self._refuse(head, "wrong token" if offered or self._cookie() or self._bearer() else "no token")
            return
        try:
            self._route(url.path, query, head)
        except NotFound as exc:
            self._page(HTTPStatus.NOT_FOUND, pages.not_found(str(exc), self._seq()), head)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # the log out of reach, a read timing out: the view stays up, says so
            log.warning("ui read failed", path=url.path, error=f"{type(exc).__name__}: {exc}")
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"the log could not be read\n", "text/plain", head)

    def _route(self, path: str, query: dict[str, list[str]], head: bool) -> None:
        served = self.server.served
        parts = [unquote(p) for p in path.split("/")[1:]]
        if path == "/":
            views = served.call(served.reader.runs)
            self._page(HTTPStatus.OK, pages.runs_page(views, self._seq(), now()), head)
        elif path in ASSETS:
            body = files("ftrain.web").joinpath("static", path.rsplit("/", 1)[1]).read_bytes()
            self._send(HTTPStatus.OK, body, ASSETS[path], head)
        elif path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon", head)
        elif path == "/live":
            self._live(head)
        elif path == "/metrics":
            self._metrics(head)
        elif len(parts) == 2 and parts[0] == "runs":
            every = query.get("all", [""])[0] == "1"
            detail = served.call(lambda: served.reader.run(parts[1], every))
            self._page(HTTPStatus.OK, pages.run_page(detail, self._seq(), now()), head)
        elif len(parts) == 4 and parts[0] == "runs" and parts[2] == "events" and _sequence(parts[3]):
            verdict = served.call(lambda: served.reader.event(parts[1], int(parts[3])))
            self._page(HTTPStatus.OK, pages.event_page(verdict, self._seq()), head)
        else:
            raise NotFound(f"no page at {path}")

    def _metrics(self, head: bool) -> None:
        """The Prometheus exposition of every run, as `ftrain metrics` serves it, behind this view's token."""
        served = self.server.served
        body, content_type = served.call(lambda: served.reader.metrics(self.headers.get("Accept")))
        self._send(HTTPStatus.OK, body, content_type, head)

    def _live(self, head: bool) -> None:
        """Server-sent events: the stream's last sequence, each time it changes, until the client leaves."""
        served = self.server.served
        self.send_response(HTTPStatus.OK)
        self._headers("text/event-stream", None)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if head:
            return
        shown, quiet = -1, 0.0
        while not served.stopping.is_set():
            try:
                seq = served.call(served.reader.last_seq)
            except Exception as exc:  # headers are sent: end the stream; the browser reconnects
                log.warning("ui live stream ended", error=f"{type(exc).__name__}: {exc}")
                return
            if seq != shown:
                self.wfile.write(f"data: {seq}\n\n".encode())
                shown, quiet = seq, 0.0
            elif quiet >= KEEPALIVE_S:
                self.wfile.write(b": keep-alive\n\n")
                quiet = 0.0
            self.wfile.flush()
            served.stopping.wait(LIVE_POLL_S)
            quiet += LIVE_POLL_S

    def _seq(self) -> int:
        served = self.server.served
        return served.call(served.reader.last_seq)

    def _cookie(self) -> str | None:
        try:
            jar = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        morsel = jar.get(self.server.served.cookie)
        return morsel.value if morsel is not None else None

    def _bearer(self) -> str | None:
        scheme, _, value = self.headers.get("Authorization", "").partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None

    def _refuse(self, head: bool, why: str) -> None:
        log.warning("ui request refused", status=401, reason=why, path=urlsplit(self.path).path[:200])
        self._send(HTTPStatus.UNAUTHORIZED, b"401: open the URL `ftrain ui` printed (it carries the token)\n",
                   "text/plain", head, {"WWW-Authenticate": 'Bearer realm="ftrain ui"'})  # fmt: skip

    def _page(self, status: HTTPStatus, html: str, head: bool) -> None:
        self._send(status, html.encode(), "text/html; charset=utf-8", head)

    def _headers(self, content_type: str, length: int | None) -> None:
        self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("Content-Security-Policy", POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Frame-Options", "DENY")

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str,
        head: bool,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self._headers(content_type, len(body))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)


class UiServer(ThreadingHTTPServer):
    """The TCP server (127.0.0.1); `served` is what its request threads share."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], served: Served) -> None:
        self.served = served
        super().__init__(address, Handler)


class UnixUiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The same on a Unix socket, created 0600 (the view is its user's only)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, path: Path, served: Served) -> None:
        self.served = served
        old = os.umask(0o177)
        try:
            super().__init__(str(path), Handler)
        finally:
            os.umask(old)

    def get_request(self) -> tuple[socket.socket, Any]:
        request, _ = super().get_request()
        return request, ("unix", 0)  # the handler reads client_address[0]


def _sequence(text: str) -> bool:
    """Whether `text` is a stream sequence as a URL writes it: ASCII digits, at most 19 of them."""
    return text.isascii() and text.isdigit() and len(text) <= 19


def cookie_name(where: str) -> str:
    """One cookie per listening address: two views on one host (127.0.0.1:8001, :8002) keep apart."""
    return "ftrain_ui_" + "".join(c if c.isalnum() else "_" for c in where)
