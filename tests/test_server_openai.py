"""The OpenAI-compatible endpoints through the real ``openai`` client and raw HTTP against a real ``ragserve
serve --model`` process (the tiny random Llama of ``tests/rag_support.py``: gibberish text, but every step runs
and greedy decoding repeats it, so the OpenAI answer can be checked against ``/v1/answer``'s)."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import openai
import pytest
import requests

from ragserve.rag.methods import METHOD_NAMES
from tests import rag_support
from tests.serverproc import ServerProcess, wait_until

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
QUESTION = "Which magazine was started first, Arthur's Magazine or First for Women?"
SMALL = {"k": 2, "answer_max_tokens": 4}
MAX_NEW = 48


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    prompts = tmp_path_factory.mktemp("prompts") / "one.txt"
    prompts.write_text("Question: Who wrote Pride and Prejudice?\nAnswer: It was written by Jane Austen. "
                       "So the answer is Jane Austen.\n")
    srv = ServerProcess("--index", str(rag_support.hotpot_index()), "--backend", "cpu",
                        "--model", str(rag_support.tiny_lm()), "--reranker", str(rag_support.tiny_cross_encoder()),
                        "--device", "cpu", "--exemplars", str(prompts), "--max-new-tokens", str(MAX_NEW),
                        "--api-key", KEY, "--max-body-bytes", "65536")
    ok = wait_until(lambda: ready(srv.url), 120, 0.2)
    assert ok, srv.log()
    yield srv
    srv.terminate()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def ready(url: str) -> bool:
    try:  # a loaded machine may answer slowly while the model loads
        return requests.get(url + "/readyz", headers=AUTH, timeout=10).status_code == 200
    except requests.RequestException:
        return False


def native(server, method: str, max_new: int) -> dict:
    """The same question through ragserve's own /v1/answer."""
    r = requests.post(server.url + "/v1/answer", headers=AUTH, timeout=120,
                      json={"question": QUESTION, "method": method, "options": {**SMALL, "max_new_tokens": max_new}})
    assert r.status_code == 200, r.text
    return r.json()


def expected_text(answer: dict) -> str:
    asked = [s for s in answer["trace"] if s["kind"] == "answer"]
    return answer["output"] + (" So the answer is" + asked[-1]["text"] if asked else "")


def test_models_name_the_methods(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [f"ragserve/{m}" for m in METHOD_NAMES]
    assert client.models.retrieve("ragserve/dragin").owned_by == "ragserve"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("method", ["single", "none", "flare"])
def test_chat_answers_as_the_native_endpoint_does(server, client, method):
    want = native(server, method, 12)
    r = client.chat.completions.create(
        model=f"ragserve/{method}", max_tokens=12, temperature=0, top_p=0.9, seed=7, extra_body={"ragserve": {
            "options": SMALL}},
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}])
    assert r.object == "chat.completion" and r.model == f"ragserve/{method}" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected_text(want)
    assert choice.finish_reason in ("stop", "length")
    prompt_tokens = sum(s.get("prompt_tokens", 0) for s in want["trace"])
    assert r.usage.completion_tokens == want["tokens"] > 0 and r.usage.prompt_tokens == prompt_tokens > 0
    assert r.usage.total_tokens == prompt_tokens + want["tokens"]
    ext = r.model_extra["ragserve"]
    assert ext["method"] == method and ext["answer"] == want["answer"] and ext["earlier_messages"] == 1
    assert [(c["n"], c["id"], c["text"]) for c in ext["citations"]] == [
        (p["rank"], p["id"], p["text"]) for p in want["passages"]]
    assert len(ext["citations"]) == (0 if method == "none" else 2)
    assert len(ext["retrievals"]) == want["retrievals"]
    assert set(ext["timing"]) >= {"prepare", "relevancy", "retrieval", "apply", "total"}


def test_chat_streams_chunks_ending_in_done(server, client):
    whole = client.chat.completions.create(model="ragserve/single", max_completion_tokens=10,
                                           messages=[{"role": "user", "content": QUESTION}],
                                           extra_body={"ragserve": {"options": SMALL}})
    chunks = list(client.chat.completions.create(model="ragserve/single", max_completion_tokens=10, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": QUESTION}],
                                                 extra_body={"ragserve": {"options": SMALL}}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    progress = [c.model_extra["ragserve"]["step"]["kind"] for c in chunks if not c.choices and not c.usage]
    assert progress[:2] == ["retrieve", "generate"]  # one per trace step, while the answer is made
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert finals[0].model_extra["ragserve"]["citations"] == whole.model_extra["ragserve"]["citations"]
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()
    # On the wire: unnamed data events, the last one [DONE]; with include_usage every chunk has a usage field,
    # null except on the last one (OpenAI's stream_options), and include_obfuscation false is the default here.
    r = requests.post(server.url + "/v1/chat/completions", headers=AUTH, stream=True, timeout=120, json={
        "model": "ragserve/none", "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi?"}],
        "stream_options": {"include_usage": True, "include_obfuscation": False}})
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e and not e.startswith(":")]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    wire = [json.loads(e[6:]) for e in events[:-1]]
    assert [c["usage"] is None for c in wire] == [True] * (len(wire) - 1) + [False]
    assert wire[-1]["choices"] == [] and wire[-1]["usage"]["total_tokens"] > 0
    assert not any("obfuscation" in c for c in wire)
    plain = requests.post(server.url + "/v1/completions", headers=AUTH, timeout=120, json={
        "model": "ragserve/none", "stream": True, "max_tokens": 4, "prompt": "Hi?"}).text
    assert '"usage"' not in plain  # without include_usage, no usage field at all


def test_completions_sync_and_streaming(server, client):
    want = native(server, "single", 9)
    r = client.completions.create(model="ragserve/single", prompt=QUESTION, max_tokens=9,
                                  extra_body={"ragserve": {"options": SMALL}})
    assert r.object == "text_completion" and r.choices[0].text == expected_text(want)
    assert r.usage.completion_tokens == want["tokens"]
    assert r.model_extra["ragserve"]["citations"][0]["id"] == want["passages"][0]["id"]
    streamed = list(client.completions.create(model="ragserve/single", prompt=[QUESTION], max_tokens=9, stream=True,
                                              extra_body={"ragserve": {"options": SMALL}}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text
    assert streamed[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_stop_sequences_cut_the_text(client):
    kw = dict(model="ragserve/none", max_tokens=16, messages=[{"role": "user", "content": QUESTION}])
    full = client.chat.completions.create(**kw).choices[0].message.content
    assert len(full) > 6
    stop = full[4:6]
    cut = client.chat.completions.create(stop=[stop, "\u2603never"], **kw).choices[0]
    assert cut.message.content == full[:full.index(stop)] and cut.finish_reason == "stop"


def test_sampling_is_seeded(client):
    """temperature > 0 samples from the top_p nucleus; the same seed gives the same text, and the first token of a
    nucleus of one token is the greedy one."""
    kw = dict(model="ragserve/none", max_tokens=8, messages=[{"role": "user", "content": QUESTION}])
    greedy = client.chat.completions.create(**kw).choices[0].message.content
    a = client.chat.completions.create(temperature=1.5, seed=11, **kw).choices[0].message.content
    b = client.chat.completions.create(temperature=1.5, seed=11, **kw).choices[0].message.content
    assert a == b
    tiny_nucleus = client.chat.completions.create(temperature=1.5, top_p=1e-9, seed=3, **kw).choices[0].message
    assert tiny_nucleus.content == greedy


BAD = [  # (body changes or a whole body, the status, the OpenAI error param)
    ({"model": "gpt-4o"}, 404, "model"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "hi", "tool_call_id": "x"}]}, 400, "messages[0].role"),
    ({"n": 2}, 400, "n"),
    ({"max_tokens": -5}, 400, "max_tokens"),
    ({"max_completion_tokens": MAX_NEW + 1}, 400, "max_completion_tokens"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"temperature": 2.5}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"messages": "What is BM25?"}, 400, "messages"),
    ({"messages": None}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]}, 400,
     "messages[1].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "   "}]}, 400, "messages"),
    ({"logprobs": True}, 400, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}}, 400, "stream_options.include_obfuscation"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"frequency_penalty": 0.5}, 400, "frequency_penalty"),
    ({"moderation": {"model": "omni-moderation-latest"}}, 400, "moderation"),
    ({"top_k": 5}, 400, "top_k"),
    ({"ragserve": {"options": {"theta": 1.0}}}, 400, "ragserve.options.theta"),
    ({"ragserve": {"retriever": "dense"}}, 400, "ragserve.retriever"),
]


@pytest.mark.parametrize("change,status,param", BAD, ids=[p for _, _, p in BAD])
def test_bad_chat_requests_get_openai_errors(server, change, status, param):
    body = {"model": "ragserve/single", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}
    body = {k: v for k, v in {**body, **change}.items() if v is not None}
    r = requests.post(server.url + "/v1/chat/completions", headers=AUTH, json=body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param and err["message"]
    assert err["type"] == "invalid_request_error"


def test_transport_errors_are_openai_shaped(server, client):
    url = server.url + "/v1/chat/completions"
    body = {"model": "ragserve/single", "messages": [{"role": "user", "content": QUESTION}]}
    no_key = requests.post(url, json=body, timeout=30)
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    assert no_key.headers["WWW-Authenticate"].startswith("Bearer")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    big = requests.post(url, headers=AUTH, timeout=30, json={**body, "messages": [
        {"role": "user", "content": "x" * 70000}]})
    assert big.status_code == 413 and big.json()["error"]["param"] == "body"
    form = requests.post(url, headers=AUTH, data=json.dumps(body), timeout=30)
    assert form.status_code == 415 and form.json()["error"]["param"] == "Content-Type"
    get = requests.get(url, headers=AUTH, timeout=30)
    assert get.status_code == 405 and get.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="ragserve/single", n=2, messages=[{"role": "user", "content": "hi"}])
    assert e.value.param == "n" and e.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="ragserve/single", prompt=["one", "two"])
    assert e.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="ragserve/single", prompt="hi", echo=True)
    assert e.value.param == "echo"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="ragserve/single", input="hi")  # no sentence encoder on this server
    # ragserve's own endpoints keep their own error shape
    native_err = requests.post(server.url + "/v1/answer", headers=AUTH, json={"question": ""}, timeout=30).json()
    assert native_err["error"]["field"] == "question" and "status" in native_err["error"]


def test_embeddings_from_the_dense_encoder(wiki300_dense, minilm):
    import numpy as np

    srv = ServerProcess("--index", str(wiki300_dense), "--backend", "cpu", "--retriever", "dense")
    try:
        srv.wait_ready()
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        name = f"ragserve/{minilm.info.name}"
        assert [m.id for m in c.models.list().data] == [name]
        texts = ["theory of relativity", "Apollo 11 landed on the Moon"]
        r = c.embeddings.create(model=name, input=texts)
        got = np.array([d.embedding for d in r.data], dtype=np.float32)
        assert got.shape == (2, minilm.dim) and np.allclose(got, minilm.encode(texts), atol=1e-5)
        assert r.usage.prompt_tokens == sum(len(minilm.tokenizer(t)["input_ids"]) for t in texts)
        b64 = c.embeddings.create(model=name, input="theory of relativity", encoding_format="base64")
        one = np.frombuffer(base64.b64decode(b64.data[0].embedding), dtype="<f4")  # alone: other padding
        assert np.allclose(one, got[0], atol=1e-5)
        with pytest.raises(openai.BadRequestError) as e:
            c.embeddings.create(model=name, input="x", dimensions=12)
        assert e.value.param == "dimensions"
        with pytest.raises(openai.BadRequestError) as e:
            c.embeddings.create(model=name, input="word " * 600)
        assert e.value.param == "input[0]"
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="ragserve/single", messages=[{"role": "user", "content": "hi"}])
    finally:
        srv.terminate()


@pytest.mark.slow
def test_gemma_on_the_demo_corpus_through_the_openai_client(gemma_dir, tmp_path):
    """The real generator (google/gemma-3-270m) over the demo's Wikipedia sample: a right answer with its
    citations through the openai client, synchronous and streamed."""
    from tests.serverproc import run_cli

    index = tmp_path / "demo"
    dump = next((Path(__file__).resolve().parents[1] / "corpora" / "demo").glob("*.xml*.bz2"))
    built = run_cli("index", str(dump), "--format", "mediawiki", "--out", str(index), timeout=300)
    assert built.returncode == 0, built.stderr
    prompts = tmp_path / "one.txt"
    prompts.write_text("Question: Who wrote Pride and Prejudice?\nAnswer: Pride and Prejudice was written by "
                       "Jane Austen. So the answer is Jane Austen.\n")
    srv = ServerProcess("--index", str(index), "--model", str(gemma_dir), "--device", "cpu", "--api-key", KEY,
                        "--exemplars", str(prompts), "--request-timeout", "600")
    try:
        assert wait_until(lambda: ready(srv.url), 300, 0.5), srv.log()
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=600)
        question = [{"role": "user", "content": "Who was the commander of Apollo 11?"}]
        r = c.chat.completions.create(model="ragserve/single", max_tokens=24, messages=question)
        ext = r.model_extra["ragserve"]
        assert "Armstrong" in r.choices[0].message.content and "Armstrong" in ext["answer"]
        assert any(cite["title"] == "Apollo 11" for cite in ext["citations"]) and len(ext["citations"]) == 3
        assert r.usage.prompt_tokens > 100 and 0 < r.usage.completion_tokens <= 24 + 24
        chunks = list(c.chat.completions.create(model="ragserve/single", max_tokens=24, messages=question,
                                                stream=True, stream_options={"include_usage": True}))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
            r.choices[0].message.content  # greedy: the same answer
        assert chunks[-1].usage.model_dump() == r.usage.model_dump()
    finally:
        srv.terminate()
