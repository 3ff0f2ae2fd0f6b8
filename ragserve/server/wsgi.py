"""WSGI plumbing: run a callback when the server has finished sending a response (or gave up on it)."""
from __future__ import annotations

from typing import Callable, Iterable


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
