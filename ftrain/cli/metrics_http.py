"""The HTTP side of `ftrain metrics`: GET /metrics with the bearer token, in the server's own threads; each
scrape runs on the event loop that holds the service (one read-model connection, one log connection)."""

import asyncio
import hmac
import socket
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

SCRAPE_TIMEOUT = 60.0
log = structlog.get_logger(__name__)

Scrape = Callable[[str | None], Coroutine[Any, Any, tuple[bytes, str]]]


class _Handler(BaseHTTPRequestHandler):
    """GET /metrics with the token; 401 without it, 404 elsewhere; one log line per refusal."""

    server: "MetricsServer"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if not self.server.authorized(self.headers.get("Authorization", "")):
            log.warning("metrics_refused", client=self.client_address[0], why="no valid bearer token")
            self._answer(401, b"401 unauthorized: send Authorization: Bearer <token>\n", "text/plain",
                         {"WWW-Authenticate": 'Bearer realm="ftrain metrics"'})  # fmt: skip
            return
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, b"404 not found: ftrain serves /metrics only\n", "text/plain")
            return
        try:
            body, content_type = self.server.scrape(self.headers.get("Accept"))
        except Exception as exc:  # the log down, the read model locked: this scrape fails, the next may not
            log.warning("metrics_scrape_failed", error=f"{type(exc).__name__}: {exc}")
            self._answer(503, b"503 the log or the read model could not be read\n", "text/plain")
            return
        self._answer(200, body, content_type)

    def _answer(self, code: int, body: bytes, content_type: str, headers: Mapping[str, str] = {}) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a scrape every few seconds is not news (refusals are logged above)."""


class MetricsServer(ThreadingHTTPServer):
    """Serves `scrape` (run on `loop`) to requests that carry `token`."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], token: str, scrape: Scrape, loop: asyncio.AbstractEventLoop):
        self.address_family = _family(address[0])
        super().__init__(address, _Handler)
        self._expected = f"Bearer {token}".encode()
        self._scrape, self._loop = scrape, loop

    def authorized(self, header: str) -> bool:
        return hmac.compare_digest(header.strip().encode(errors="replace"), self._expected)

    def scrape(self, accept: str | None) -> tuple[bytes, str]:
        future = asyncio.run_coroutine_threadsafe(self._scrape(accept), self._loop)
        try:
            return future.result(SCRAPE_TIMEOUT)
        except FutureTimeout:
            future.cancel()
            raise


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
