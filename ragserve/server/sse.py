"""Server-sent events framing (https://html.spec.whatwg.org/multipage/server-sent-events.html)."""
from __future__ import annotations

import json


def event(name: str, data: dict) -> bytes:
    """One event; ``data`` as compact JSON on a single line (JSON never needs a raw newline)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode("utf-8")


def data_only(data: dict | str) -> bytes:
    """An unnamed event, as OpenAI's streams send them: ``data: {json}`` (or a bare string such as ``[DONE]``)."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode("utf-8")


def parse(chunk: bytes) -> tuple[str, dict] | None:
    """The (name, data) of one chunk that ``event`` made; None for a keep-alive comment."""
    name, data = None, None
    for line in chunk.decode("utf-8").split("\n"):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
    return (name, data) if name is not None else None


KEEPALIVE = b": keep-alive\n\n"  # a comment line: clients ignore it, proxies see traffic
