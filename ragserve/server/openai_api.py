"""OpenAI-compatible endpoints: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` and
``/v1/embeddings``, so OpenAI clients (the ``openai`` package, LangChain, LlamaIndex, Open WebUI, evaluation
harnesses) can use ragserve as a model.

The model name picks the RAG method (``ragserve/single``, ``ragserve/dragin``, ...); the answer runs through
``AnswerService`` exactly as ``/v1/answer`` runs it. Fields follow the OpenAI API reference; a parameter ragserve
cannot honour is a 400 naming it (``error.param``) unless it is sent at the value that changes nothing. The
citations, retrieved passages and stage times travel in one extension field, ``ragserve``, which standard
clients ignore; a request may send its own ``ragserve`` object (method options, retriever).
"""
from __future__ import annotations

import base64
import dataclasses
import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
from flask import Blueprint, Flask, Response, g, jsonify, request

from ragserve import __version__
from ragserve.rag.text import join_text
from ragserve.retrieval.factory import RetrieverSet
from ragserve.server import sse
from ragserve.server.config import ServerConfig
from ragserve.server.errors import ApiError
from ragserve.server.validation import _json_type, answer_request, check_fields

if TYPE_CHECKING:
    from ragserve.server.answering import AnswerService

MODEL_PREFIX = "ragserve/"
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings")
ROLES = ("system", "developer", "user", "assistant")
MAX_STOP = 4  # OpenAI's limit on stop sequences
ANSWER_LEAD = "So the answer is"  # what the answer step continues (ragserve.rag.base)
FINGERPRINT = f"ragserve-{__version__}"

# Parameters ragserve accepts only at the value that changes nothing (absent, null or these); anything else is
# a 400 naming the parameter, never a silent ignore.
NEUTRAL: dict[str, tuple] = {
    "frequency_penalty": (0,), "presence_penalty": (0,), "logprobs": (False,), "top_logprobs": (0,),
    "logit_bias": ({},), "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "parallel_tool_calls": (True, False), "response_format": ({"type": "text"},), "modalities": (["text"],),
    "audio": (), "prediction": (), "reasoning_effort": (), "web_search_options": (), "service_tier": ("auto", "default"),
    "store": (False,), "metadata": ({},), "verbosity": (), "moderation": (), "prompt_cache_options": (),
    "prompt_cache_retention": (),
    # /v1/completions
    "echo": (False,), "best_of": (1,), "suffix": (),
}
# Identifiers that never change an answer (OpenAI uses them for monitoring and caching): any string.
IDENTIFIERS = ("user", "safety_identifier", "prompt_cache_key")
SAMPLING = ("temperature", "top_p", "seed", "stop", "n", "stream", "stream_options", "max_tokens", "model", "ragserve")
CHAT_FIELDS = {"messages", "max_completion_tokens", *SAMPLING, *IDENTIFIERS} | (set(NEUTRAL) - {"echo", "best_of",
                                                                                                  "suffix"})
COMPLETION_FIELDS = {"prompt", *SAMPLING, *IDENTIFIERS, "echo", "best_of", "suffix", "logprobs", "logit_bias",
                     "frequency_penalty", "presence_penalty"}
EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", *IDENTIFIERS}
EXTENSION_FIELDS = {"options", "retriever"}


# -- errors -----------------------------------------------------------------------------------------
def is_openai_path(path: str) -> bool:
    return path in PATHS or path.startswith("/v1/models/")


def error_response(e: ApiError) -> Response:
    """``e`` in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``, same status."""
    kind = ("authentication_error" if e.status == 401 else "rate_limit_error" if e.status == 429
            else "server_error" if e.status >= 500 else "invalid_request_error")
    resp = jsonify(error=_error_fields(e, kind))
    resp.status_code = e.status
    for k, v in e.headers.items():
        resp.headers[k] = v
    return resp


def _error_fields(e: ApiError, kind: str = "invalid_request_error") -> dict:
    return {"message": e.message, "type": kind, "param": e.field, "code": e.code}


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, code, message, field=param)


def unsupported(param: str, why: str) -> ApiError:
    return bad(param, f"Unsupported parameter: {param!r} {why}", code="unsupported_parameter")


def model_not_found(model: str, available: list[str]) -> ApiError:
    have = ", ".join(available) or "none (start the server with --model, or with a sentence encoder)"
    return ApiError(404, "model_not_found", f"The model {model!r} does not exist on this server; available: {have}",
                    field="model")


# -- request checks ------------------------------------------------------------------------------------
def _number(body: dict, name: str, lo: float, hi: float) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(name, f"{name} must be a number, got {_json_type(v)}", code="invalid_type")
    if not lo <= v <= hi:
        raise bad(name, f"{name} must be between {lo} and {hi}, got {v}")
    return float(v)


def _integer(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, f"{name} must be an integer, got {_json_type(v)}", code="invalid_type")
    if v < lo or (hi is not None and v > hi):
        raise bad(name, f"{name} must be between {lo} and {hi}, got {v}" if hi is not None
                  else f"{name} must be at least {lo}, got {v}")
    return v


def _same(value: Any, neutral: Any) -> bool:
    """Equal and of the same kind: ``false`` is not ``0`` (``logprobs: 0`` asks for something)."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return value == neutral


def _check_neutral(body: dict) -> None:
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] is not None and not any(_same(body[name], n) for n in neutral):
            allowed = " or ".join(["null", *(json.dumps(v) for v in neutral)])
            raise unsupported(name, f"is not supported by ragserve; send {allowed} or leave it out")
    for name in IDENTIFIERS:
        if body.get(name) is not None and not isinstance(body[name], str):
            raise bad(name, f"{name} must be a string, got {_json_type(body[name])}", code="invalid_type")


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", f"stop must be a string or a list of strings, got {_json_type(v)}", code="invalid_type")
    if len(stops) > MAX_STOP:
        raise bad("stop", f"stop holds at most {MAX_STOP} sequences, got {len(stops)}")
    if any(not s for s in stops):
        raise bad("stop", "stop sequences must not be empty")
    return stops


class Common:
    """What chat and text completions share: the model (a RAG method), the token budget, sampling, streaming."""

    def __init__(self, body: dict, answers: AnswerService | None, models: list[str], max_tokens_field: str) -> None:
        model = body.get("model")
        if model is None:
            raise bad("model", "you must provide a model parameter", code="missing_required_parameter")
        if not isinstance(model, str):
            raise bad("model", f"model must be a string, got {_json_type(model)}", code="invalid_type")
        method = model.removeprefix(MODEL_PREFIX)
        if answers is None or not model.startswith(MODEL_PREFIX) or method not in answers.methods:
            raise model_not_found(model, models)
        self.model, self.method = model, method
        _check_neutral(body)
        if _integer(body, "n", 1) not in (None, 1):
            raise unsupported("n", "above 1 is not supported: ragserve generates one choice (greedy decoding "
                                   "would repeat it)")
        # Temperature 0 (the default) decodes greedily: exact, and top_p and seed change nothing then. Above 0
        # the generator samples from the top_p nucleus with the seed's own random stream.
        temperature = _number(body, "temperature", 0, 2)
        top_p = _number(body, "top_p", 0, 1)
        if top_p == 0:
            raise bad("top_p", "top_p must be above 0")
        seed = _integer(body, "seed", -(2 ** 63), 2 ** 63 - 1)
        self.sampling = None
        if temperature:
            from ragserve.rag.decoding import Sampling  # torch: only a server with a generator gets here

            self.sampling = Sampling(temperature=temperature, top_p=1.0 if top_p is None else top_p, seed=seed)
        self.stop = _stop(body)
        self.stream = body.get("stream", False) is True
        if body.get("stream") not in (None, True, False):
            raise bad("stream", f"stream must be a boolean, got {_json_type(body['stream'])}", code="invalid_type")
        opts = body.get("stream_options")
        self.include_usage = False
        if opts is not None:
            if not self.stream:
                raise bad("stream_options", "stream_options is only allowed when stream is true")
            if not isinstance(opts, dict) or set(opts) - {"include_usage", "include_obfuscation"}:
                raise bad("stream_options", 'stream_options must be {"include_usage": true|false, '
                                            '"include_obfuscation": false}')
            for name in ("include_usage", "include_obfuscation"):
                if opts.get(name) not in (None, True, False):
                    raise bad(f"stream_options.{name}", f"stream_options.{name} must be a boolean, got "
                                                        f"{_json_type(opts[name])}", code="invalid_type")
            if opts.get("include_obfuscation") is True:  # ragserve sends no padding field
                raise unsupported("stream_options.include_obfuscation", "true is not supported: ragserve adds no "
                                                                        "obfuscation field; send false or leave it out")
            self.include_usage = opts.get("include_usage") is True
        tokens = {n: self._max_tokens(body, n, answers.max_new_tokens) for n in ("max_tokens", max_tokens_field)
                  if n in body}
        given = {n: v for n, v in tokens.items() if v is not None}
        if len(set(given.values())) > 1:
            raise bad(max_tokens_field, f"max_tokens and {max_tokens_field} disagree; send one of them")
        self.max_tokens_param = next(iter(given), max_tokens_field)
        ext = body.get("ragserve") or {}
        if not isinstance(ext, dict):
            raise bad("ragserve", f"ragserve must be an object, got {_json_type(ext)}", code="invalid_type")
        check_fields_openai(ext, EXTENSION_FIELDS, "ragserve.")
        options = ext.get("options", {})
        if not isinstance(options, dict):
            raise bad("ragserve.options", f"ragserve.options must be an object, got {_json_type(options)}",
                      code="invalid_type")
        self.options = dict(options)
        if given:
            if "max_new_tokens" in self.options:
                raise bad("ragserve.options.max_new_tokens", f"send either {self.max_tokens_param} or "
                                                             "ragserve.options.max_new_tokens")
            self.options["max_new_tokens"] = next(iter(given.values()))
        self.retriever = ext.get("retriever")

    @staticmethod
    def _max_tokens(body: dict, name: str, limit: int) -> int | None:
        try:
            return _integer(body, name, 1, limit)
        except ApiError as e:
            if e.code == "invalid_value":
                e.message += f" (this server's --max-new-tokens is {limit})"
            raise

    def answer_body(self, question: Any) -> dict:
        body = {"question": question, "method": self.method, "options": self.options}
        if self.retriever is not None:
            body["retriever"] = self.retriever
        return body


def check_fields_openai(obj: dict, allowed: set[str], where: str = "") -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise bad(where + unknown[0], f"Unrecognized request argument supplied: {where + unknown[0]}",
                  code="unknown_parameter")


def _content_text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (other parts, such as images, are a 400)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else _json_type(part)
                raise bad(f"{where}[{i}]", f"only text content parts are supported, got {kind!r}")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad(where, f"{where} must be a string or a list of text parts, got {_json_type(content)}",
              code="invalid_type")


def question_of(messages: Any) -> tuple[str, int]:
    """The question a RAG method answers: the last message, which must be the user's; and how many earlier
    messages there were (system prompts and earlier turns, which the method's few-shot prompt has no place for)."""
    if messages is None:
        raise bad("messages", "you must provide a messages parameter", code="missing_required_parameter")
    if not isinstance(messages, list):
        raise bad("messages", f"messages must be an array, got {_json_type(messages)}", code="invalid_type")
    if not messages:
        raise bad("messages", "messages must not be empty")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, f"{where} must be an object, got {_json_type(m)}", code="invalid_type")
        role = m.get("role")
        if role not in ROLES:  # tool and function messages too: ragserve offers no tools
            raise bad(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}, got "
                                       f"{repr(role) if isinstance(role, str) else _json_type(role)}")
        check_fields_openai(m, {"role", "content", "name"}, where + ".")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise bad(f"{where}.name", f"{where}.name must be a string", code="invalid_type")
        if "content" not in m:
            raise bad(f"{where}.content", f"{where}.content is required", code="missing_required_parameter")
        _content_text(m["content"], f"{where}.content")
    last = messages[-1]
    if last["role"] != "user":
        raise bad(f"messages[{len(messages) - 1}].role", "the last message must be the user's question (role "
                                                        f"'user'), got {last['role']!r}")
    return _content_text(last["content"], f"messages[{len(messages) - 1}].content"), len(messages) - 1


def prompt_of(prompt: Any) -> str:
    if prompt is None:
        raise bad("prompt", "you must provide a prompt parameter", code="missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        raise unsupported("prompt", "with several prompts is not supported: send one prompt per request")
    if not isinstance(prompt, str):
        raise bad("prompt", "prompt must be a string (token arrays are not supported), got "
                            f"{_json_type(prompt)}", code="invalid_type")
    return prompt


# -- the answer in OpenAI terms ------------------------------------------------------------------
def completion_text(result: dict) -> str:
    """What the model wrote: the method's answer text, and the answer step's continuation of "So the answer is"
    when the method had to ask for the answer."""
    asked = [s for s in result["trace"] if s["kind"] == "answer"]
    if asked:
        return join_text(result["output"], ANSWER_LEAD) + asked[-1]["text"]
    return result["output"]


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop sequence (greedy decoding is causal: stopping early gives the same prefix)."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[:min(cuts)], True) if cuts else (text, False)


def finish_reason(result: dict, stopped: bool) -> str:
    last = next((s for s in reversed(result["trace"]) if s["kind"] in ("generate", "answer")), None)
    return "length" if not stopped and last is not None and last["stop"] == "length" else "stop"


def usage(result: dict) -> dict:
    """Every prompt token prefilled and every token decoded, over all the method's generation steps."""
    prompt = sum(s.get("prompt_tokens", 0) for s in result["trace"])
    return {"prompt_tokens": prompt, "completion_tokens": result["tokens"], "total_tokens": prompt + result["tokens"]}


def extension(result: dict, earlier_messages: int | None = None) -> dict:
    """The ``ragserve`` field: the passages the answer was generated from (numbered as in the prompt), every
    retrieval, the extracted short answer and the per-stage times."""
    ext = {
        "method": result["method"], "question": result["question"], "answer": result["answer"],
        "citations": [{"n": p["rank"], "id": p["id"], "title": p["title"], "score": p["score"], "text": p["text"]}
                      for p in result["passages"]],
        "retrievals": [{"query": s["query"], "hits": s["hits"]} for s in result["trace"] if s["kind"] == "retrieve"],
        "timing": result["timing"],
    }
    if earlier_messages is not None:
        ext["earlier_messages"] = earlier_messages  # not part of the method's prompt
    return ext


# -- endpoints --------------------------------------------------------------------------------------
def register(app: Flask, answers: AnswerService | None, searcher: RetrieverSet, config: ServerConfig,
             body: Callable[[], dict]) -> None:
    """Add the OpenAI routes; ``body()`` reads the request's JSON object (ragserve's content-type and size rules)."""
    bp = Blueprint("openai", __name__)
    started = int(time.time())

    def encoder():
        dense = searcher.retrievers.get("dense")
        if dense is not None:
            return dense.embedder
        return getattr(answers, "memory_embedder", None) if answers is not None else None

    def embedding_model() -> str | None:
        enc = encoder()
        return MODEL_PREFIX + enc.info.name if enc is not None else None

    def model_ids() -> list[str]:
        ids = [MODEL_PREFIX + m for m in answers.methods] if answers is not None else []
        emb = embedding_model()
        return ids + ([emb] if emb else [])

    def model_object(mid: str) -> dict:
        return {"id": mid, "object": "model", "created": started, "owned_by": "ragserve"}

    @bp.get("/v1/models")
    def models() -> Response:
        return jsonify(object="list", data=[model_object(m) for m in model_ids()])

    @bp.get("/v1/models/<path:model>")
    def model(model: str) -> Response:
        if model not in model_ids():
            raise model_not_found(model, model_ids())
        return jsonify(model_object(model))

    def run(common: Common, question: str, earlier: int | None, shape: Callable[[dict, str, str], dict],
            chunk: Callable[[str | None, str | None], dict], chunk_head: dict) -> Response:
        """Answer ``question`` with the method; ``shape(result, text, finish)`` is the whole response,
        ``chunk(text, finish)`` one stream chunk and ``chunk_head`` the fields every chunk starts with."""
        try:
            req = answer_request(common.answer_body(question), config, answers.methods, answers.default_method)
        except ApiError as e:
            raise _renamed(e, "messages" if earlier is not None else "prompt", common.max_tokens_param) from None
        if common.sampling is not None:
            req = dataclasses.replace(req, sampling=common.sampling)
        deadline = g.deadline
        if not common.stream:
            try:
                result = answers.answer(req, deadline)
            except ApiError as e:
                raise _renamed(e, "messages", common.max_tokens_param) from None
            text, stopped = cut_at_stop(completion_text(result), common.stop)
            return jsonify({**shape(result, text, finish_reason(result, stopped)),
                            "usage": usage(result), "ragserve": extension(result, earlier)})
        try:
            events = answers.stream(req, deadline)
        except ApiError as e:
            raise _renamed(e, "messages", common.max_tokens_param) from None
        return Response(_stream(events, common, earlier, chunk, chunk_head), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    def envelope(obj: str, model: str) -> dict:
        prefix = "chatcmpl-" if obj.startswith("chat") else "cmpl-"
        return {"id": prefix + uuid.uuid4().hex, "object": obj, "created": int(time.time()), "model": model,
                "system_fingerprint": FINGERPRINT}

    @bp.post("/v1/chat/completions")
    def chat() -> Response:
        data = body()
        check_fields_openai(data, CHAT_FIELDS)
        common = Common(data, answers, model_ids(), "max_completion_tokens")
        question, earlier = question_of(data.get("messages"))
        head = envelope("chat.completion", common.model)

        def shape(result: dict, text: str, finish: str) -> dict:
            return {**head, "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                                                 "refusal": None},
                                         "logprobs": None, "finish_reason": finish}]}

        chunk_head = {**head, "object": "chat.completion.chunk"}

        def chunk(text: str | None, finish: str | None) -> dict:
            delta = {} if text is None else {"content": text}
            if text == "" and finish is None:
                delta = {"role": "assistant", "content": ""}
            return {**chunk_head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                               "finish_reason": finish}]}

        return run(common, question, earlier, shape, chunk, chunk_head)

    @bp.post("/v1/completions")
    def completions() -> Response:
        data = body()
        check_fields_openai(data, COMPLETION_FIELDS)
        common = Common(data, answers, model_ids(), "max_tokens")
        prompt = prompt_of(data.get("prompt"))
        head = envelope("text_completion", common.model)

        def shape(result: dict, text: str, finish: str) -> dict:
            return {**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

        def chunk(text: str | None, finish: str | None) -> dict:
            return {**head, "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}

        return run(common, prompt, None, shape, chunk, head)

    @bp.post("/v1/embeddings")
    def embeddings() -> Response:
        data = body()
        check_fields_openai(data, EMBEDDING_FIELDS)
        model = data.get("model")
        if model is None:
            raise bad("model", "you must provide a model parameter", code="missing_required_parameter")
        enc = encoder()
        if model != embedding_model():
            raise model_not_found(str(model), [m for m in [embedding_model()] if m])
        _check_neutral(data)
        texts = data.get("input")
        if texts is None:
            raise bad("input", "you must provide an input parameter", code="missing_required_parameter")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise bad("input", "input must be a string or a non-empty array of strings (token arrays are not "
                               f"supported), got {_json_type(data['input'])}", code="invalid_type")
        if len(texts) > config.max_batch:
            raise bad("input", f"input holds {len(texts)} texts; the limit is {config.max_batch}")
        fmt = data.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise bad("encoding_format", f"encoding_format must be 'float' or 'base64', got {fmt!r}")
        dims = _integer(data, "dimensions", 1)
        if dims not in (None, enc.dim):
            raise unsupported("dimensions", f"other than the encoder's own ({enc.dim}) is not supported")
        counts = [len(enc.tokenizer(t)["input_ids"]) for t in texts]
        for i, (t, n) in enumerate(zip(texts, counts)):
            if not t:
                raise bad(f"input[{i}]", "input texts must not be empty")
            if n > enc.max_seq_length:  # the encoder would cut it: refuse rather than embed part of it silently
                raise bad(f"input[{i}]", f"input[{i}] is {n} tokens long; this encoder reads at most "
                                         f"{enc.max_seq_length}")
        vectors = enc.encode(texts)
        out = [{"object": "embedding", "index": i,
                "embedding": v.tolist() if fmt == "float" else base64.b64encode(
                    np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii")}
               for i, v in enumerate(vectors)]
        return jsonify(object="list", data=out, model=model,
                       usage={"prompt_tokens": sum(counts), "total_tokens": sum(counts)})

    app.register_blueprint(bp)


def _renamed(e: ApiError, question_param: str, max_tokens_param: str) -> ApiError:
    """An error of ``/v1/answer``'s checks, with the field named as the OpenAI request names it."""
    f = e.field
    if f is not None:
        f = {"question": question_param, "method": "model", "options.max_new_tokens": max_tokens_param,
             "retriever": "ragserve.retriever"}.get(f, "ragserve." + f if f.startswith("options") else f)
    return ApiError(e.status, e.code, e.message, field=f, headers=e.headers)


def _stream(events: Iterator[bytes], common: Common, earlier: int | None,
            chunk: Callable[[str | None, str | None], dict], head: dict) -> Iterator[bytes]:
    """``AnswerService.stream``'s events as OpenAI chunks: the role first, a progress chunk per trace step (no
    choices; its ``ragserve.step`` says what ran), the text once the method is done (a RAG method may revise what
    it wrote, e.g. FLARE, so none is sent earlier), the finish reason with the ``ragserve`` extension, the usage
    when ``stream_options.include_usage`` asks (every other chunk then has ``usage: null``, as OpenAI's do), then
    ``data: [DONE]``."""
    def out(obj: dict) -> bytes:
        return sse.data_only({**obj, "usage": None} if common.include_usage else obj)

    try:
        yield out(chunk("", None))
        for raw in events:
            parsed = sse.parse(raw)
            if parsed is None:
                yield raw  # keep-alive comment
                continue
            name, data = parsed
            if name == "step":
                yield out({**head, "choices": [], "ragserve": {"step": data}})
            elif name == "error":
                err = ApiError(data["error"]["status"], data["error"]["code"], data["error"]["message"],
                               field=data["error"].get("field"))
                kind = "server_error" if err.status >= 500 else "invalid_request_error"
                yield sse.data_only({"error": _error_fields(_renamed(err, "messages", common.max_tokens_param),
                                                            kind)})
                yield sse.data_only("[DONE]")
                return
            elif name == "answer":
                text, stopped = cut_at_stop(completion_text(data), common.stop)
                if text:
                    yield out(chunk(text, None))
                yield out({**chunk(None, finish_reason(data, stopped)), "ragserve": extension(data, earlier)})
                if common.include_usage:
                    yield sse.data_only({**head, "choices": [], "usage": usage(data)})
                yield sse.data_only("[DONE]")
                return
    finally:
        events.close()  # the client went away or the answer is done: the answer service stops generating
