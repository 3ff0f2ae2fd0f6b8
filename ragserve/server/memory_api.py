"""``/v1/memory``: the persisted memory bank (``ragserve serve --memory DIR``) over HTTP, behind the API key
like every other endpoint.

    POST   /v1/memory            {"text": T[, "metadata": {...}]} or {"texts": [T, ...][, "metadata": [{...}, ...]]}
    GET    /v1/memory?query=Q&k=K   the top-k entries for Q
    GET    /v1/memory[?after=ID&limit=N]   entries oldest first
    GET    /v1/memory/<id>       one entry
    DELETE /v1/memory/<id>       forget it

An add answers once its record is fsynced (``MemoryStore``): a 200 is never lost.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask import Flask, Response, jsonify, request

from ragserve.server.config import ServerConfig
from ragserve.server.errors import ApiError, invalid
from ragserve.server.validation import _json_type, check_fields, parse_json_object, text_field

if TYPE_CHECKING:
    from ragserve.memory.store import MemoryStore

ADD_FIELDS = {"text", "texts", "metadata"}
SEARCH_ARGS, LIST_ARGS = {"query", "k"}, {"after", "limit"}
MAX_LIST = 1000


def _int_arg(name: str, lo: int, hi: int, default: int | None) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise invalid(name, f"{name} must be an integer, got {raw!r}") from None
    if not lo <= v <= hi:
        raise invalid(name, f"{name} must be between {lo} and {hi}, got {v}")
    return v


def _check_args(allowed: set[str]) -> None:
    unknown = sorted(set(request.args) - allowed)
    if unknown:
        raise invalid(unknown[0], f"unknown query parameter {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")


def _metadata(value: Any, name: str) -> dict:
    from ragserve.memory.store import MemoryStoreError, check_metadata

    try:
        return check_metadata(value, name)
    except MemoryStoreError as e:
        raise invalid(name, str(e)) from None


def add_request(body: dict, cfg: ServerConfig) -> tuple[list[str], list[dict]]:
    """(texts, metadata): one text of ``text``, or up to ``max_batch`` of ``texts``; each text is limited by
    the body size, not ``max_query_chars`` (a memory can be a paragraph)."""
    check_fields(body, ADD_FIELDS)
    if ("text" in body) == ("texts" in body):
        raise invalid("text", 'send exactly one of "text" (a string) or "texts" (a list of strings)')
    long_cfg = ServerConfig(max_query_chars=cfg.max_body_bytes)
    if "text" in body:
        return [text_field(body["text"], "text", long_cfg)], [_metadata(body.get("metadata"), "metadata")]
    texts = body["texts"]
    if not isinstance(texts, list) or not texts:
        raise invalid("texts", f"texts must be a non-empty list of strings, got "
                               f"{'an empty list' if isinstance(texts, list) else _json_type(texts)}")
    if len(texts) > cfg.max_batch:
        raise invalid("texts", f"batch too large: {len(texts)} texts (the limit is {cfg.max_batch})")
    out = [text_field(t, f"texts[{i}]", long_cfg) for i, t in enumerate(texts)]
    meta = body.get("metadata")
    if meta is None:
        return out, [{}] * len(out)
    if not isinstance(meta, list) or len(meta) != len(out):
        raise invalid("metadata", f"with texts, metadata must be a list of {len(out)} objects (one a text)")
    return out, [_metadata(m, f"metadata[{i}]") for i, m in enumerate(meta)]


def storage_error(e: OSError) -> ApiError:
    return ApiError(503, "storage_error", f"the memory bank could not be written: {e.strerror or e}")


def register_memory(app: Flask, memory: MemoryStore | None, cfg: ServerConfig) -> None:
    def store() -> MemoryStore:
        if memory is None:
            raise ApiError(503, "no_memory", "no memory bank is open: this server was started without --memory")
        return memory

    def entry_or_404(entry_id: int):
        e = store().get(entry_id)
        if e is None:
            raise ApiError(404, "not_found", f"no memory entry with id {entry_id}", field="id")
        return e

    @app.post("/v1/memory")
    def memory_add() -> Response:
        from ragserve.memory.store import MemoryStoreError

        texts, meta = add_request(parse_json_object(request.get_data(cache=False), request.headers.get("Content-Type")),
                                  cfg)
        try:
            ids, evicted = store().add_with_evictions(texts, meta)
        except MemoryStoreError as e:
            raise invalid("texts", str(e)) from None
        except OSError as e:  # nothing was added: the log's failed write is undone
            raise storage_error(e) from None
        return jsonify(ids=ids, evicted=evicted)

    @app.get("/v1/memory")
    def memory_get() -> Response:
        from ragserve.memory.store import MemoryStoreError

        s = store()
        if "query" in request.args:
            _check_args(SEARCH_ARGS)
            query = text_field(request.args["query"], "query", cfg)
            k = _int_arg("k", 1, cfg.max_k, 5)
            try:
                hits = s.search(query, k)
            except MemoryStoreError as e:
                raise invalid("k", str(e)) from None
            return jsonify(query=query, k=k, backend=s.backend,
                           hits=[dict(rank=r, **h.to_dict()) for r, h in enumerate(hits, 1)])
        _check_args(LIST_ARGS)
        after = _int_arg("after", -1, 2 ** 62, None)
        limit = _int_arg("limit", 1, MAX_LIST, 100)
        entries = s.list(after, limit)
        more = len(entries) == limit and bool(s.list(entries[-1].id, 1))
        return jsonify(entries=[e.to_dict() for e in entries], total=len(s),
                       next_after=entries[-1].id if more else None)

    @app.get("/v1/memory/<int:entry_id>")
    def memory_entry(entry_id: int) -> Response:
        return jsonify(entry_or_404(entry_id).to_dict())

    @app.delete("/v1/memory/<int:entry_id>")
    def memory_delete(entry_id: int) -> Response:
        entry_or_404(entry_id)
        try:
            deleted = store().delete([entry_id])
        except OSError as e:
            raise storage_error(e) from None
        if not deleted:  # deleted by another request meanwhile
            raise ApiError(404, "not_found", f"no memory entry with id {entry_id}", field="id")
        return jsonify(deleted=entry_id)
