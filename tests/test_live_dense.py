"""Dense and hybrid search on a live index (ragserve/retrieval/live_dense.py): after random adds, replaces and deletes
they rank as a fresh build of the final documents does, bit for bit, before and after a merge; a passage's vector
does not depend on what it is embedded with; an acknowledged add survives SIGKILL with its vector; the server and
the CLI take writes on an index with a dense part (the CLI with the real all-MiniLM-L6-v2)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from indexer.readers import iter_documents
from indexer.readers.model import Document
from indexer.segments import LiveIndex, LiveIndexError, MergePolicy, is_live
from indexer.options import BuildOptions
from indexer.writer import build_index_from_documents
from ragserve.retrieval.dense import DenseIndex, DenseSearcher, FaissOptions, build_dense_index, flat_topk, passage_text
from ragserve.retrieval.embedder import Embedder
from ragserve.retrieval.hybrid import FusionOptions, HybridSearcher
from ragserve.retrieval.live import LiveSearcher
from ragserve.retrieval.live_dense import LiveDenseSearcher, LiveHybridSearcher
from ragserve.retrieval.searcher import Searcher
from tests.conftest import shared

faiss = pytest.importorskip("faiss")
OPTS = BuildOptions(block_size=1 << 8, bank_bytes=1 << 20, progress=False, workers=1)
FUSIONS = (FusionOptions(method="rrf", depth=40), FusionOptions(method="linear", alpha=0.3, depth=40))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny encoder's ops are too small to split: on a busy 2-core machine two threads made each call 10x
    slower. (A vector's bits do not depend on the thread count: measured on MiniLM, 1 and 2 threads alike.)"""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def passages() -> list[Document]:
    """800 ArguAna passages cut to at most 60 words (embedding stays cheap; lengths vary)."""
    rng = random.Random(5)
    out = []
    for d in iter_documents([shared("beir-arguana", "corpus.jsonl.gz")]):
        out.append(Document(d.id, d.title, " ".join(d.text.split()[:rng.randint(4, 60)])))
        if len(out) == 800:
            break
    return out


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory, passages) -> Path:
    from tools.tiny_models import build_tiny_sentence_encoder

    return build_tiny_sentence_encoder(tmp_path_factory.mktemp("enc") / "tiny-encoder", [d.text for d in passages])


@pytest.fixture(scope="module")
def tiny(tiny_encoder) -> Embedder:
    return Embedder(tiny_encoder, device="cpu", batch_size=16)


def _index(docs: list[Document], out: Path, embedder: Embedder, kind: str = "flat") -> Path:
    build_index_from_documents(docs, out, OPTS)
    build_dense_index(out, embedder, FaissOptions(kind=kind))
    return out


def _ranked(hits) -> list[tuple]:
    """Parity: id, score bits (f32 for dense, f64 for fused scores) and docid (the tie order) of every hit."""
    return [(h.id, np.float64(h.score).tobytes(), h.docid) for h in hits]


def test_a_passage_vector_does_not_depend_on_its_batch(tiny, passages):
    """``Embedder.encode`` batches only texts of one token count: each text's vector is the bits it gets alone,
    whatever the order, the batch size or the other texts (a padded batch is what made them differ)."""
    texts = [passage_text(d.title, d.text) for d in passages[:120]]
    alone = np.stack([tiny.encode([t])[0] for t in texts])
    for seed in range(3):
        order = random.Random(seed).sample(range(len(texts)), len(texts))
        got = tiny.encode([texts[i] for i in order])
        assert np.array_equal(got.view(np.uint32), alone[order].view(np.uint32))
    lengths = {len(tiny.tokenizer(t)["input_ids"]) for t in texts}
    assert len(lengths) > 20  # many lengths: batches of many sizes were made


def test_flat_scores_do_not_depend_on_the_partition(tiny, passages):
    """``flat_topk`` (faiss's per-pair path) scores a row alike in one index and in any split of it, deleted rows
    left out by a selector; ties at the cut go to the smaller row."""
    from ragserve.retrieval.dense import live_selector

    v = tiny.encode([passage_text(d.title, d.text) for d in passages]).astype(np.float16).astype(np.float32)
    v = np.vstack([v, v[:50]])  # duplicates: exact ties
    q = tiny.encode([d.title for d in passages[:40]])
    whole = faiss.IndexFlatIP(v.shape[1])
    whole.add(v)
    want = flat_topk(whole, q, 60)
    cuts = [0, 1, 333, 334, 850]
    got = [[] for _ in q]
    for a, b in zip(cuts, cuts[1:]):
        part = faiss.IndexFlatIP(v.shape[1])
        part.add(v[a:b])
        for i, t in enumerate(flat_topk(part, q, 60)):
            got[i].append((t.docids + a, t.scores))
    dead = np.arange(0, 850, 7)
    sel = flat_topk(whole, q, 60, live_selector(dead, 850))
    for i, w in enumerate(want):
        d = np.concatenate([g[0] for g in got[i]])
        s = np.concatenate([g[1] for g in got[i]])
        o = np.lexsort((d, -s))[:60]
        assert np.array_equal(d[o], w.docids) and np.array_equal(s[o].view(np.uint32), w.scores.view(np.uint32))
        assert not np.isin(sel[i].docids, dead).any()
        keep = ~np.isin(w.docids, dead)
        n = int(keep.sum())
        assert np.array_equal(sel[i].docids[:n], w.docids[keep]) and np.array_equal(sel[i].scores[:n], w.scores[keep])


def _random_writes(live: LiveIndex, pool: list[Document], cur: OrderedDict, n_ops: int, seed: int) -> None:
    """Interleaved adds, replaces (of an old id, or with an identical passage: tied vectors) and deletes in requests
    of 1-12, refreshes and policy merges between them; ``cur`` mirrors the live documents in last-written order."""
    rng = random.Random(seed)
    done, fresh_id = 0, 0
    while done < n_ops:
        ops = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            d = rng.choice(pool)
            if r < 0.4 or not cur:
                i = f"new-{fresh_id}"
                fresh_id += 1
            elif r < 0.7:
                i = rng.choice(list(cur))
            else:
                i = rng.choice(list(cur))
                ops.append(("delete", i))
                cur.pop(i)
                continue
            ops.append(("add", Document(i, d.title, d.text)))
            cur.pop(i, None)
            cur[i] = (d.title, d.text)
        live.apply(ops)
        done += len(ops)
        if rng.random() < 0.2:
            live.refresh()
            live.maybe_merge()
    live.refresh()


def test_random_writes_dense_and_hybrid_equal_a_fresh_build(tmp_path, tiny, passages):
    """300 adds, replaces and deletes on an index with a flat dense part: dense and hybrid (RRF, linear) top-30 of
    60 queries rank the same ids, score bits and order as a fresh build (`ragserve index` + dense part over the
    final documents in last-written order) before and after a full merge; the BM25 side of hybrid on fpga-sim and
    on the gpu backend (torch's CPU device) too."""
    idx = _index(passages[:500], tmp_path / "idx", tiny)
    live = LiveIndex(idx, policy=MergePolicy(max_segments=4, merge_factor=2))
    assert is_live(idx) and live.settings["dense"]["kind"] == "flat" and not (idx / "dense").exists()
    cur = OrderedDict((d.id, (d.title, d.text)) for d in passages[:500])
    _random_writes(live, passages, cur, 300, seed=34)
    snap = live.snapshot()
    assert len(snap.segments) > 1 and any(s.deleted.size for s in snap.segments)
    assert [d[0] for d in snap.documents()] == list(cur)
    fresh = _index([Document(i, *v) for i, v in cur.items()], tmp_path / "fresh", tiny)
    queries = [" ".join(d.text.split()[:6]) or d.title for d in passages[::13]]
    fd = DenseSearcher(fresh, tiny)
    ld = LiveDenseSearcher(live, tiny)
    want_dense = [_ranked(h) for h in fd.search_batch(queries, k=30, with_text=False)]
    fresh_h = {(be, f.method): HybridSearcher(Searcher(fresh, backend=be, **o), fd, f)
               for be, o in (("cpu", {"threads": 1}), ("fpga-sim", {}), ("gpu", {"device": "cpu"})) for f in FUSIONS}
    want_h = {key: [_ranked(h) for h in s.search_batch(queries, k=30, with_text=False)] for key, s in fresh_h.items()}
    live_h = {(be, f.method): LiveHybridSearcher(LiveSearcher(live, backend=be, **o), ld, f)
              for be, o in (("cpu", {"threads": 1}), ("fpga-sim", {}), ("gpu", {"device": "cpu"})) for f in FUSIONS}
    for when in ("before", "after"):
        assert [_ranked(h) for h in ld.search_batch(queries, k=30, with_text=False)] == want_dense, when
        for key, s in live_h.items():
            assert [_ranked(h) for h in s.search_batch(queries, k=30, with_text=False)] == want_h[key], (when, key)
        live.force_merge()
        assert len(live.snapshot().segments) == 1
    hit = ld.search_batch(queries[:1], k=1)[0][0]
    assert (hit.title, hit.text) == cur[hit.id]
    # The merged segment's vectors are the fresh build's, row for row.
    merged = DenseIndex(live.snapshot().segments[0].reader).embeddings
    assert np.array_equal(np.asarray(merged).view(np.uint16), np.asarray(DenseIndex(fd.index).embeddings).view(np.uint16))
    for s in (*fresh_h.values(), *live_h.values()):
        s.bm25.close()
    live.close()


def test_approximate_or_old_dense_parts_refuse_writes(tmp_path, tiny, passages):
    """An hnsw dense part (or one embedded in padded batches by an older ragserve) cannot be kept exact: the first
    write is refused with one line naming the fix, and the index is left plain."""
    idx = _index(passages[:300], tmp_path / "hnsw", tiny, kind="hnsw")
    with pytest.raises(LiveIndexError, match="writes need the exact kind 'flat'"):
        LiveIndex(idx)
    assert not is_live(idx) and (idx / "dense" / "faiss.index").is_file()
    old = _index(passages[:50], tmp_path / "old", tiny)
    m = json.loads((old / "dense" / "manifest.json").read_text())
    del m["embedding"]
    (old / "dense" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LiveIndexError, match="padded batches"):
        LiveIndex(old)


def _writer_child(root: Path, fd: int) -> None:
    out = os.fdopen(fd, "w", buffering=1)
    live = LiveIndex(root)
    live.add([Document("acked", "Kill", "an acknowledged passage about quokkas on Rottnest island")])
    out.write("ACK\n")
    time.sleep(600)


def test_sigkill_after_an_acknowledged_add_keeps_its_vector(tmp_path, tiny, passages):
    """A writer acknowledges an add (logged, not yet refreshed: no vector yet) and is killed with SIGKILL; the index
    reopens with the document and its vector, the bits a fresh embedding of the passage gives."""
    root = _index(passages[:40], tmp_path / "idx", tiny)
    LiveIndex(root).close()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _writer_child(root, w)
        finally:
            os._exit(0)
    os.close(w)
    buf = b""
    deadline = time.monotonic() + 120
    while b"ACK" not in buf and time.monotonic() < deadline:
        chunk = os.read(r, 100)
        if not chunk:
            break
        buf += chunk
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(r)
    assert b"ACK" in buf
    live = LiveIndex(root)  # replays the log: the refresh embeds the passage
    snap = live.snapshot()
    docid = [d[0] for d in snap.documents()].index("acked")
    seg, local = snap.locate(docid)
    vec = DenseIndex(seg.reader).embeddings[local]
    want = tiny.encode([passage_text("Kill", "an acknowledged passage about quokkas on Rottnest island")])[0]
    assert np.array_equal(np.asarray(vec).view(np.uint16), want.astype(np.float16).view(np.uint16))
    ld = LiveDenseSearcher(live, tiny)
    assert ld.search("quokkas on Rottnest island", k=1, with_text=False)[0].id == "acked"
    live.close()


def test_server_writes_and_dense_hybrid_search(tmp_path, tiny_encoder, tiny, passages):
    """POST /v1/documents on a server whose index has a dense part: after the refresh, /v1/search with retriever
    dense and hybrid finds the new passage; a delete takes it out of both."""
    from ragserve.retrieval.factory import RetrievalConfig, RetrieverSet
    from ragserve.server.app import create_app
    from ragserve.server.config import ServerConfig
    from ragserve.server.documents import LiveWrites

    idx = _index(passages[:100], tmp_path / "idx", tiny)
    live = LiveIndex(idx)
    rs = RetrieverSet.open(live, RetrievalConfig(retriever="hybrid", backend_options={"threads": 1},
                                                 dense_model=str(tiny_encoder), embed_device="cpu"))
    client = create_app(rs, ServerConfig(), writes=LiveWrites(live, 1.0)).test_client()
    text = "zanzibarian quokka selfies on the beach"
    r = client.post("/v1/documents", json={"documents": [{"id": "q1", "title": "Quokka", "text": text}],
                                           "refresh": True})
    assert r.status_code == 200 and r.get_json()["searchable"] == "now", r.get_json()
    for name in ("dense", "hybrid"):
        hits = client.post("/v1/search", json={"query": f"Quokka {text}", "k": 3, "retriever": name}).get_json()["hits"]
        assert hits[0]["id"] == "q1" and hits[0]["text"] == text, (name, hits)
    r = client.delete("/v1/documents", json={"ids": ["q1"], "refresh": True})
    assert r.get_json()["deleted"] == 1
    for name in ("dense", "hybrid"):
        hits = client.post("/v1/search", json={"query": f"Quokka {text}", "k": 100, "retriever": name}).get_json()["hits"]
        assert "q1" not in {h["id"] for h in hits} and len(hits) == 100
    rs.close()
    live.close()


def _ragserve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ragserve", *args], capture_output=True, text=True, timeout=600)


def test_cli_add_with_the_real_encoder_equals_a_fresh_build(tmp_path, minilm):
    """The real path: `ragserve add` (new passages and a replace) on an index with an all-MiniLM-L6-v2 dense part
    embeds with the encoder the dense part records; after deletes, dense and hybrid search (``open_retriever``, as
    `ragserve search` opens it) equal a fresh build, before and after `ragserve merge`."""
    sample = shared("wiki18-100w-passages-sample", "sample_data.jsonl")
    docs = [d for _, d in zip(range(46), iter_documents([sample]))]
    idx = _index(docs[:40], tmp_path / "idx", minilm)
    new = tmp_path / "new.jsonl"
    writes = [(f"x{i}", d.title, d.text) for i, d in enumerate(docs[40:])] + [(docs[3].id, "Replaced", docs[44].text)]
    new.write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in writes))
    p = _ragserve("add", str(new), "--index", str(idx))
    assert p.returncode == 0, p.stderr
    live = LiveIndex(idx)  # deletes run no model: in process
    assert live.delete([docs[7].id, "x2"]).deleted == 2
    live.close()
    cur = OrderedDict((d.id, (d.title, d.text)) for d in docs[:40])
    for i, t, x in writes:
        cur.pop(i, None)
        cur[i] = (t, x)
    cur.pop(docs[7].id)
    cur.pop("x2")
    fresh = _index([Document(i, *v) for i, v in cur.items()], tmp_path / "fresh", minilm)
    queries = [docs[44].text[:80], "who wrote the national anthem", " ".join(docs[41].text.split()[:5])]
    want = {"dense": DenseSearcher(fresh, minilm),
            "hybrid": HybridSearcher(Searcher(fresh, threads=1), DenseSearcher(fresh, minilm))}
    want = {n: [[(h.id, h.score) for h in hits] for hits in s.search_batch(queries, k=10, with_text=False)]
            for n, s in want.items()}
    from ragserve.retrieval.factory import RetrievalConfig, open_retriever

    for step in ("before", "after"):
        for name in ("dense", "hybrid"):
            s = open_retriever(idx, RetrievalConfig(retriever=name, backend_options={"threads": 1},
                                                    embed_device="cpu"))
            got = [[(h.id, h.score) for h in hits] for hits in s.search_batch(queries, k=10, with_text=False)]
            s.close()
            assert got == want[name], (step, name)
        if step == "before":
            p = _ragserve("merge", "--index", str(idx))
            assert p.returncode == 0 and "in 1 segment(s)" in p.stdout, p.stderr
