"""``POST /v1/search`` answered at the WSGI layer, without flask's per-request machinery.

A flask request builds request and app contexts, matches the URL, runs the before/after hooks and signals and
builds a ``Response`` object: ~200 us of CPU on the dev VM (a ``GET /healthz`` costs 226 us through the app),
a quarter of a whole k = 10 search request, all of it under the GIL. Search is the endpoint that runs at
hundreds of requests a second, so it gets this direct path; it keeps flask's behaviour byte for byte where a
client can see it: the same auth check, body limit, JSON errors, compact JSON body and ``Cache-Control``. Every
other request, and other methods on ``/v1/search`` (405, OPTIONS), still go to flask.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Callable, Iterable

from werkzeug.http import HTTP_STATUS_CODES

from ragserve.server.auth import bearer_matches
from ragserve.server.config import ServerConfig
from ragserve.server.errors import ApiError, body_too_large, unauthorized
from ragserve.server.validation import parse_json_object
from ragserve.server.wsgi import ENDPOINT_KEY

PATH = "/v1/search"
log = logging.getLogger("ragserve.server")


class SearchRoute:
    """WSGI middleware: ``POST /v1/search`` goes to ``handle(request_object, deadline) -> response_object``
    (``ApiError`` for a client error), everything else to ``app``."""

    def __init__(self, app: Callable, handle: Callable[[dict, float], dict], config: ServerConfig) -> None:
        self.app = app
        self.handle = handle
        self.config = config

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        environ[ENDPOINT_KEY] = PATH
        cfg = self.config
        deadline = time.monotonic() + cfg.request_timeout_s
        try:
            if cfg.api_key and not bearer_matches(environ.get("HTTP_AUTHORIZATION"), cfg.api_key):
                raise unauthorized()
            status, payload, headers = 200, self.handle(parse_json_object(self._body(environ),
                                                                          environ.get("CONTENT_TYPE")), deadline), {}
        except ApiError as e:
            status, payload, headers = e.status, e.to_dict(), e.headers
        except Exception as e:  # as flask's handler of last resort does
            log.exception("unhandled error on POST %s", PATH)
            status, payload, headers = 500, ApiError(500, "internal_error",
                                                     f"internal server error: {type(e).__name__}").to_dict(), {}
        # flask's jsonify: compact, ASCII, keys in insertion order, a final newline
        body = (json.dumps(payload, separators=(",", ":")) + "\n").encode()
        start_response(f"{status} {HTTP_STATUS_CODES.get(status, 'UNKNOWN').upper()}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                        *headers.items(), ("Cache-Control", "no-store")])
        return [body]

    def _body(self, environ: dict) -> bytes:
        """The request body; 413 past the limit (waitress has buffered it whole, chunked ones too)."""
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > self.config.max_body_bytes:
            raise body_too_large(self.config)
        stream = environ["wsgi.input"]
        if length:
            return stream.read(length)
        if environ.get("wsgi.input_terminated"):
            data = stream.read(self.config.max_body_bytes + 1)
            if len(data) > self.config.max_body_bytes:
                raise body_too_large(self.config)
            return data
        return b""
