"""A live index behind a real server: writes, refreshes and merges while searches run, none of them failing or
seeing half of a write."""
from __future__ import annotations

import random
import shutil
import threading
import time

import requests

from ragserve.retrieval.searcher import Searcher
from ragserve.server.app import create_app
from ragserve.server.config import ServerConfig
from tests.serverproc import ServerProcess, wait_until

KEY = "live-test-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def test_writes_are_refused_without_writes_flag(arguana_index):
    app = create_app(Searcher(arguana_index, threads=1), ServerConfig())
    r = app.test_client().post("/v1/documents", json={"documents": [{"id": "a", "text": "b"}]})
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "writes_disabled"


def test_concurrent_searches_during_writes_and_merges(tmp_path, arguana_index):
    """Writer threads add, replace and delete batches of documents (each batch tagged with its own marker word)
    through POST/DELETE /v1/documents while searcher threads query the markers and ordinary text; refreshes run
    every 0.2 s and merges keep folding segments. Every request succeeds, and a marker is always found in all of
    its batch's documents or in none: no search sees part of a write."""
    idx = shutil.copytree(arguana_index, tmp_path / "idx")
    srv = ServerProcess("--index", str(idx), "--backend", "cpu", "--writes", "--refresh-interval", "0.2",
                        "--merge-max-segments", "3", "--api-key", KEY, "--max-k", "50")
    try:
        url = srv.url
        assert wait_until(lambda: requests.get(url + "/readyz", headers=AUTH, timeout=5).status_code == 200, 120)
        r = requests.post(url + "/v1/documents", json={"documents": [{"id": "x", "text": "y"}]})
        assert r.status_code == 401  # behind the API key
        r = requests.post(url + "/v1/documents", headers=AUTH, json={"documents": [{"id": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["field"] == "documents[0].text"

        batches: dict[str, int] = {}  # marker -> documents of its batch (deleted or replaced ones too)
        lock = threading.Lock()
        errors: list[str] = []
        stop = threading.Event()
        counts = {"writes": 0, "searches": 0, "found": 0}

        def write(seed: int) -> None:
            rng = random.Random(seed)
            n = 0
            live: list[tuple[str, list[str]]] = []  # (marker, ids) of this thread's batches in the index
            while not stop.is_set():
                n += 1
                marker = f"mark{seed}x{n}"
                r = rng.random()
                if live and r < 0.25:  # delete a whole batch
                    old, ids = live.pop(rng.randrange(len(live)))
                    resp = requests.delete(url + "/v1/documents", headers=AUTH, json={"ids": ids})
                elif live and r < 0.5:  # replace a whole batch: the old marker goes, the new one comes
                    old, ids = live.pop(rng.randrange(len(live)))
                    docs = [{"id": i, "title": "replaced", "text": f"{marker} passage {j}"} for j, i in enumerate(ids)]
                    with lock:
                        batches[marker] = len(ids)
                    resp = requests.post(url + "/v1/documents", headers=AUTH, json={"documents": docs})
                    live.append((marker, ids))
                else:
                    ids = [f"w{seed}-{n}-{j}" for j in range(rng.randint(2, 6))]
                    docs = [{"id": i, "title": "live", "text": f"{marker} written passage {j}"}
                            for j, i in enumerate(ids)]
                    with lock:
                        batches[marker] = len(ids)
                    resp = requests.post(url + "/v1/documents", headers=AUTH, json={"documents": docs})
                    live.append((marker, ids))
                if resp.status_code != 200 or not resp.json()["acknowledged"]:
                    errors.append(f"write {resp.status_code}: {resp.text}")
                counts["writes"] += 1

        def search(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                with lock:
                    marker, n = rng.choice(list(batches.items())) if batches else ("argument", -1)
                query = marker if rng.random() < 0.8 else "nuclear power is safe and clean energy"
                resp = requests.post(url + "/v1/search", headers=AUTH, json={"query": query, "k": 50})
                counts["searches"] += 1
                if resp.status_code != 200:
                    errors.append(f"search {resp.status_code}: {resp.text}")
                    continue
                hits = resp.json()["hits"]
                if query == marker and n >= 0:
                    if len(hits) not in (0, n):
                        errors.append(f"{marker}: {len(hits)} hits, its batch has {n} documents")
                    if any(marker not in h["text"] for h in hits):
                        errors.append(f"{marker}: a hit without the marker")
                    counts["found"] += bool(hits)

        threads = [threading.Thread(target=write, args=(s,)) for s in (1, 2)]
        threads += [threading.Thread(target=search, args=(s,)) for s in (3, 4)]
        for t in threads:
            t.start()
        time.sleep(12)
        stop.set()
        for t in threads:
            t.join(60)
        assert not errors, errors[:5]
        assert counts["writes"] > 20 and counts["searches"] > 50 and counts["found"] > 5, counts
        # A write with "refresh": true is searchable when its response comes.
        r = requests.post(url + "/v1/documents", headers=AUTH, json={
            "documents": [{"id": "now", "title": "t", "text": "zanzibarian quokka"}], "refresh": True})
        assert r.status_code == 200 and r.json()["searchable"] == "now"
        hits = requests.post(url + "/v1/search", headers=AUTH, json={"query": "zanzibarian quokka"}).json()["hits"]
        assert [h["id"] for h in hits] == ["now"]
        assert "merged" in srv.log(), "no merge ran during the test"
    finally:
        srv.terminate()


def test_document_endpoints_in_process(tmp_path, arguana_index):
    """The document endpoints' answers, and /v1/info and /v1/search over a live index, through the flask app."""
    from indexer.segments import LiveIndex
    from ragserve.retrieval.factory import RetrieverSet
    from ragserve.retrieval.live import LiveSearcher
    from ragserve.server.documents import LiveWrites

    live = LiveIndex(shutil.copytree(arguana_index, tmp_path / "idx"))
    searcher = LiveSearcher(live, backend="cpu", threads=1)
    client = create_app(RetrieverSet(searcher), ServerConfig(), writes=LiveWrites(live, 1.0)).test_client()
    r = client.post("/v1/documents", json={"documents": [{"id": "q1", "title": "Quokka", "text": "quokka selfies"}]})
    assert r.status_code == 200 and r.get_json()["added"] == 1 and r.get_json()["searchable"].startswith("within")
    assert client.post("/v1/search", json={"query": "quokka"}).get_json()["hits"] == []  # not refreshed yet
    r = client.post("/v1/documents", json={"documents": [{"id": "q2", "text": "quokka island"}], "refresh": True})
    assert r.get_json()["searchable"] == "now"
    hits = client.post("/v1/search", json={"query": "quokka", "k": 5}).get_json()["hits"]
    assert {h["id"] for h in hits} == {"q1", "q2"} and hits[0]["text"]
    r = client.delete("/v1/documents", json={"ids": ["q1", "nope"], "refresh": True})
    assert r.get_json()["deleted"] == 1 and r.get_json()["missing"] == ["nope"]
    assert [h["id"] for h in client.post("/v1/search", json={"query": "quokka"}).get_json()["hits"]] == ["q2"]
    for bad, field in (({"documents": []}, "documents"), ({"documents": [{"id": "", "text": "x"}]}, "documents[0].id"),
                       ({"documents": [{"id": "a", "text": "x", "extra": 1}]}, "documents[0].extra"),
                       ({"documents": [{"id": "a", "text": "x"}], "refresh": "yes"}, "refresh")):
        r = client.post("/v1/documents", json=bad)
        assert r.status_code == 400 and r.get_json()["error"]["field"] == field, r.get_json()
    assert client.delete("/v1/documents", json={"ids": "q2"}).status_code == 400
    info = client.get("/v1/info").get_json()
    assert info["index"]["manifest"]["format"] == "ragserve-live"
    assert info["index"]["manifest"]["stats"]["num_docs"] == 8674 + 1
    searcher.close()
    live.close()
