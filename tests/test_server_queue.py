"""A device backend shared by ``/v1/search`` and ``/v1/answer`` through one queue, in a real server process.

The backend is ``fpga-sim`` (not thread-safe: the C simulation keeps the kernel's accumulator in static
memory) and the generator the tiny random Llama of ``tests/rag_support.py``. Sixteen client threads send
search batches (mixed k, k1 and b) and answers at once; every search result, and every answer with the
passages it retrieved, must be identical to the same request sent alone."""
from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests import rag_support
from tests.serverproc import ServerProcess

CLIENTS = 16
ANSWER = {"k": 2, "max_new_tokens": 8, "answer_max_tokens": 4}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    exemplars = tmp_path_factory.mktemp("prompts") / "one.txt"
    exemplars.write_text("Question: Who wrote Pride and Prejudice?\nAnswer: It was written by Jane Austen. "
                         "So the answer is Jane Austen.\n")
    srv = ServerProcess("--index", str(rag_support.hotpot_index()), "--backend", "fpga-sim",
                        "--model", str(rag_support.tiny_lm()), "--device", "cpu", "--exemplars", str(exemplars),
                        "--threads", str(CLIENTS + 8), "--max-pending-answers", str(CLIENTS),
                        "--max-new-tokens", "16", "--queue-wait-ms", "5")
    srv.wait_ready()
    yield srv
    assert srv.terminate() == 0, srv.log()


def requests_mix() -> list[tuple[str, dict]]:
    """48 search batches of 1-4 questions (k 3/5/10, some with their own k1 and b) and 6 answers."""
    questions = [e.question for e in rag_support.hotpot_examples()[:120]]
    out = []
    for i in range(48):
        body = {"queries": questions[2 * i:2 * i + 1 + i % 4], "k": (3, 5, 10)[i % 3]}
        if i % 5 == 0:
            body.update(k1=1.2, b=0.75)
        out.append(("search", body))
    for i in range(6):
        out.insert(9 * i + 3, ("answer", {"question": questions[100 + i], "method": ("single", "flare")[i % 2],
                                          "options": ANSWER}))
    return out


def send(server, kind: str, body: dict):
    r = requests.post(f"{server.url}/v1/{kind}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    if kind == "search":
        return [[(h["id"], h["docid"], h["score"]) for h in res["hits"]] for res in data["results"]]
    retrieved = [[h["id"] for h in s["hits"]] for s in data["trace"] if s["kind"] == "retrieve"]
    return data["answer"], retrieved, [p["id"] for p in data["passages"]]


def launch_counts(server) -> dict[str, float]:
    """``ragserve_search_launch_requests``: its cumulative buckets, _count (launches) and _sum (requests)."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    out = {m.group(1): float(m.group(2)) for m in
           re.finditer(r'ragserve_search_launch_requests_bucket\{le="([^"]+)"\} (\S+)', text)}
    for part in ("count", "sum"):
        out[part] = float(re.search(rf"ragserve_search_launch_requests_{part} (\S+)", text).group(1))
    return out


def test_concurrent_searches_and_answers_equal_sequential(server):
    mix = requests_mix()
    alone = [send(server, kind, body) for kind, body in mix]
    assert all(res for (kind, _), res in zip(mix, alone) if kind == "search")
    before = launch_counts(server)
    start = threading.Barrier(CLIENTS)

    def client(c: int) -> list:
        start.wait(60)
        return [(i, send(server, *mix[i])) for i in range(c, len(mix), CLIENTS)]

    with ThreadPoolExecutor(CLIENTS) as pool:
        together = dict(p for got in pool.map(client, range(CLIENTS)) for p in got)
    for i, (kind, body) in enumerate(mix):
        assert together[i] == alone[i], (kind, body)
    after = launch_counts(server)
    # Every search and every answer's retrieval reached the backend through the queue, and some shared a launch.
    searches = sum(1 for kind, _ in mix if kind == "search")
    retrievals = sum(len(res[1]) for (kind, _), res in zip(mix, alone) if kind == "answer")
    assert after["sum"] - before["sum"] == searches + retrievals
    launches = after["count"] - before["count"]
    assert launches - (after["1.0"] - before["1.0"]) > 0, (before, after)  # launches of two or more requests
    assert launches < searches + retrievals


def test_info_describes_the_queue(server):
    info = requests.get(server.url + "/v1/info", timeout=10).json()
    assert info["backend"]["name"] == "fpga-sim"
    assert info["backend"]["queue"] == {"kind": "device", "max_wait_ms": 5.0, "max_batch": 64}
