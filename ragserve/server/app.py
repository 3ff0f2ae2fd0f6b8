"""The flask application: routes, auth, error mapping and request metrics."""
from __future__ import annotations

import html
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from flask import Flask, Response, g, jsonify, request, send_from_directory
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from ragserve import __version__
from ragserve.kernels.contract import SearchError
from ragserve.retrieval.factory import RetrieverSet
from ragserve.retrieval.searcher import Searcher
from ragserve.server import openai_api
from ragserve.server.auth import bearer_matches
from ragserve.server.config import ServerConfig
from ragserve.server.documents import LiveWrites
from ragserve.server.errors import ApiError, body_too_large, invalid, unauthorized
from ragserve.server.memory_api import register_memory
from ragserve.server.metrics import ServerMetrics
from ragserve.server.search_route import SearchRoute
from ragserve.server.search_service import SearchService
from ragserve.server.validation import DEFAULT_METHOD, answer_request, parse_json_object, search_request
from ragserve.server.warmup import Warmup, backend_status
from ragserve.server.workers import WorkerInfo
from ragserve.server.wsgi import ENDPOINT_KEY, RequestMetrics

if TYPE_CHECKING:  # the answer service imports torch; a search-only server never loads it
    from ragserve.memory.store import MemoryStore
    from ragserve.server.answering import AnswerService

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
OPEN_ENDPOINTS = {"healthz", "page", "static", "favicon"}  # no token: liveness, the page (it asks for the token)
log = logging.getLogger("ragserve.server")


def create_app(searcher: Searcher | RetrieverSet, config: ServerConfig, answers: AnswerService | None = None,
               metrics: ServerMetrics | None = None,
               search_slots: int = 1, warmup: Warmup | None = None, worker: WorkerInfo | None = None,
               memory: MemoryStore | None = None, writes: LiveWrites | None = None) -> Flask:
    """``answers`` is an ``AnswerService`` (``--model``) or None, in which case /v1/answer says so with 503.
    ``search_slots``: searches at once on a searcher without its own queue (the Ray ``DistributedSearcher``).
    ``warmup`` (started by the caller): /readyz is 503 until it is done, and searches wait for it (the warm-up
    search holds the backend meanwhile). ``searcher`` is a BM25 ``Searcher`` (local or sharded) or the
    ``RetrieverSet`` of ``--retriever`` (dense and hybrid too). ``worker``: this process among the ``--workers``
    (/readyz waits for all of them to warm up; responses name the worker that sent them). ``memory``: the persisted
    memory bank of /v1/memory (``--memory``); None: those endpoints say so with 503. ``writes``: the document
    endpoints of a live index (``ragserve serve --writes``); without it they answer 403."""
    if not isinstance(searcher, RetrieverSet):
        searcher = RetrieverSet(searcher)
    app = Flask("ragserve.server", static_folder=str(WEB_DIR), static_url_path="/static")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.sort_keys = False
    m = metrics or ServerMetrics()
    search = SearchService(searcher, m, slots=search_slots)
    worker = worker or WorkerInfo()
    m.info.set(1, version=__version__, backend=searcher.backend_name,
               model=answers.model_name if answers is not None else "", worker=str(worker.id))
    m.docs.set(searcher.index.num_docs)
    m.workers.set(worker.count)

    def error_response(e: ApiError) -> Response:
        """ragserve's error shape, or OpenAI's on the OpenAI-compatible endpoints (their clients parse it)."""
        return openai_api.error_response(e) if openai_api.is_openai_path(request.path) else e.response()

    # -- request bookkeeping ------------------------------------------------------------------
    @app.before_request
    def _start() -> Response | None:
        g.deadline = time.monotonic() + config.request_timeout_s
        request.environ[ENDPOINT_KEY] = request.url_rule.rule if request.url_rule is not None else "unmatched"
        if config.api_key and request.endpoint not in OPEN_ENDPOINTS:
            if not bearer_matches(request.headers.get("Authorization"), config.api_key):
                return error_response(unauthorized())
        return None

    @app.after_request
    def _finish(resp: Response) -> Response:
        resp.headers.setdefault("Cache-Control", "no-store")
        return resp

    # -- errors: always JSON, never a 500 for input ----------------------------------------------
    @app.errorhandler(ApiError)
    def _api_error(e: ApiError) -> Response:
        return error_response(e)

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(_e: RequestEntityTooLarge) -> Response:
        return error_response(body_too_large(config))

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException) -> Response:
        code = (e.name or "error").lower().replace(" ", "_")
        headers = {k: v for k, v in e.get_headers() if k.lower() == "allow"}  # 405 says what is allowed
        message = {404: f"no such endpoint: {request.path}",
                   405: f"{request.method} is not allowed on {request.path}; allowed: {headers.get('Allow', '')}",
                   }.get(e.code or 0, e.description or e.name)
        return error_response(ApiError(e.code or 500, code, message, headers=headers))

    @app.errorhandler(Exception)
    def _internal(e: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal_error", f"internal server error: {type(e).__name__}"))

    def body() -> dict:
        return parse_json_object(request.get_data(cache=False), request.headers.get("Content-Type"))

    # -- endpoints --------------------------------------------------------------------------------
    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(status="ok")

    @app.get("/readyz")
    def readyz() -> Response:
        model = answers.status() if answers is not None else {"state": "none"}
        warm = warmup.status() if warmup is not None else {"state": "done"}
        warm_workers = worker.warm_count(warm["state"] == "done")
        ready = model["state"] in ("none", "ready") and warm["state"] == "done" and warm_workers == worker.count
        resp = jsonify(ready=ready, index={"loaded": True, "documents": searcher.index.num_docs}, model=model,
                       warmup=warm, workers={**worker.describe(), "warm": warm_workers})
        resp.status_code = 200 if ready else 503
        return resp

    @app.get("/v1/info")
    def info() -> Response:
        return jsonify(
            version=__version__,
            index={"path": str(searcher.index.path), "manifest": searcher.manifest},
            backend={**searcher.backend.describe(), "name": searcher.backend_name,
                     **({"queue": searcher.queue.describe()} if getattr(searcher, "queue", None) else {})},
            backends=list(backend_status()),
            retrievers=searcher.describe(),
            model=answers.describe() if answers is not None else None,
            methods=answers.methods if answers is not None else [],
            limits={"max_query_chars": config.max_query_chars, "max_batch": config.max_batch, "max_k": config.max_k,
                    "max_body_bytes": config.max_body_bytes, "request_timeout_s": config.request_timeout_s},
            auth=config.api_key is not None,
            memory=memory.describe() if memory is not None else None,
            server=worker.describe(),
        )

    def search_result(data: dict, deadline: float) -> dict:
        """POST /v1/search, served by ``SearchRoute`` (flask keeps the rule: 405 for other methods)."""
        req = search_request(data, config)
        if warmup is not None and not warmup.done.wait(max(0.0, deadline - time.monotonic())):
            raise ApiError(504, "timeout", "the server was still warming up past the request timeout")
        try:
            chosen = searcher.get(req.retriever)
        except SearchError as e:
            raise invalid("retriever", str(e)) from None
        if getattr(chosen, "kind", "bm25") == "dense" and (req.k1 is not None or req.b is not None):
            raise invalid("k1" if req.k1 is not None else "b", "k1 and b are BM25 parameters; the dense retriever "
                                                                 "has none")
        t0 = time.perf_counter()
        missing: set[int] = set()
        hits, times = search.search(req, deadline, missing)
        timing = {**times.to_dict(), "total": time.perf_counter() - t0}
        del timing["apply"]
        results = [{"query": q, "hits": [dict(rank=i + 1, **h.to_dict()) for i, h in enumerate(hs)]}
                   for q, hs in zip(req.queries, hits)]
        common = {"k": req.k, "backend": searcher.backend_name, "retriever": req.retriever or searcher.default,
                  "timing": timing}
        if req.partial:  # the exact top-k of the other shards; empty when every shard answered
            common["missing_shards"] = sorted(missing)
        return {**results[0], **common} if not req.batch else {"results": results, **common}

    app.add_url_rule("/v1/search", endpoint="search", methods=["POST"])
    register_memory(app, memory, config)

    documents = writes or LiveWrites(None, 0.0)

    @app.post("/v1/documents")
    def add_documents() -> Response:
        return jsonify(documents.add(body()))

    @app.delete("/v1/documents")
    def delete_documents() -> Response:
        return jsonify(documents.delete(body()))

    @app.post("/v1/answer")
    def answer_endpoint() -> Response:
        data = body()
        if answers is None:
            from ragserve.rag.methods import METHOD_NAMES  # imports torch: only when someone asks

            answer_request(data, config, list(METHOD_NAMES), DEFAULT_METHOD)  # bad input is a 400 here too
            raise ApiError(503, "no_generator", "no generator is loaded: this server was started without --model, "
                                                "so only /v1/search is available")
        req = answer_request(data, config, answers.methods, answers.default_method)
        deadline = g.deadline if req.timeout_s is None else min(g.deadline, time.monotonic() + req.timeout_s)
        if req.stream:
            return Response(answers.stream(req, deadline), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        return jsonify(answers.answer(req, deadline))

    openai_api.register(app, answers, searcher, config, body)  # /v1/chat/completions, /v1/models, ...

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        if answers is not None:
            m.queue.set(answers.pending)
            if (b := answers.batching()) is not None:
                m.decode_steps.set(b["steps"])
                m.decode_advanced.set(b["generation_steps"])
        return Response(m.render(), content_type="text/plain; version=0.0.4; charset=utf-8")

    # The page arrives with its status line filled in (no "connecting..." while /v1/info is fetched), unless the
    # server needs a token, which the page is open to (it asks for the token).
    page_template = (WEB_DIR / "index.html").read_text(encoding="utf-8").replace("{{max_k}}", str(config.max_k))
    model_name = answers.model_name if answers is not None else "no generator loaded"
    status_line = f"{searcher.index.num_docs:,} passages · backend {searcher.backend_name} · model: {model_name}"

    @app.get("/")
    def page() -> Response:
        status = status_line if not config.api_key else "loading…"
        if not config.api_key and warmup is not None and not warmup.done.is_set():
            status += " · warming up…"
        return Response(page_template.replace("{{status}}", html.escape(status)), mimetype="text/html")

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return send_from_directory(WEB_DIR, "favicon.svg", mimetype="image/svg+xml")

    app.wsgi_app = RequestMetrics(SearchRoute(app.wsgi_app, search_result, config), m,
                                  worker=str(worker.id) if worker.count > 1 else None)
    return app
