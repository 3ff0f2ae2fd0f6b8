"""Turn a request body into a checked request object, or raise an ``ApiError`` that names the bad field."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragserve.server.config import ServerConfig
from ragserve.server.errors import ApiError, invalid

if TYPE_CHECKING:  # torch: a search-only server never loads it
    from ragserve.rag.decoding import Sampling


def _no_constants(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON does not, and a NaN k1 must never reach the scorer.
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(body: bytes, content_type: str | None) -> dict:
    """The body as a JSON object. Requiring application/json also makes browsers preflight cross-site posts."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime != "application/json":
        raise ApiError(415, "unsupported_media_type",
                       f"Content-Type must be application/json, got {content_type or 'none'!r}",
                       field="Content-Type")
    if not body.strip():
        raise invalid("body", "request body is empty; send a JSON object")
    try:
        value = json.loads(body, parse_constant=_no_constants)
    except UnicodeDecodeError:
        raise invalid("body", "request body is not valid UTF-8") from None
    except RecursionError:
        raise invalid("body", "request body is nested too deeply") from None
    except ValueError as e:
        raise invalid("body", f"request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise invalid("body", f"request body must be a JSON object, got {_json_type(value)}")
    return value


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def check_fields(obj: dict, allowed: set[str], where: str = "") -> None:
    """Reject unknown fields so a misspelt option (``top_k``) is an error, not silently ignored."""
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise invalid(where + unknown[0], f"unknown field {where + unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")


def text_field(value: Any, name: str, cfg: ServerConfig) -> str:
    if not isinstance(value, str):
        raise invalid(name, f"{name} must be a string, got {_json_type(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(name, f"{name} must be valid Unicode text (it holds a lone surrogate)") from None
    text = value.strip()
    if not text:
        raise invalid(name, f"{name} must not be empty")
    if len(text) > cfg.max_query_chars:
        raise invalid(name, f"{name} is too long ({len(text)} characters; the limit is {cfg.max_query_chars})")
    return text


def int_field(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"{name} must be an integer, got {_json_type(value)}")
    if not lo <= value <= hi:
        raise invalid(name, f"{name} must be between {lo} and {hi}, got {value}")
    return value


def float_field(value: Any, name: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(name, f"{name} must be a number, got {_json_type(value)}")
    v = float(value) if abs(value) < 1e308 else math.inf
    if not math.isfinite(v) or v > hi or v < lo or (lo_open and v == lo):
        rng = f"{'(' if lo_open else '['}{lo}, {hi}]"
        raise invalid(name, f"{name} must be a number in {rng}, got {value}")
    return v


def bool_field(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(name, f"{name} must be true or false, got {_json_type(value)}")
    return value


@dataclass(frozen=True)
class SearchRequest:
    queries: list[str]
    batch: bool  # the client sent "queries" (answer with a list) rather than "query"
    k: int = 10
    k1: float | None = None
    b: float | None = None
    partial: bool = False  # a sharded server may answer from the shards that are up, naming the others
    retriever: str | None = None  # bm25, dense or hybrid; None: the server's default


SEARCH_FIELDS = {"query", "queries", "k", "k1", "b", "partial", "retriever"}
RETRIEVERS = ("bm25", "dense", "hybrid")


def retriever_field(value: Any) -> str:
    if not isinstance(value, str) or value not in RETRIEVERS:
        shown = repr(value) if isinstance(value, str) else _json_type(value)
        raise invalid("retriever", f"retriever must be one of {', '.join(RETRIEVERS)}, got {shown}")
    return value
K1_MAX = 100.0  # far above any useful value; keeps the f32 arithmetic well inside its range


def search_request(body: dict, cfg: ServerConfig) -> SearchRequest:
    check_fields(body, SEARCH_FIELDS)
    if ("query" in body) == ("queries" in body):
        raise invalid("query", 'send exactly one of "query" (a string) or "queries" (a list of strings)')
    if "query" in body:
        queries, batch = [text_field(body["query"], "query", cfg)], False
    else:
        qs = body["queries"]
        if not isinstance(qs, list):
            raise invalid("queries", f"queries must be a list of strings, got {_json_type(qs)}")
        if not qs:
            raise invalid("queries", "queries must not be empty")
        if len(qs) > cfg.max_batch:
            raise invalid("queries", f"batch too large: {len(qs)} queries (the limit is {cfg.max_batch})")
        queries, batch = [text_field(q, f"queries[{i}]", cfg) for i, q in enumerate(qs)], True
    k = int_field(body.get("k", 10), "k", 1, cfg.max_k)
    k1 = float_field(body["k1"], "k1", 0.0, K1_MAX, lo_open=True) if "k1" in body else None
    b = float_field(body["b"], "b", 0.0, 1.0) if "b" in body else None
    partial = bool_field(body.get("partial", False), "partial")
    retriever = retriever_field(body["retriever"]) if "retriever" in body else None
    return SearchRequest(queries=queries, batch=batch, k=k, k1=k1, b=b, partial=partial, retriever=retriever)


@dataclass(frozen=True)
class AnswerRequest:
    question: str
    method: str
    stream: bool = False
    options: dict = field(default_factory=dict)
    timeout_s: float | None = None  # the client's own deadline, at most the server's request timeout
    attention: dict | None = None  # sparse attention for the decode steps: {"method": M, "budget": K}
    retriever: str | None = None  # the index retriever of the method; None: the server's default
    context: str | None = None  # a long input read into memory; the method then retrieves from it
    sampling: Sampling | None = None  # temperature, top_p, seed, stop strings (set by code; default greedy)


ANSWER_FIELDS = {"question", "method", "stream", "options", "timeout_s", "attention", "retriever", "context"}
ATTENTION_FIELDS = {"method", "budget"}


def attention_field(value: Any, cfg: ServerConfig) -> dict:
    """``{"method": M[, "budget": K]}``: a known sparse attention method and a budget within the server's limit."""
    from ragserve.attention.names import METHOD_NAMES

    if not isinstance(value, dict):
        raise invalid("attention", f"attention must be an object, got {_json_type(value)}")
    check_fields(value, ATTENTION_FIELDS, where="attention.")
    method = value.get("method")
    if not isinstance(method, str) or method not in METHOD_NAMES:
        raise invalid("attention.method", f"attention.method must be one of: {', '.join(METHOD_NAMES)}")
    out = {"method": method}
    if "budget" in value:
        out["budget"] = int_field(value["budget"], "attention.budget", 1, cfg.max_attention_budget)
    return out
DEFAULT_METHOD = "single"


def answer_request(body: dict, cfg: ServerConfig, methods: list[str], default_method: str) -> AnswerRequest:
    """Check the envelope; the method's own options are checked by the generator service."""
    check_fields(body, ANSWER_FIELDS)
    if "question" not in body:
        raise invalid("question", "question is required")
    question = text_field(body["question"], "question", cfg)
    method = body.get("method", default_method)
    if not isinstance(method, str):
        raise invalid("method", f"method must be a string, got {_json_type(method)}")
    if method not in methods:
        raise invalid("method", f"unknown method {method!r}; choose one of: {', '.join(methods)}")
    stream = bool_field(body.get("stream", False), "stream")
    options = body.get("options", {})
    if not isinstance(options, dict):
        raise invalid("options", f"options must be an object, got {_json_type(options)}")
    timeout = body.get("timeout_s")
    if timeout is not None:
        timeout = float_field(timeout, "timeout_s", 0.0, cfg.request_timeout_s, lo_open=True)
    attention = attention_field(body["attention"], cfg) if "attention" in body else None
    retriever = retriever_field(body["retriever"]) if "retriever" in body else None
    context = None
    if "context" in body:  # as long as the body allows (--max-body-bytes), not --max-query-chars
        if not isinstance(body["context"], str):
            raise invalid("context", f"context must be a string, got {_json_type(body['context'])}")
        if not body["context"].strip():
            raise invalid("context", "context must not be empty")
        if retriever is not None:
            raise invalid("context", "send either a context (read into memory) or a retriever (of the index)")
        context = body["context"]
    return AnswerRequest(question=question, method=method, stream=stream, options=options, timeout_s=timeout,
                         attention=attention, retriever=retriever, context=context)
