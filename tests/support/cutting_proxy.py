"""A TCP proxy in front of a real S3 endpoint that cuts chosen requests: the client's connection is dropped
before the store sees the request, as a store or network dropping connections does. Everything else passes
through untouched, both ways."""

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlparse


class CuttingProxy:
    """Listens on a free port of 127.0.0.1 and forwards to `upstream` (an http URL); while `cutting` is set,
    a request whose head matches `pattern` has its connection closed unanswered (each one counted in `cut`)."""

    def __init__(self, upstream: str, pattern: bytes) -> None:
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.pattern = re.compile(pattern, re.IGNORECASE)
        self.cutting = threading.Event()
        self.cut = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            store = socket.create_connection(self.upstream)
            with self._lock:
                self._open |= {client, store}
            threading.Thread(target=self._pump, args=(client, store, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(store, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if requests and self.cutting.is_set() and self.pattern.search(data):
                    with self._lock:
                        self.cut += 1
                    break
                sink.sendall(data)
        except OSError:
            pass
        for each in (source, sink):
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)
            each.close()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for each in self._open:
                with contextlib.suppress(OSError):
                    each.shutdown(socket.SHUT_RDWR)
                each.close()


@contextlib.contextmanager
def cutting_proxy(upstream: str, pattern: bytes) -> Iterator[CuttingProxy]:
    """A running `CuttingProxy`, closed on exit."""
    proxy = CuttingProxy(upstream, pattern)
    thread = threading.Thread(target=proxy.serve, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.close()
        thread.join(5)
