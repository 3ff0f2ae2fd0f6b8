"""ragserve on Ray (ragserve.distributed), on one local Ray cluster shared by the session: the distributed build
is the local build byte for byte; distributed search is local search (ids, ranks, score bits) on ArguAna; a
killed shard replica gives a clear error or a flagged partial result, then comes back; the HTTP API on Ray Serve
answers bad input as the local server does, and its ``/v1/answer`` (the generator in its own deployment, called by
the ingress's RAG methods) answers as the library's method does in-process. One Serve application serves all of
these: Ray Serve runs one per cluster, and each start and stop costs tens of seconds on two cores."""
from __future__ import annotations

import filecmp
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from indexer.options import BuildOptions
from indexer.writer import build_index
from ragserve.kernels.contract import ShardsUnavailable
from ragserve.distributed.shards import ShardFilesError, ShardGroup, merge_topk, plan_groups
from ragserve.kernels.contract import TopK
from ragserve.rag.methods import build_method
from ragserve.rag.prompts import PromptBuilder, load_exemplars
from ragserve.retrieval.searcher import Searcher
from tests import rag_support
from tests.conftest import shared
from tests.serverproc import ServerProcess, run_cli, wait_until
from tests.test_server_api import (BAD_ANSWER, BAD_SEARCH, MAX_BATCH, MAX_BODY, MAX_K, MAX_QUERY_CHARS,
                                   assert_error, post)

pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one worker, one Ray cluster (tests/conftest.py)

# ArguAna in small blocks and banks: 7 shards (600 KB - 1 MB each).
SMALL = dict(block_size=1 << 10, bank_bytes=1 << 20)
GROUPS = 3


def _keys(hits):
    return [(h.id, h.docid, h.score) for h in hits]


@pytest.fixture(scope="module")
def small_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ray") / "arguana"
    build_index([shared("beir-arguana", "corpus.jsonl.gz")], out, BuildOptions(progress=False, **SMALL))
    return out


@pytest.fixture(scope="module")
def local(small_index):
    s = Searcher(small_index, backend="cpu")
    yield s
    s.close()


@pytest.fixture(scope="module")
def distributed(ray_cluster, small_index):
    from ragserve.distributed.shards import DistributedSearcher

    # These tests check results, not latency: a loaded 2-core machine may take longer than the default 30 s on
    # a batch of 300 queries, which would read as a lost replica.
    s = DistributedSearcher(small_index, ray=ray_cluster, groups=GROUPS, timeout_s=120)
    yield s
    s.close()


@pytest.fixture(scope="module")
def queries(arguana_queries) -> list[str]:
    return [q.text for q in arguana_queries]


# -- build ------------------------------------------------------------------------------------------------
def _split_corpus(src: Path, dest: Path, parts: int) -> list[Path]:
    """The corpus as ``parts`` JSONL files (so the build has several partitions), with one malformed line in
    the second (so the reader's counts and errors must be merged across partitions)."""
    lines = gzip.open(src, "rt", encoding="utf-8").read().splitlines()
    files, step = [], -(-len(lines) // parts)
    for i in range(parts):
        chunk = lines[i * step:(i + 1) * step]
        if i == 1:
            chunk.insert(5, '{"_id": "broken", "text": ')
        f = dest / f"part{i}.jsonl"
        f.write_text("\n".join(chunk) + "\n", encoding="utf-8")
        files.append(f)
    return files


@pytest.mark.slow
def test_distributed_build_equals_local_build(ray_cluster, tmp_path):
    from ragserve.distributed.build import BUILD_FIELDS

    inputs = _split_corpus(shared("beir-arguana", "corpus.jsonl.gz"), tmp_path, 3)
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    flags = ["--block-size", str(SMALL["block_size"]), "--bank-bytes", str(SMALL["bank_bytes"]), "--quiet"]
    build_index(inputs, local_dir, BuildOptions(progress=False, **SMALL))
    r = run_cli("index", *map(str, inputs), "--out", str(ray_dir), "--ray", ray_cluster, *flags, timeout=600)
    assert r.returncode == 0, r.stderr
    local_m = json.loads((local_dir / "manifest.json").read_text())
    ray_m = json.loads((ray_dir / "manifest.json").read_text())
    assert local_m["layout"]["num_shards"] >= 5 and local_m["source"]["skipped"] == 1
    # Every file, byte for byte (the manifest apart), and the manifest up to the fields that record the build.
    names = sorted(str(p.relative_to(local_dir)) for p in local_dir.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(ray_dir)) for p in ray_dir.rglob("*") if p.is_file())
    for name in names:
        if name != "manifest.json":
            assert filecmp.cmp(local_dir / name, ray_dir / name, shallow=False), name
    differ = sorted(k for k in local_m if local_m[k] != ray_m.get(k))
    assert set(differ) <= set(BUILD_FIELDS) and set(local_m) == set(ray_m), differ
    assert ray_m["files"] == local_m["files"] and ray_m["source"] == local_m["source"]


def test_distributed_build_reports_bad_input_as_the_local_build(ray_cluster, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "1", "text": "fine"}\n{"_id": "2", "text": \n', encoding="utf-8")
    r = run_cli("index", str(bad), "--out", str(tmp_path / "o"), "--ray", ray_cluster, "--on-error", "fail",
                "--quiet", timeout=600)
    local = run_cli("index", str(bad), "--out", str(tmp_path / "o2"), "--on-error", "fail", "--quiet")
    assert r.returncode == local.returncode == 2, r.stderr
    line = local.stderr.strip().splitlines()[-1]
    assert line.startswith("ragserve index: error: ") and line in r.stderr.splitlines()  # Ray logs around it
    assert not (tmp_path / "o").exists()


# -- the merge (no Ray: the groups in this process) ----------------------------------------------------------
def test_merge_of_any_grouping_is_the_global_top_k(small_index, local, queries):
    m = local.manifest
    n = m["layout"]["num_shards"]
    groups = [ShardGroup(small_index, [s]) for s in range(n)]
    rng = random.Random(7)
    for q in rng.sample(queries, 40):
        terms = local.analyze(q)
        k = rng.choice([1, 3, 10, 100, 1000])
        per_shard = [g.search([terms], k, local.index.k1, local.index.b)[0][0] for g in groups]
        cut = sorted(rng.sample(range(1, n), rng.randrange(0, n - 1)))  # a random grouping of the shards
        bounds = [0, *cut, n]
        grouped = [merge_topk(per_shard[a:b], k) for a, b in zip(bounds, bounds[1:])]
        want = local.backend.search_terms([terms], k, local.index.k1, local.index.b)[0]
        assert merge_topk(grouped, k).same_as(want)


def test_merge_breaks_ties_by_docid():
    a = TopK(np.array([5, 9], np.int64), np.array([2.0, 1.0], np.float32))
    b = TopK(np.array([3, 7, 8], np.int64), np.array([2.0, 1.0, 1.0], np.float32))
    top = merge_topk([a, b], 4)
    assert top.docids.tolist() == [3, 5, 7, 8] and top.scores.tolist() == [2.0, 2.0, 1.0, 1.0]
    assert merge_topk([a, TopK(np.zeros(0, np.int64), np.zeros(0, np.float32))], 10).same_as(a)


def test_plan_groups_covers_every_shard_once(small_index):
    m = json.loads((small_index / "manifest.json").read_text())
    n = m["layout"]["num_shards"]
    for g in range(1, n + 1):
        plan = plan_groups(m, g)
        assert len(plan) == g and [s for grp in plan for s in grp] == list(range(n))
    with pytest.raises(ValueError):
        plan_groups(m, n + 1)


def test_replica_checks_its_files_against_the_manifest(small_index, tmp_path):
    copy = tmp_path / "idx"
    shutil.copytree(small_index, copy)
    f = copy / "shard_0001" / "postings.u32"
    data = bytearray(f.read_bytes())
    data[100] ^= 1  # same size: only the SHA-256 tells
    f.write_bytes(bytes(data))
    ShardGroup(copy, [0]).close()  # its own files are intact
    with pytest.raises(ShardFilesError, match="shard_0001/postings.u32"):
        ShardGroup(copy, [1])


# -- search on the cluster -----------------------------------------------------------------------------------
@pytest.mark.parametrize("k,n", [(1, 300), (10, 300), (100, 300), (1000, 100)])
def test_distributed_search_equals_local_search(distributed, local, queries, k, n):
    batch = queries[:n]
    got = distributed.search_batch(batch, k=k, with_text=(k == 10))
    want = local.search_batch(batch, k=k, with_text=(k == 10))
    assert sum(len(h) for h in want) > 0
    for g, w in zip(got, want):
        assert _keys(g) == _keys(w)  # ids, internal docids, f32 score bits; rank = position
        if k == 10:
            assert [(h.title, h.text) for h in g] == [(h.title, h.text) for h in w]
    # Other BM25 parameters go to every replica.
    assert _keys(distributed.search(batch[0], k=k, k1=1.2, b=0.75)) == _keys(local.search(batch[0], k=k, k1=1.2,
                                                                                           b=0.75))


def _partial_expected(local, query: str, k: int, missing: set[int]) -> list:
    """The exact top-k of the shards not in ``missing``, from a deep local list."""
    shards = local.manifest["shards"]
    gone = [(shards[s]["doc_start"], shards[s]["doc_end"]) for s in missing]
    deep = local.search(query, k=1000, with_text=False)
    kept = [h for h in deep if not any(a <= h.docid < b for a, b in gone)]
    assert len(kept) >= k or len(deep) < 1000
    return _keys(kept[:k])


def test_killed_replica_gives_clear_error_or_flagged_partial_result_then_recovers(distributed, local, queries):
    victim = 1
    lost = set(distributed.plan[victim])
    pids = distributed.backend.pids()
    qs = queries[:20]
    want = {q: _keys(local.search(q, k=10, with_text=False)) for q in qs}
    os.kill(pids[victim], signal.SIGKILL)
    errors = partial = full = 0
    deadline = time.monotonic() + 240
    recovered = False
    i = 0
    while time.monotonic() < deadline and not recovered:
        q = qs[i % len(qs)]
        i += 1
        try:
            hits = distributed.search(q, k=10, with_text=False)
            assert _keys(hits) == want[q]  # a full answer is never wrong
            full += 1
            recovered = errors + partial > 0
        except ShardsUnavailable as e:
            assert set(e.missing) == lost and "unavailable" in str(e)
            errors += 1
            missing: set[int] = set()
            hits = distributed.search(q, k=10, with_text=False, missing=missing)
            if missing:  # still down: the others' exact top-k, the missing shards named
                assert missing == lost and _keys(hits) == _partial_expected(local, q, 10, missing)
                partial += 1
            time.sleep(0.2)
    assert errors >= 1 and recovered, (errors, partial, full)
    new_pids = distributed.backend.pids()
    assert new_pids[victim] != pids[victim] and new_pids[:victim] == pids[:victim]
    assert all(_keys(distributed.search(q, k=10, with_text=False)) == want[q] for q in qs)


@pytest.fixture
def short_deadline(distributed):
    """The shared searcher with a 3 s first-answer deadline for one test."""
    before = distributed.backend.timeout_s
    distributed.backend.timeout_s = 3.0
    yield distributed
    distributed.backend.timeout_s = before


def _stopped(pid: int, seconds: float) -> threading.Timer:
    """Stop a replica's process now (SIGSTOP: a real slow replica) and let it go on after ``seconds``."""
    os.kill(pid, signal.SIGSTOP)
    t = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    t.start()
    return t


def test_slow_replica_is_retried_once_before_it_counts_as_missing(short_deadline, local, queries):
    s = short_deadline
    q = queries[3]
    want = _keys(local.search(q, k=10, with_text=False))
    pid = s.backend.pids()[1]
    # Slower than one deadline, within two: the retry's window takes the answer; a full, exact list.
    timer = _stopped(pid, 4.5)
    try:
        assert _keys(s.search(q, k=10, with_text=False)) == want
    finally:
        timer.join()
    # Slower than both: the group counts as missing, and the message says it was retried.
    timer = _stopped(pid, 9.0)
    try:
        with pytest.raises(ShardsUnavailable, match="nor a retry within 3 s more") as e:
            s.search(q, k=10, with_text=False)
        assert set(e.value.missing) == set(s.plan[1])
    finally:
        timer.join()
    assert _keys(s.search(q, k=10, with_text=False)) == want


def test_distributed_search_with_the_cores_held_busy(distributed, local, queries):
    """Two busy loops at the searcher's own priority hold both cores for the test's duration (bounded by their
    own timeout too): every batch still answers, exactly."""
    # The loop bounds itself: a `timeout` wrapper would be killed below while its child spun on.
    spin = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        qs = queries[:120]
        for i in range(0, len(qs), 40):
            got = distributed.search_batch(qs[i:i + 40], k=10, with_text=False)
            assert [_keys(h) for h in got] == [_keys(local.search(q, k=10, with_text=False)) for q in qs[i:i + 40]]
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_search_cli_on_ray(ray_cluster, small_index, local):
    r = run_cli("search", "nuclear power is safe", "--index", str(small_index), "--ray", ray_cluster,
                "--ray-groups", "2", "-k", "7", "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    got = [(h["id"], h["docid"], h["score"]) for h in json.loads(r.stdout)]
    assert got == _keys(local.search("nuclear power is safe", k=7))


# -- HTTP on Ray Serve -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_server(ray_cluster, small_index, exemplars):
    """The API on Ray Serve with the tiny random Llama of tests/rag_support.py as its generator deployment."""
    srv = ServerProcess("--index", str(small_index), "--backend", "cpu", "--ray", ray_cluster, "--ray-groups", "2",
                        "--ray-group-cpus", "0.5", "--max-query-chars", str(MAX_QUERY_CHARS), "--max-batch",
                        str(MAX_BATCH), "--max-k", str(MAX_K), "--max-body-bytes", str(MAX_BODY),
                        "--model", str(rag_support.tiny_lm()), "--device", "cpu", "--max-new-tokens", "48",
                        "--exemplars", str(exemplars), startup_timeout=600)
    ok = wait_until(lambda: _status(srv.url + "/healthz") == 200, 300, interval=0.5)
    assert ok, srv.log()
    srv.wait_ready(timeout=600)
    yield srv
    assert srv.terminate(timeout=120) == 0, srv.log()


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=5).status_code
    except requests.RequestException:
        return 0


def test_ray_serve_search_matches_local_and_flags_partial(ray_server, local, queries):
    for q in queries[:5]:
        q = q[:250]
        body = post(ray_server, "/v1/search", {"query": q, "k": 7}).json()
        assert [(h["id"], h["docid"], h["score"]) for h in body["hits"]] == _keys(local.search(q.strip(), k=7))
        assert [h["rank"] for h in body["hits"]] == list(range(1, len(body["hits"]) + 1))
    body = post(ray_server, "/v1/search", {"queries": ["gun control", "school uniforms"], "k": 3,
                                           "partial": True}).json()
    assert body["missing_shards"] == [] and len(body["results"]) == 2
    info = requests.get(ray_server.url + "/v1/info", timeout=10).json()
    assert info["backend"]["name"] == "cpu" and len(info["backend"]["ray"]["groups"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("method", ["flare", "dragin"])
def test_answer_on_ray_serve_equals_the_in_process_method(ray_server, local, exemplars, method):
    question, small = "Were Scott Derrickson and Ed Wood of the same nationality?", {
        "k": 2, "max_new_tokens": 8, "answer_max_tokens": 4}
    with rag_support.one_torch_thread():  # greedy: repeatable
        answer, trace = build_method(method, rag_support.generator(), PromptBuilder(load_exemplars(exemplars)),
                                     local, **small).answer(question)
    r = requests.post(ray_server.url + "/v1/answer", json={"question": question, "method": method, "options": small},
                      timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == answer and body["output"] == trace.output
    strip = [{k: v for k, v in s.to_dict().items() if k != "times"} for s in trace.steps]
    assert [{k: v for k, v in s.items() if k != "times"} for s in body["trace"]] == strip
    info = requests.get(ray_server.url + "/v1/info", timeout=10).json()
    assert info["model"]["device"] == "cpu" and info["model"]["dtype"] == "float32"


@pytest.mark.parametrize("body,status,field", BAD_SEARCH, ids=range(len(BAD_SEARCH)))
def test_ray_serve_bad_search_input(ray_server, body, status, field):
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    assert_error(post(ray_server, "/v1/search", body), status, field)


@pytest.mark.parametrize("body,status,field", BAD_ANSWER, ids=range(len(BAD_ANSWER)))
def test_ray_serve_bad_answer_input(ray_server, body, status, field):
    assert_error(post(ray_server, "/v1/answer", body), status, field)


def test_ray_serve_partial_must_be_boolean_and_paths_as_local(ray_server):
    assert_error(post(ray_server, "/v1/search", {"query": "a", "partial": "yes"}), 400, "partial")
    assert_error(post(ray_server, "/v1/search", b'{"query": "a"}', headers={"Content-Type": "text/plain"}), 415,
                 "Content-Type")
    assert_error(requests.get(ray_server.url + "/v1/nothing", timeout=10), 404)
    r = requests.get(ray_server.url + "/v1/search", timeout=10)
    assert_error(r, 405)
    assert "POST" in r.headers["Allow"]
    page = requests.get(ray_server.url + "/", timeout=10)
    assert page.status_code == 200 and 'id="search-form"' in page.text


def test_ray_serve_dead_replica_is_503_or_partial_then_recovers(ray_cluster, ray_server, local):
    import ray

    from ragserve.distributed.shards import NAMESPACE

    plan = requests.get(ray_server.url + "/v1/info", timeout=10).json()["backend"]["ray"]["groups"]
    actor = ray.get_actor(f"ragserve-{ray_server.port}/group-1", namespace=NAMESPACE)
    pid = ray.get(actor.info.remote())["pid"]
    q = "school uniforms improve discipline"
    os.kill(pid, signal.SIGKILL)
    r = post(ray_server, "/v1/search", {"query": q, "k": 5})
    err = assert_error(r, 503)
    assert err["code"] == "shards_unavailable" and "partial" in err["message"]
    assert all(str(s) in err["message"] for s in plan[1])
    body = post(ray_server, "/v1/search", {"query": q, "k": 5, "partial": True}).json()
    if body["missing_shards"]:  # still restarting: the other shards' exact top-5, the missing ones named
        assert body["missing_shards"] == plan[1]
        want = _partial_expected(local, q, 5, set(plan[1]))
        assert [(h["id"], h["docid"], h["score"]) for h in body["hits"]] == want

    def back() -> bool:
        r = post(ray_server, "/v1/search", {"query": q, "k": 5})
        return r.status_code == 200 and [(h["id"], h["docid"], h["score"]) for h in r.json()["hits"]] == \
            _keys(local.search(q, k=5))

    assert wait_until(back, 240, interval=0.5)
    assert ray.get(actor.info.remote())["pid"] != pid


def test_local_server_accepts_partial_and_misses_nothing(small_index, local):
    from ragserve.server.app import create_app
    from ragserve.server.config import ServerConfig

    client = create_app(local, ServerConfig()).test_client()
    r = client.post("/v1/search", json={"query": "wind farms", "k": 4, "partial": True})
    assert r.status_code == 200 and r.json["missing_shards"] == []
    assert [(h["id"], h["docid"], h["score"]) for h in r.json["hits"]] == _keys(local.search("wind farms", k=4))
    assert "missing_shards" not in client.post("/v1/search", json={"query": "wind farms"}).json
