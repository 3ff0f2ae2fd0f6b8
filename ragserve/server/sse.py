"""Server-sent events framing (https://html.spec.whatwg.org/multipage/server-sent-events.html)."""
from __future__ import annotations

import json


def event(name: str, data: dict) -> bytes:
    """One event; ``data`` as compact JSON on a single line (JSON never needs a raw newline)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode("utf-8")


KEEPALIVE = b": keep-alive\n\n"  # a comment line: clients ignore it, proxies see traffic
