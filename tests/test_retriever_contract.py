"""Every registered backend and every retriever through the one retrieval contract (``ragserve.retrieval.contract``).

One index (300 Wikipedia passages, several blocks and shards, with a dense part of the real all-MiniLM-L6-v2), one
set of checks for all: the result's shape and order, ``search`` = ``search_batch``, the same answer twice, the
declared k limit honoured (k = max_k answers, max_k + 1 is a ``SearchError``), bad k, queries, k1 and b refused
with a ``SearchError``, and, where a retriever promises exactness, the cpu ``Searcher``'s ids and score bits (at
the index's k1 and b and at others). The live index's searcher runs over the same passages written in pieces
among documents later replaced or deleted (several segments, tombstones): exact too, against the fresh build. A
retriever class that is not run here fails the coverage check.
"""
from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest
import torch

import ragserve
from ragserve.kernels.contract import MAX_K, SearchError
from ragserve.kernels.registry import backend_names, get_backend_class
from ragserve.retrieval.contract import Hit, Retriever
from ragserve.retrieval.searcher import Searcher
from tests import rag_support as S
from tests.conftest import shared, stored_vectors

# The distributed searcher joins the session's Ray cluster: one worker, one cluster (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("ray")

QUERIES = ["who wrote the declaration of independence", "largest city in the united states", "the river nile"]
# What a backend needs to run on this machine without its device (the gpu kernels on torch's CPU device).
BACKEND_OPTIONS = {"gpu": {} if torch.cuda.is_available() else {"device": "cpu"}}


@pytest.fixture(scope="module")
def index(tmp_path_factory, minilm, wiki300_dense):
    from indexer.options import BuildOptions
    from indexer.writer import build_index
    from ragserve.retrieval.dense import build_dense_index

    d = tmp_path_factory.mktemp("contract")
    corpus = d / "wiki300.jsonl"
    with open(shared("wiki18-100w-passages-sample", "sample_data.jsonl"), encoding="utf-8") as f:
        corpus.write_text("".join(line for _, line in zip(range(300), f)), encoding="utf-8")
    out = d / "index"
    build_index([corpus], out, BuildOptions(block_size=1 << 6, bank_bytes=160 << 10, progress=False, workers=1))
    # the same 300 passages as the session's wiki300_dense: its vectors, not a second pass of the encoder
    build_dense_index(out, minilm, embed=stored_vectors(wiki300_dense))
    return out


@pytest.fixture(scope="module")
def live_index(index):
    """``index``'s 300 passages written to a live index 60 at a time, each batch with copies of passages (deleted at
    the end) and a draft of the next batch's first passage (replaced by it), then refreshed: six segments with
    tombstones whose live documents, in last-written order, are ``index``'s, so ``index`` is their fresh build."""
    from indexer.readers import iter_documents
    from indexer.readers.model import Document
    from indexer.segments import LiveIndex, MergePolicy, default_settings

    docs = list(iter_documents([index.parent / "wiki300.jsonl"]))
    path = index.parent / "live"
    settings = {**default_settings(), "block_size": 1 << 6, "bank_bytes": 160 << 10}
    live = LiveIndex(path, create=True, settings=settings, policy=MergePolicy(max_segments=100))
    gone = []
    for at in range(0, len(docs), 60):
        ops = [("add", d) for d in docs[at:at + 60]]
        for j in range(at, at + 60, 6):  # the same text under another id: ties that only the tombstone breaks
            gone.append(f"copy-{j}")
            ops.append(("add", Document(gone[-1], docs[j].title, docs[j].text)))
        if at + 60 < len(docs):
            ops.append(("add", Document(docs[at + 60].id, docs[at + 60].title, "a draft of the river nile")))
        live.apply(ops)
        live.refresh()
    live.apply([("delete", i) for i in gone])
    snap = live.refresh()
    assert [d[0] for d in snap.documents()] == [d.id for d in docs]
    assert len(snap.segments) > 1 and all(s.deleted.size for s in snap.segments)
    live.close()
    return path


@pytest.fixture(scope="module")
def live_dense_index(index, minilm):
    """``index`` (with its dense part) turned live, then written to: copies of 12 passages added (embedded by the
    refresh) and deleted again, so two segments, tombstones, and the live documents ``index``'s in its order."""
    import shutil

    from indexer.readers.model import Document
    from indexer.segments import LiveIndex
    from ragserve.retrieval.live_dense import DenseSegmentWriter

    path = shutil.copytree(index, index.parent / "live-dense")
    live = LiveIndex(path)
    live._dense = DenseSegmentWriter(live.settings["dense"], embedder=minilm)  # the session's encoder, loaded once
    snap = live.snapshot()
    live.add([Document(f"copy-{i}", *snap.document(i)) for i in range(0, 300, 25)])
    live.refresh()
    live.delete([f"copy-{i}" for i in range(0, 300, 25)])
    assert len(live.refresh().segments) == 2
    live.close()
    return path


@pytest.fixture(scope="module")
def reference(index):
    s = Searcher(index, backend="cpu")
    yield s
    s.close()


def _bm25(index, backend):
    return lambda: Searcher(index, backend=backend, **BACKEND_OPTIONS.get(backend, {}))


def _live(path, backend):
    def open_():
        from indexer.segments import LiveIndex
        from ragserve.retrieval.live import LiveSearcher

        return LiveSearcher(LiveIndex(path, writable=False), backend=backend)
    return open_


def _live_dense(path, minilm, hybrid: bool):
    def open_():
        from indexer.segments import LiveIndex
        from ragserve.retrieval.live import LiveSearcher
        from ragserve.retrieval.live_dense import LiveDenseSearcher, LiveHybridSearcher

        dense = LiveDenseSearcher(LiveIndex(path, writable=False), minilm, owns_live=True)
        return LiveHybridSearcher(LiveSearcher(dense.live), dense) if hybrid else dense
    return open_


@pytest.fixture(scope="module")
def factories(index, live_index, live_dense_index, minilm, request):
    """name -> a function opening that retriever over ``index`` (opened lazily: a failing one fails its own test)."""
    from ragserve.memory.reader import MemoryContext, MemoryOptions
    from ragserve.retrieval.dense import DenseSearcher
    from ragserve.retrieval.factory import RetrieverSet
    from ragserve.retrieval.hybrid import HybridSearcher
    from ragserve.retrieval.rerank import CrossEncoder, RerankingSearcher

    def distributed():
        from ragserve.distributed.shards import DistributedSearcher

        return DistributedSearcher(index, ray=request.getfixturevalue("ray_cluster"), groups=2, timeout_s=120)

    def memory():
        from indexer.reader import IndexReader

        m = MemoryContext(minilm, MemoryOptions(segment_tokens=64))
        reader = IndexReader(index)
        m.read([reader.document(i) for i in range(40)])
        return m

    out = {f"bm25-{b}": _bm25(index, b) for b in backend_names()}
    out.update({
        "bm25-ray": distributed,
        "dense-cpu": lambda: DenseSearcher(index, minilm, backend="cpu"),
        "dense-gpu": lambda: DenseSearcher(index, minilm, backend="gpu", device=None if torch.cuda.is_available()
                                           else "cpu"),
        "hybrid": lambda: HybridSearcher(Searcher(index), DenseSearcher(index, minilm)),
        "rerank": lambda: RerankingSearcher(Searcher(index), CrossEncoder(str(S.tiny_cross_encoder()), device="cpu"),
                                            depth=20),
        "memory": memory,
        "set": lambda: RetrieverSet(Searcher(index), DenseSearcher(index, minilm), default="hybrid"),
        "live-cpu": _live(live_index, "cpu"),
        "live-fpga-sim": _live(live_index, "fpga-sim"),
        "live-dense": _live_dense(live_dense_index, minilm, hybrid=False),
        "live-hybrid": _live_dense(live_dense_index, minilm, hybrid=True),
    })
    return out


NAMES = ([f"bm25-{b}" for b in backend_names()]
         + ["bm25-ray", "dense-cpu", "dense-gpu", "hybrid", "rerank", "memory", "set", "live-cpu", "live-fpga-sim",
            "live-dense", "live-hybrid"])


def _backend_of(name: str) -> str | None:
    """The registered backend a BM25 retriever of the test runs on (None: not one backend's)."""
    if name.startswith(("bm25-", "live-")) and name not in ("bm25-ray", "live-dense", "live-hybrid"):
        return name.split("-", 1)[1]
    return None


def _open(factories, name):
    backend = _backend_of(name)
    if backend is not None and backend not in BACKEND_OPTIONS:
        ok, why = get_backend_class(backend).is_available()
        if not ok:  # a backend that cannot run here says so with a typed error, never a wrong answer
            with pytest.raises(SearchError):
                factories[name]()
            pytest.skip(f"{backend}: {why}")
    return factories[name]()


def _bits(hits: list[Hit]) -> list[tuple]:
    """Ids and scores; float equality of scores read from f32 (or f64) is equality of their bits."""
    return [(h.docid, h.id, h.score) for h in hits]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_retriever_contract(name, factories, reference):
    r = _open(factories, name)
    try:
        assert isinstance(r, Retriever)
        # -- answers: one best-first list per query, at most k, the same through search and twice over
        batch = r.search_batch(QUERIES, k=7)
        assert len(batch) == len(QUERIES)
        for q, hits in zip(QUERIES, batch):
            assert 1 <= len(hits) <= 7 and all(isinstance(h, Hit) for h in hits)
            scores = [h.score for h in hits]
            assert scores == sorted(scores, reverse=True), scores
            assert len({h.docid for h in hits}) == len(hits)
            assert all(h.text for h in hits)
            alone = r.search(q, k=7)
            if r.exact:  # one query alone or in a batch: the same bits
                assert _bits(alone) == _bits(hits)
            else:  # an encoder pads a batch to its longest text, which moves the last bits of an embedding
                assert [h.docid for h in alone] == [h.docid for h in hits]
                np.testing.assert_allclose([h.score for h in alone], scores, rtol=0, atol=1e-5)
        assert [_bits(h) for h in r.search_batch(QUERIES, k=7)] == [_bits(h) for h in batch]  # the same call twice
        assert all(not h.text for h in r.search(QUERIES[0], k=3, with_text=False))
        assert r.search_batch([], k=3) == []
        if name.startswith("live-") and name != "live-cpu" and name != "live-fpga-sim":  # the fresh build's bits
            fresh = factories[name.replace("live-", "").replace("dense", "dense-cpu")]()
            assert [_bits(h) for h in batch] == [_bits(h) for h in fresh.search_batch(QUERIES, k=7)]
            fresh.close()
        # -- exactness where promised: the cpu searcher's ids and score bits, at other k1 and b too
        if r.exact:
            assert [_bits(h) for h in batch] == [_bits(h) for h in reference.search_batch(QUERIES, k=7)]
            assert (_bits(r.search(QUERIES[1], k=5, k1=1.2, b=0.75))
                    == _bits(reference.search(QUERIES[1], k=5, k1=1.2, b=0.75)))
        # -- the declared limit: max_k answers, one more is refused before any work
        assert 1 <= r.max_k <= MAX_K
        if _backend_of(name) is not None:  # a backend's retriever declares the backend's own limit
            assert r.max_k == min(MAX_K, get_backend_class(_backend_of(name)).max_k)
        assert len(r.search(QUERIES[2], k=r.max_k, with_text=False)) >= 1
        with pytest.raises(SearchError, match=f"between 1 and {r.max_k}"):
            r.search(QUERIES[2], k=r.max_k + 1)
        # -- bad input: typed errors
        for bad_k in (0, -3, True, 2.5, "7"):
            with pytest.raises(SearchError):
                r.search_batch(QUERIES[:1], k=bad_k)
        for bad in ([""], ["  "], [3], "a string, not a list", None):
            with pytest.raises(SearchError):
                r.search_batch(bad, k=3)
        if r.takes_bm25_params:
            with pytest.raises(SearchError):
                r.search(QUERIES[0], k=3, k1=-1.0)
            with pytest.raises(SearchError):
                r.search(QUERIES[0], k=3, b=1.5)
        else:
            with pytest.raises(SearchError, match="BM25 parameters"):
                r.search(QUERIES[0], k=3, k1=1.2)
    finally:
        r.close()


def test_every_retriever_class_is_in_the_contract_test(factories):
    """Each ``Retriever`` subclass in the package is one that ``test_retriever_contract`` opens."""
    for mod in pkgutil.walk_packages(ragserve.__path__, "ragserve."):
        if mod.name.endswith("__main__") or mod.name.startswith(("ragserve.kernels.gpu", "ragserve.attention")):
            continue  # the CLI's entry point; no retrievers in the others, some need a GPU toolchain to import
        try:
            importlib.import_module(mod.name)
        except ImportError:
            continue

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    covered = {"Searcher", "DistributedSearcher", "DenseSearcher", "HybridSearcher", "RerankingSearcher",
               "MemoryContext", "RetrieverSet", "LiveSearcher", "LiveDenseSearcher", "LiveHybridSearcher"}
    assert {c.__name__ for c in subclasses(Retriever)} == covered


def test_every_registered_backend_declares_a_k_limit():
    for name in backend_names():
        cls = get_backend_class(name)
        assert 1 <= cls.max_k <= MAX_K, name
    assert get_backend_class("fpga-sim").max_k == get_backend_class("fpga").max_k == 1024
