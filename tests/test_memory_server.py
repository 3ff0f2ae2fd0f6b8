"""The persisted memory bank reached three ways with the real all-MiniLM-L6-v2: ``ragserve memory`` on the command
line, the Python API and a real server's ``/v1/memory``, giving the same hits; the server restarted (SIGTERM,
then SIGKILL in the middle of a burst of adds) finds the same hits and every acknowledged add."""
from __future__ import annotations

import json
import threading

import pytest

from ragserve.memory.store import MemoryStore
from tests.serverproc import ServerProcess, run_cli, run_main, wait_until

requests = pytest.importorskip("requests")
KEY = "memory-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FACTS = ["The violet heron nests on the roof of the old mill.", "Tides are caused by the gravity of the moon.",
         "The mill was built in 1820 by the river.", "Copper conducts heat and electricity well.",
         "The orchestra tuned to the oboe before the concert.", "Glaciers carve U-shaped valleys over millennia."]
QUERIES = ["Where does the heron nest?", "What causes the tides?", "Which metal conducts heat?"]


def pairs(hits: list[dict]) -> list[tuple[int, float]]:
    return [(h["id"], h["score"]) for h in hits]


def server(index, memory, *extra: str) -> ServerProcess:
    srv = ServerProcess("--index", str(index), "--backend", "cpu", "--api-key", KEY, "--memory", str(memory),
                        "--embed-device", "cpu", *extra)
    def ready() -> bool:  # /readyz is behind the key too
        return requests.get(srv.url + "/readyz", headers=AUTH, timeout=5).status_code == 200

    if not wait_until(ready, 120, interval=0.2):
        srv.terminate()
        raise RuntimeError("server never became ready:\n" + srv.log())
    return srv


def search(srv: ServerProcess, q: str, k: int = 4) -> list[tuple[int, float]]:
    r = requests.get(srv.url + "/v1/memory", params={"query": q, "k": k}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return pairs(r.json()["hits"])


@pytest.mark.slow  # two server starts with the real encoder
def test_cli_python_and_server_recall_the_same_and_survive_restarts(tmp_path, minilm_dir, hotpot_index):
    mem = tmp_path / "memory"
    # the command line's add and search in this process (ragserve's main: its parsing, output and exit status);
    # `memory list` below, refused while the server holds the bank, is a process of its own
    r = run_main("memory", "add", "--memory", str(mem), "--model", str(minilm_dir), "--metadata", '{"from": "cli"}',
                 *FACTS[:4])
    assert r.returncode == 0 and "ids 0, 1, 2, 3" in r.stdout, r.stderr
    with MemoryStore(mem) as s:
        api = {q: [(h.entry.id, h.score) for h in s.search(q, 4)] for q in QUERIES}
    assert [h[0][0] for h in api.values()] == [0, 1, 3]  # the real encoder finds each answer first
    r = run_main("memory", "search", "--memory", str(mem), "-k", "4", "--json", QUERIES[1])
    assert pairs(json.loads(r.stdout)) == api[QUERIES[1]], r.stderr  # the CLI's recall is the Python API's

    srv = server(hotpot_index, mem)
    try:
        assert {q: search(srv, q) for q in QUERIES} == api  # and so is the server's
        r = requests.post(srv.url + "/v1/memory", json={"texts": FACTS[4:], "metadata": [{"n": 4}, {"n": 5}]},
                          headers=AUTH, timeout=30)
        assert r.status_code == 200 and r.json() == {"ids": [4, 5], "evicted": []}
        assert requests.get(srv.url + "/v1/memory", headers=AUTH, timeout=30).json()["total"] == 6
        assert requests.delete(srv.url + "/v1/memory/2", headers=AUTH, timeout=30).json() == {"deleted": 2}
        # the bank is held: the CLI says so in one line
        r = run_cli("memory", "list", "--memory", str(mem))
        assert r.returncode == 2 and "is in use by another process" in r.stderr and r.stderr.count("\n") == 1
        before = {q: search(srv, q, 5) for q in [*QUERIES, "a concert"]}
        assert srv.terminate() == 0
    finally:
        srv.terminate()
    srv = server(hotpot_index, mem)
    try:
        assert {q: search(srv, q, 5) for q in before} == before  # restarted: the same hits, the same scores
        # a burst of adds from four clients, the server killed with SIGKILL in the middle of it
        acked: list[int] = []
        stop = threading.Event()

        def client(c: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    r = requests.post(srv.url + "/v1/memory", json={"text": f"client {c} note {i}"}, headers=AUTH,
                                      timeout=30)
                except requests.RequestException:
                    return
                if r.status_code == 200:
                    acked.extend(r.json()["ids"])
                i += 1

        threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        while len(acked) < 20:
            threading.Event().wait(0.01)
        srv.proc.kill()
        srv.proc.wait(30)
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        srv.terminate()
    with MemoryStore(mem) as s:  # after the kill: the bank as the next server would replay it
        held = {e.id: e.text for e in s.list(limit=10**6)}
        assert set(acked) <= set(held)  # every add answered with 200 survived the kill
        assert len(set(held) - set(acked) - {0, 1, 3, 4, 5}) <= 4  # at most one in flight a client
        assert all(held[i].startswith("client ") for i in acked)
        assert [h.entry.id for h in s.search(QUERIES[1], 1)] == [before[QUERIES[1]][0][0]]


def test_memory_endpoints_auth_and_bad_input(tmp_path, minilm_dir, hotpot_index):
    srv = server(hotpot_index, tmp_path / "memory", "--memory-model", str(minilm_dir), "--max-k", "20")
    try:
        u = srv.url + "/v1/memory"
        assert requests.get(u, params={"query": "x"}, timeout=30).status_code == 401
        assert requests.post(u, json={"text": "x"}, timeout=30).status_code == 401
        assert requests.get(u, params={"query": "anything"}, headers=AUTH, timeout=30).json()["hits"] == []
        ok = requests.post(u, json={"text": FACTS[0], "metadata": {"tag": "bird"}}, headers=AUTH, timeout=30).json()
        assert ok == {"ids": [0], "evicted": []}
        entry = requests.get(f"{u}/0", headers=AUTH, timeout=30).json()
        assert entry["text"] == FACTS[0] and entry["metadata"] == {"tag": "bird"}
        bad = [("post", {"json": {"text": ""}}, "text"), ("post", {"json": {"text": "a", "texts": ["b"]}}, "text"),
               ("post", {"json": {"texts": "a"}}, "texts"), ("post", {"json": {"texts": ["a"] * 65}}, "texts"),
               ("post", {"json": {"text": "a", "metadata": [1]}}, "metadata"),
               ("post", {"json": {"texts": ["a", "b"], "metadata": [{}]}}, "metadata"),
               ("post", {"json": {"txt": "a"}}, "txt"),
               ("get", {"params": {"query": "a", "k": 0}}, "k"), ("get", {"params": {"query": "a", "k": "x"}}, "k"),
               ("get", {"params": {"query": "a", "k": 21}}, "k"), ("get", {"params": {"query": " "}}, "query"),
               ("get", {"params": {"query": "a", "top_k": 3}}, "top_k"), ("get", {"params": {"limit": 0}}, "limit")]
        for method, kw, field in bad:
            r = getattr(requests, method)(u, headers=AUTH, timeout=30, **kw)
            assert r.status_code == 400 and r.json()["error"]["field"] == field, (kw, r.text)
        r = requests.post(u, data="text", headers={**AUTH, "Content-Type": "text/plain"}, timeout=30)
        assert r.status_code == 415
        for method in ("get", "delete"):
            r = getattr(requests, method)(f"{u}/7", headers=AUTH, timeout=30)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert requests.get(u, params={"limit": 1}, headers=AUTH, timeout=30).json()["next_after"] is None
        info = requests.get(srv.url + "/v1/info", headers=AUTH, timeout=30).json()
        assert info["memory"]["entries"] == 1 and info["memory"]["encoder"] == "all-MiniLM-L6-v2"
    finally:
        srv.terminate()
    r = run_cli("serve", "--index", str(hotpot_index), "--memory", str(tmp_path / "new"))
    assert r.returncode == 2 and "give its sentence encoder with --memory-model" in r.stderr
    r = run_cli("serve", "--index", str(hotpot_index), "--memory", str(tmp_path / "memory"), "--workers", "2")
    assert r.returncode == 2 and "--memory is held by one process" in r.stderr
