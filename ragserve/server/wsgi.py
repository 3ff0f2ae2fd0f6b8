"""WSGI plumbing: request metrics, and a callback when the server has finished sending a response."""
from __future__ import annotations

import time
from typing import Callable, Iterable

from ragserve.server.metrics import ServerMetrics

ENDPOINT_KEY = "ragserve.endpoint"  # the app leaves the matched URL rule here for RequestMetrics


class ClosingIterable:
    """Wraps a response body; ``on_close`` runs once the server closes it (after the last byte, for a stream).

    Wrapping also hides a file-wrapper body from waitress, which would otherwise send it itself and never
    close the app's iterable, so request bookkeeping would never finish."""

    def __init__(self, body: Iterable[bytes], on_close: Callable[[], None]) -> None:
        self._body = body
        self._on_close = on_close

    def __iter__(self):
        return iter(self._body)

    def close(self) -> None:
        try:
            if hasattr(self._body, "close"):
                self._body.close()
        finally:
            self._on_close()


class RequestMetrics:
    """Counts and times every request at the WSGI layer, until its body is closed (so a stream's latency
    runs to its last event, and static files, which bypass flask's close hooks, are counted too)."""

    def __init__(self, wsgi_app: Callable, metrics: ServerMetrics, worker: str | None = None) -> None:
        """``worker``: sent as ``X-Ragserve-Worker`` on every response (several workers share the port)."""
        self.wsgi_app = wsgi_app
        self.metrics = metrics
        self.worker_header = [("X-Ragserve-Worker", worker)] if worker else []

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        t0 = time.perf_counter()
        m = self.metrics
        m.in_flight.add(1)
        status = ["500"]

        def capture(s: str, headers: list, exc_info=None):
            status[0] = s.split(" ", 1)[0]
            headers += self.worker_header
            return start_response(s, headers, exc_info) if exc_info else start_response(s, headers)

        def record() -> None:
            m.in_flight.add(-1)
            endpoint = environ.get(ENDPOINT_KEY, "unmatched")
            m.requests.inc(endpoint=endpoint, method=environ.get("REQUEST_METHOD", ""), status=status[0])
            m.latency.observe(time.perf_counter() - t0, endpoint=endpoint)

        try:
            body = self.wsgi_app(environ, capture)
        except BaseException:
            record()
            raise
        return ClosingIterable(body, record)
