"""``/v1/answer`` through a real ``ragserve serve --model`` process: every method, streaming, option checks,
serialised generation, queue limits, timeouts and a SIGTERM while an answer is being generated.

The model is the tiny random Llama of ``tests/rag_support.py``: its answers are gibberish, but every step
(retrieval, generation, triggers, the reranker) runs for real and greedy decoding makes them repeatable."""
from __future__ import annotations

import json
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from ragserve.rag.methods import METHOD_NAMES, build_method
from ragserve.rag.prompts import PromptBuilder, load_exemplars
from ragserve.retrieval.searcher import Searcher
from tests import rag_support
from tests.serverproc import run_load_test, start_model_server, wait_until

MAX_NEW = 48
PENDING = 3
QUESTIONS = ["Which magazine was started first, Arthur's Magazine or First for Women?",
             "Were Scott Derrickson and Ed Wood of the same nationality?",
             "What government position was held by the woman who portrayed Corliss Archer in Kiss and Tell?"]
SMALL = {"k": 2, "max_new_tokens": 8, "answer_max_tokens": 4}
LONG = {"k": 2, "max_new_tokens": 24, "answer_max_tokens": 8}


@pytest.fixture(scope="module")
def server(exemplars):
    srv = start_model_server("--max-new-tokens", str(MAX_NEW), "--max-pending-answers", str(PENDING),
                             "--exemplars", str(exemplars))
    yield srv
    if srv.proc.poll() is None:
        srv.terminate()


def ask(server, timeout=120, **body):
    return requests.post(server.url + "/v1/answer", json=body, timeout=timeout)


def read_events(resp):
    """(name, data, arrival time) of each server-sent event, read as the bytes arrive."""
    buf, out = b"", []
    for chunk in resp.iter_content(chunk_size=None):
        buf += chunk
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            lines = block.decode().split("\n")
            if all(l.startswith(":") for l in lines):
                continue  # keep-alive comment
            name = next(l[7:] for l in lines if l.startswith("event: "))
            data = json.loads("".join(l[6:] for l in lines if l.startswith("data: ")))
            out.append((name, data, time.monotonic()))
    return out


def test_ready_and_info(server):
    ready = requests.get(server.url + "/readyz", timeout=10).json()
    assert ready["ready"] is True and ready["model"]["state"] == "ready"
    info = requests.get(server.url + "/v1/info", timeout=10).json()
    assert info["methods"] == list(METHOD_NAMES)
    assert info["model"]["name"] == str(rag_support.tiny_lm()) and info["model"]["device"] == "cpu"
    assert info["model"]["options"]["flare"]["theta"] == "float"
    assert info["model"]["options"]["single"]["k"] == "int"


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_method_answers(server, method):
    r = ask(server, question=QUESTIONS[0], method=method, options=SMALL)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == method and body["question"] == QUESTIONS[0] and isinstance(body["answer"], str)
    steps = body["trace"]
    assert steps and {s["kind"] for s in steps} <= {"retrieve", "generate", "answer"}
    retrieves = [s for s in steps if s["kind"] == "retrieve"]
    assert body["retrievals"] == len(retrieves)
    assert body["tokens"] == sum(s.get("tokens", 0) for s in steps)
    if method == "none":
        assert not retrieves and body["passages"] == []
    else:
        assert retrieves and 1 <= len(body["passages"]) <= SMALL["k"]
        assert [p["id"] for p in body["passages"]] == [h["id"] for h in retrieves[-1]["hits"]]
        assert all(p["text"] for p in body["passages"])
    t = body["timing"]
    assert set(t) == {"queue", "prepare", "relevancy", "retrieval", "apply", "total"}
    assert t["total"] >= t["apply"] > 0


def test_answer_equals_the_in_process_method(server, exemplars):
    """The server runs the library's method faithfully: same answer, same steps, same passages."""
    searcher = Searcher(rag_support.hotpot_index(), backend="cpu")
    try:
        prompts = PromptBuilder(load_exemplars(exemplars))
        method = build_method("flare", rag_support.generator(), prompts, searcher, **SMALL)
        answer, trace = method.answer(QUESTIONS[1])
    finally:
        searcher.close()
    body = ask(server, question=QUESTIONS[1], method="flare", options=SMALL).json()
    assert body["answer"] == answer and body["output"] == trace.output

    def strip_times(steps):
        return [{k: v for k, v in s.items() if k != "times"} for s in steps]

    assert strip_times(body["trace"]) == strip_times([s.to_dict() for s in trace.steps])


def test_stream_sends_steps_as_they_happen(server):
    body = {"question": QUESTIONS[2], "method": "single", "stream": True,
            "options": LONG}
    with requests.post(server.url + "/v1/answer", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = read_events(r)
    names = [e[0] for e in events]
    assert names[:2] == ["queued", "started"] and names[-1] == "answer"
    steps = [e for e in events if e[0] == "step"]
    final = events[-1][1]
    assert [s[1]["index"] for s in steps] == list(range(len(final["trace"])))
    assert [{k: v for k, v in s[1].items() if k != "index"} for s in steps] == final["trace"]
    # The retrieval step reached the client while the model was still generating the later steps.
    generating = sum(s["times"]["apply"] for s in final["trace"][1:])
    assert events[-1][2] - steps[0][2] >= 0.5 * generating > 0
    # the same answer as without streaming
    plain = ask(server, question=QUESTIONS[2], method="single", options=body["options"]).json()
    assert plain["answer"] == final["answer"] and plain["trace"][0]["hits"] == final["trace"][0]["hits"]


@pytest.mark.parametrize("method,options,field", [
    ("single", {"temperature": 1}, "options.temperature"),
    ("single", {"theta": 0.5}, "options.theta"),  # a flare option
    ("single", {"k": 0}, "options.k"),
    ("single", {"k": "2"}, "options.k"),
    ("single", {"max_new_tokens": MAX_NEW + 1}, "options.max_new_tokens"),
    ("flare", {"theta": "high"}, "options.theta"),
    ("flare", {"theta": 2.0}, "options"),  # the method's own range check
    ("fixed-length", {"interval": 1.5}, "options.interval"),
    ("dragin", {"keep": 0}, "options.keep"),
])
def test_bad_options(server, method, options, field):
    r = ask(server, question="why?", method=method, options=options)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == field


def test_bad_timeout(server):
    for bad in (0, -1, "5", 10 ** 6):
        r = ask(server, question="why?", timeout_s=bad)
        assert r.status_code == 400 and r.json()["error"]["field"] == "timeout_s"


def test_concurrent_answers_do_not_interfere(server):
    expected = [ask(server, question=q, method="single", options=SMALL).json()["answer"] for q in QUESTIONS]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        got = list(pool.map(lambda q: ask(server, question=q, method="single", options=SMALL), QUESTIONS))
    assert [r.status_code for r in got] == [200] * len(QUESTIONS)
    assert [r.json()["answer"] for r in got] == expected


def test_full_queue_is_503(server):
    with ThreadPoolExecutor(8) as pool:
        rs = list(pool.map(lambda i: ask(server, question=QUESTIONS[i % 3], method="single", options=LONG), range(8)))
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 503} and codes.count(503) >= 1 and codes.count(200) >= PENDING, codes
    busy = next(r for r in rs if r.status_code == 503)
    assert busy.headers["Retry-After"] and busy.json()["error"]["code"] == "busy"


def test_timeouts_are_504_and_free_the_generator(server):
    body = {"question": QUESTIONS[0], "method": "single", "stream": True, "options": LONG}
    with requests.post(server.url + "/v1/answer", json=body, stream=True, timeout=60) as blocker:
        chunks = blocker.iter_content(chunk_size=None)
        seen = b""
        while b"event: started" not in seen:
            seen += next(chunks)
        # The generator is busy: a request that may wait 1 ms times out in the queue.
        r = ask(server, question=QUESTIONS[1], timeout_s=0.001, options=LONG)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
        with requests.post(server.url + "/v1/answer", json={**body, "timeout_s": 0.001}, stream=True,
                           timeout=60) as r2:
            events = read_events(r2)
        assert events[-1][0] == "error" and events[-1][1]["error"]["status"] == 504
        seen += b"".join(chunks)
        assert b"event: answer" in seen
    assert ask(server, question=QUESTIONS[2], options=SMALL).status_code == 200


def test_an_abandoned_answer_stops_at_the_next_step(exemplars):
    """StepWatch on a real method: once the request gives up, no further step runs."""
    import threading

    from ragserve.server.answering import Abandoned, StepWatch

    searcher = Searcher(rag_support.hotpot_index(), backend="cpu")
    try:
        method = build_method("fixed-sentence", rag_support.generator(), PromptBuilder(load_exemplars(exemplars)),
                              searcher, **LONG)
        cancel, seen = threading.Event(), []

        def on_step(i, step):
            seen.append(step.kind)
            cancel.set()  # the client went away after the first step

        StepWatch(method, on_step, cancel)
        with pytest.raises(Abandoned):
            method.answer(QUESTIONS[0])
        assert seen == ["retrieve"]  # the generation step that would follow never ran
    finally:
        searcher.close()


def test_metrics_cover_generation(server):
    text = requests.get(server.url + "/metrics", timeout=10).text
    assert 'ragserve_generation_seconds_count{method="single"}' in text
    assert 'ragserve_answer_stage_seconds_total{method="flare",stage="apply"}' in text
    assert 'ragserve_http_requests_total{endpoint="/v1/answer",method="POST",status="503"}' in text
    steps = float(re.search(r"^ragserve_decode_engine_steps (\S+)", text, re.M).group(1))
    advanced = float(re.search(r"^ragserve_decode_generation_steps (\S+)", text, re.M).group(1))
    assert advanced > steps > 0  # concurrent answers shared decode steps
    assert wait_until(lambda: "ragserve_generation_queue_depth 0.0" in
                      requests.get(server.url + "/metrics", timeout=10).text, 30)


def test_short_answer_load_has_no_errors(server, tmp_path):
    questions = tmp_path / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    s = run_load_test("--url", server.url, "--endpoint", "answer", "--queries", str(questions), "--clients",
                      str(PENDING - 1), "--duration", "3", "--options", json.dumps(SMALL))
    assert s["exit"] == 0 and s["errors"] == 0 and s["requests"] >= PENDING - 1, s


def test_sigterm_lets_a_running_answer_finish(server):
    """Last in this module: the server is gone afterwards."""
    body = {"question": QUESTIONS[0], "method": "single", "stream": True, "options": LONG}
    with requests.post(server.url + "/v1/answer", json=body, stream=True, timeout=120) as r:
        buf, sent = b"", False
        events = []
        for chunk in r.iter_content(chunk_size=None):
            buf += chunk
            if not sent and b"event: step" in buf:  # generation is under way
                server.proc.send_signal(signal.SIGTERM)
                sent = True
        for block in buf.decode().split("\n\n"):
            if block.startswith("event: "):
                events.append(block.split("\n")[0][7:])
    assert sent and events[-1] == "answer", events
    assert server.wait_exit(30) == 0, server.log()
