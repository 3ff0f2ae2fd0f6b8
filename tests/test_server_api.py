"""Every endpoint of ``ragserve serve`` and every bad-input case, through a real server process."""
from __future__ import annotations

import io
import json
import random
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from ragserve.retrieval.searcher import Searcher
from tests.serverproc import ServerProcess, run_load_test

MAX_QUERY_CHARS = 300
MAX_BATCH = 8
MAX_K = 50
MAX_BODY = 8192
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(arguana_index):
    srv = ServerProcess("--index", str(arguana_index), "--backend", "cpu", "--max-query-chars", str(MAX_QUERY_CHARS),
                        "--max-batch", str(MAX_BATCH), "--max-k", str(MAX_K), "--max-body-bytes", str(MAX_BODY))
    yield srv
    assert srv.terminate() == 0, srv.log()


@pytest.fixture(scope="module")
def searcher(arguana_index):
    s = Searcher(arguana_index, backend="cpu")
    yield s
    s.close()


@pytest.fixture(scope="module")
def queries(arguana_queries):
    """ArguAna's queries are whole arguments; their first 250 characters keep bodies under the test limits."""
    return [q.text[:250] for q in arguana_queries[:40]]


def post(server, path, body, headers=JSON, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(server.url + path, data=data, headers=headers, timeout=30, **kw)


def assert_error(resp, status, field=None):
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    err = resp.json()["error"]
    assert err["status"] == status and err["message"]
    if field is not None:
        assert err.get("field") == field, err
    return err


def hit_keys(hits):
    return [(h.id, h.score) for h in hits]


def json_keys(hits):
    return [(h["id"], h["score"]) for h in hits]


# -- endpoints ----------------------------------------------------------------------------------
def test_healthz_and_readyz(server):
    r = requests.get(server.url + "/healthz", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    server.wait_ready()  # 503 until the warm-up search (and backend check) has run
    r = requests.get(server.url + "/readyz", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["ready"] is True and body["index"] == {"loaded": True, "documents": 8674}
    assert body["model"] == {"state": "none"}
    assert body["warmup"]["state"] == "done" and body["warmup"]["seconds"]["search"] > 0
    assert "warm-up done: search" in server.log()


def test_info(server, arguana_index):
    info = requests.get(server.url + "/v1/info", timeout=10).json()
    assert info["index"]["manifest"]["stats"]["num_docs"] == 8674
    assert info["index"]["path"] == str(arguana_index)
    assert info["backend"]["name"] == "cpu"
    cpu = [b for b in info["backends"] if b["name"] == "cpu"]
    assert cpu and cpu[0]["available"] is True
    assert info["model"] is None and info["auth"] is False
    assert info["limits"]["max_k"] == MAX_K and info["limits"]["max_batch"] == MAX_BATCH
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", info["version"])


def test_search_matches_in_process_searcher(server, searcher, queries):
    for q in queries[:10]:
        r = post(server, "/v1/search", {"query": q, "k": 7})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["query"] == q.strip() and body["k"] == 7 and body["backend"] == "cpu"
        expected = searcher.search(q.strip(), k=7)
        assert json_keys(body["hits"]) == hit_keys(expected)  # same ids, bit-identical f32 scores
        assert [h["rank"] for h in body["hits"]] == list(range(1, len(expected) + 1))
        assert body["hits"][0]["text"] == expected[0].text
        assert set(body["timing"]) == {"prepare", "relevancy", "retrieval", "total"}
        assert body["timing"]["total"] >= body["timing"]["relevancy"] >= 0


def test_search_bm25_parameters(server, searcher, queries):
    q = queries[0]
    tuned = post(server, "/v1/search", {"query": q, "k": 5, "k1": 1.2, "b": 0.75}).json()
    default = post(server, "/v1/search", {"query": q, "k": 5}).json()
    assert json_keys(tuned["hits"]) == hit_keys(searcher.search(q, k=5, k1=1.2, b=0.75))
    assert [h["score"] for h in tuned["hits"]] != [h["score"] for h in default["hits"]]


def test_search_default_k_is_10(server):
    body = post(server, "/v1/search", {"query": "nuclear energy"}).json()
    assert body["k"] == 10 and len(body["hits"]) == 10


def test_search_no_match_is_empty(server):
    body = post(server, "/v1/search", {"query": "zzzqqqxxyy"}).json()
    assert body["hits"] == []


def test_batch_search(server, searcher, queries):
    batch = queries[:MAX_BATCH]
    r = post(server, "/v1/search", {"queries": batch, "k": 4})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["query"] for x in results] == [q.strip() for q in batch]
    for x, hits in zip(results, searcher.search_batch([q.strip() for q in batch], k=4)):
        assert json_keys(x["hits"]) == hit_keys(hits)


def test_parallel_searches_are_correct(server, searcher, queries):
    expected = {q: hit_keys(searcher.search(q.strip(), k=5)) for q in queries}
    work = queries * 3
    random.Random(1).shuffle(work)

    def one(q):
        r = post(server, "/v1/search", {"query": q, "k": 5})
        return q, r.status_code, json_keys(r.json()["hits"])

    with ThreadPoolExecutor(16) as pool:
        for q, status, got in pool.map(one, work):
            assert status == 200 and got == expected[q]


def test_answer_without_model_is_503(server):
    err = assert_error(post(server, "/v1/answer", {"question": "who wrote it?"}), 503)
    assert err["code"] == "no_generator" and "--model" in err["message"]


def test_page_and_assets(server):
    r = requests.get(server.url + "/", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert 'id="search-form"' in r.text and 'id="ask-form"' in r.text
    assert "http://" not in r.text and "https://" not in r.text  # nothing from a CDN
    for asset, ctype in (("app.js", "javascript"), ("style.css", "text/css")):
        a = requests.get(f"{server.url}/static/{asset}", timeout=10)
        assert a.status_code == 200 and ctype in a.headers["Content-Type"] and len(a.content) > 500


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, checking every line is a comment or a valid sample."""
    out = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_]+="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = sample.match(line)
        assert m, f"not Prometheus text format: {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def test_metrics_count_requests_and_stage_times(server):
    key = 'ragserve_http_requests_total{endpoint="/v1/search",method="POST",status="200"}'
    before = parse_metrics(requests.get(server.url + "/metrics", timeout=10).text)
    for _ in range(3):
        assert post(server, "/v1/search", {"queries": ["gun control", "school uniforms"], "k": 3}).status_code == 200
    assert post(server, "/v1/search", {"query": ""}).status_code == 400
    k400 = key.replace('"200"', '"400"')
    lat = 'ragserve_http_request_duration_seconds_count{endpoint="/v1/search"}'

    def scrape() -> dict:
        r = requests.get(server.url + "/metrics", timeout=10)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse_metrics(r.text)

    # A request is counted when the server closes its body, which may come just after the client has read it.
    after = scrape()
    for _ in range(50):
        if after.get(lat, 0) - before.get(lat, 0) >= 4:
            break
        time.sleep(0.05)
        after = scrape()
    assert after[key] - before.get(key, 0) == 3
    assert after[k400] - before.get(k400, 0) == 1
    assert after["ragserve_search_queries_total"] - before.get("ragserve_search_queries_total", 0) == 6
    for stage in ("prepare", "relevancy", "retrieval"):
        assert after[f'ragserve_search_stage_seconds_total{{stage="{stage}"}}'] > 0
    assert after[lat] - before.get(lat, 0) == 4
    assert after['ragserve_http_request_duration_seconds_bucket{endpoint="/v1/search",le="+Inf"}'] == after[lat]
    assert after["ragserve_retrieval_seconds_count"] >= 3
    assert after["ragserve_index_documents"] == 8674
    assert after["ragserve_http_requests_in_flight"] == 1  # this /metrics request itself


def test_short_load_test_has_no_errors(server):
    from tests.conftest import shared

    s = run_load_test("--url", server.url, "--queries", str(shared("beir-arguana", "queries.jsonl.gz")),
                      "--truncate", str(MAX_QUERY_CHARS), "--clients", "8", "--duration", "3", "--k", "10")
    assert s["exit"] == 0 and s["errors"] == 0 and s["requests"] >= 8, s
    level = s["levels"][0]
    assert level["clients"] == 8 and 0 < level["p50_ms"] <= level["p99_ms"] <= level["max_ms"]
    assert s["meta"]["backend"] == "cpu" and level["server_queue"]["launches"] > 0


# -- bad input: a 4xx naming the field, never a 5xx --------------------------------------------------
BAD_SEARCH = [
    (b'{"query": "gun', 400, "body"),  # broken JSON
    (b"", 400, "body"),
    (b"[1, 2]", 400, "body"),
    (b'"just a string"', 400, "body"),
    (b'{"query": "x", "k1": NaN}', 400, "body"),  # not JSON
    (b'{"query": "\xff\xfe"}', 400, "body"),  # not UTF-8
    (b"[" * 50000 + b"]" * 50000, 413, "body"),
    (b'{"query": ' + b"[" * 3000 + b"]" * 3000 + b"}", 400, "body"),  # nested too deep for the parser
    ({"query": 5}, 400, "query"),
    ({"query": None}, 400, "query"),
    ({"query": ""}, 400, "query"),
    ({"query": "   \n\t "}, 400, "query"),
    ({"query": "a" * (MAX_QUERY_CHARS + 1)}, 400, "query"),
    ({"query": "\ud800 lone surrogate"}, 400, "query"),
    ({}, 400, "query"),
    ({"query": "a", "queries": ["b"]}, 400, "query"),
    ({"query": "a", "top_k": 3}, 400, "top_k"),
    ({"query": "a", "k": 0}, 400, "k"),
    ({"query": "a", "k": MAX_K + 1}, 400, "k"),
    ({"query": "a", "k": -3}, 400, "k"),
    ({"query": "a", "k": "10"}, 400, "k"),
    ({"query": "a", "k": 2.5}, 400, "k"),
    ({"query": "a", "k": True}, 400, "k"),
    ({"query": "a", "k": 10 ** 30}, 400, "k"),
    ({"query": "a", "k1": 0}, 400, "k1"),
    ({"query": "a", "k1": -1.0}, 400, "k1"),
    ({"query": "a", "k1": "1.2"}, 400, "k1"),
    (b'{"query": "a", "k1": 1e999}', 400, "k1"),  # valid JSON, parsed as infinity
    ({"query": "a", "b": 1.5}, 400, "b"),
    ({"query": "a", "b": -0.1}, 400, "b"),
    ({"query": "a", "b": [0.4]}, 400, "b"),
    ({"queries": "not a list"}, 400, "queries"),
    ({"queries": []}, 400, "queries"),
    ({"queries": ["a"] * (MAX_BATCH + 1)}, 400, "queries"),
    ({"queries": ["ok", 3]}, 400, "queries[1]"),
    ({"queries": ["ok", ""]}, 400, "queries[1]"),
    ({"query": "x" * (MAX_BODY + 10)}, 413, "body"),
]


@pytest.mark.parametrize("body,status,field", BAD_SEARCH, ids=range(len(BAD_SEARCH)))
def test_bad_search_input(server, body, status, field):
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    assert_error(post(server, "/v1/search", body), status, field)


def test_content_type_must_be_json(server):
    err = assert_error(post(server, "/v1/search", b'{"query": "a"}', headers={"Content-Type": "text/plain"}), 415,
                       "Content-Type")
    assert "application/json" in err["message"]
    assert_error(post(server, "/v1/search", b'{"query": "a"}', headers={}), 415, "Content-Type")
    ok = post(server, "/v1/search", b'{"query": "a b c"}', headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


BAD_ANSWER = [
    ({}, 400, "question"),
    ({"question": 3}, 400, "question"),
    ({"question": " "}, 400, "question"),
    ({"question": "q" * (MAX_QUERY_CHARS + 1)}, 400, "question"),
    ({"question": "why?", "method": "telepathy"}, 400, "method"),
    ({"question": "why?", "method": 1}, 400, "method"),
    ({"question": "why?", "stream": "yes"}, 400, "stream"),
    ({"question": "why?", "options": []}, 400, "options"),
    ({"question": "why?", "temperature": 0.2}, 400, "temperature"),
    (b"{", 400, "body"),
]


@pytest.mark.parametrize("body,status,field", BAD_ANSWER, ids=range(len(BAD_ANSWER)))
def test_bad_answer_input_is_400_even_without_a_model(server, body, status, field):
    assert_error(post(server, "/v1/answer", body), status, field)


def test_unknown_path_and_wrong_method(server):
    assert_error(requests.get(server.url + "/v1/nothing", timeout=10), 404)
    r = requests.get(server.url + "/v1/search", timeout=10)
    err = assert_error(r, 405)
    assert "POST" in r.headers["Allow"] and "POST" in err["message"]
    assert_error(requests.delete(server.url + "/healthz", timeout=10), 405)


def _mutations(rng: random.Random) -> list[bytes]:
    """Malformed and ill-typed bodies: truncations, byte flips, wrong types, odd unicode, junk."""
    valid = [b'{"query": "nuclear power", "k": 5}', b'{"queries": ["a", "b"], "k": 3, "k1": 1.2, "b": 0.7}']
    values = [None, True, -1, 0, 1e308, -1e-308, "", "x", [], {}, [None], {"a": 1}, "\u0000", "\U0001F600" * 5,
              2 ** 64, [["deep"]], " " * 10]
    out = []
    for v in valid:
        for _ in range(8):
            cut = rng.randrange(1, len(v))
            out.append(v[:cut])
            b = bytearray(v)
            b[rng.randrange(len(b))] = rng.randrange(256)
            out.append(bytes(b))
    for field in ("query", "queries", "k", "k1", "b", "extra"):
        for v in rng.sample(values, 5):
            body = {"query": "solar"} if field not in ("query", "queries") else {}
            body[field] = v
            out.append(json.dumps(body).encode())
    out += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) for _ in range(10)]
    return out


def test_fuzzed_bodies_never_5xx(server):
    bodies = _mutations(random.Random(20260601))
    assert len(bodies) >= 60
    seen = set()
    for body in bodies:
        for path in ("/v1/search", "/v1/answer"):
            r = post(server, path, body)
            assert r.status_code < 500 or r.json()["error"]["code"] == "no_generator", (body, r.status_code, r.text)
            if r.status_code >= 400:
                assert r.json()["error"]["message"]
            seen.add(r.status_code)
    assert 400 in seen and 200 in seen
    assert requests.get(server.url + "/healthz", timeout=10).status_code == 200


def test_huge_declared_body_is_refused_before_upload(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 500000000\r\n\r\n{")
        reply = s.recv(4096)
    assert reply.split(b"\r\n", 1)[0].split(b" ")[1] == b"413"


def test_garbage_http_does_not_break_the_server(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"NOT-HTTP \x00\x01\x02\r\n\r\n")
        reply = s.recv(4096)
    status = reply.split(b"\r\n", 1)[0].split(b" ")
    assert status[0].startswith(b"HTTP/1.") and 400 <= int(status[1]) < 500
    assert requests.get(server.url + "/healthz", timeout=10).status_code == 200


def test_search_route_answers_as_flask_would(searcher):
    """POST /v1/search skips flask (``SearchRoute``): its bodies are flask's jsonify bytes, its headers flask's."""
    from flask import jsonify

    from ragserve.server.app import create_app
    from ragserve.server.config import ServerConfig

    app = create_app(searcher, ServerConfig(max_body_bytes=4096, api_key="k"))
    client = app.test_client()
    auth = {"Authorization": "Bearer k"}
    r = client.post("/v1/search", json={"query": "nuclear power", "k": 3}, headers=auth)
    assert r.status_code == 200 and r.headers["Cache-Control"] == "no-store"
    assert r.headers["Content-Type"] == "application/json"
    with app.app_context():
        assert r.data == jsonify(r.get_json()).get_data()  # compact, key order kept, final newline
    r = client.post("/v1/search", json={"query": "nuclear power"})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == 'Bearer realm="ragserve"'
    assert r.get_json()["error"]["field"] == "Authorization"
    big = json.dumps({"query": "x" * 5000}).encode()
    r = client.post("/v1/search", data=big, headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 413 and r.get_json()["error"]["code"] == "body_too_large"
    chunked = io.BytesIO(b'{"query": "nuclear power", "k": 2}')  # no Content-Length, as waitress passes chunks
    r = client.post("/v1/search", input_stream=chunked, headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 200 and len(r.get_json()["hits"]) == 2
    r = client.get("/v1/search", headers=auth)
    assert r.status_code == 405 and r.headers["Cache-Control"] == "no-store"
