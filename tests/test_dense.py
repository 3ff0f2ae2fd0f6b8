"""Dense and hybrid retrieval with the real all-MiniLM-L6-v2: the encoder against sentence-transformers, the GPU
kernel path (on torch's CPU device) against faiss exact inner-product search, fusion against a brute-force
reference, the bi-encoder reranker, atomic dense builds, and one clear error for each bad input."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from indexer.reader import IndexReader
from ragserve.kernels.contract import SearchError
from ragserve.kernels.cpu import relevancy as cpu_rel
from ragserve.kernels.cpu import selection as cpu_sel
from ragserve.kernels.gpu.ip_topk import IpTopkTuning, ip_topk
from ragserve.retrieval.dense import (DENSE_DIR, DenseIndex, DenseIndexError, DenseOptions, DenseSearcher,
                                      FaissOptions, build_dense_index, passage_text)
from ragserve.retrieval.embedder import Embedder, EmbedderError, read_encoder_config
from ragserve.retrieval.hybrid import FusionOptions, HybridSearcher, fuse
from ragserve.retrieval.searcher import Searcher
from tests.conftest import shared, stored_vectors

faiss = pytest.importorskip("faiss")


def nq_questions(n: int) -> list[str]:
    from ragserve.topics import read_queries

    return [q.text for q in read_queries(shared("nq-open", "topics.dpr.nq.test.txt"))[:n]]


def same_modulo_ties(a_ids, a_scores, b_ids, b_scores, tol: float) -> None:
    """Equal id lists, except that ids whose scores are within ``tol`` of each other may trade places (and the
    group cut by the end of the list may hold different members)."""
    assert len(a_ids) == len(b_ids)
    np.testing.assert_allclose(a_scores, b_scores, rtol=0, atol=tol)
    i = 0
    while i < len(a_ids):
        j = i + 1
        while j < len(a_ids) and abs(a_scores[j] - a_scores[i]) <= tol:
            j += 1
        if j < len(a_ids):
            assert sorted(a_ids[i:j]) == sorted(b_ids[i:j]), (i, a_ids[i:j], b_ids[i:j])
        i = j


# -- the encoder --------------------------------------------------------------------------------
def test_embedder_matches_sentence_transformers(minilm, minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    texts = ["what is the capital of france", "", "Paris is the capital and most populous city of France. " * 40,
             "Ünïcödé text, with punctuation!?", "a"]
    ours = minilm.encode(texts)
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts)
    assert ours.shape == (5, 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert minilm.info.pooling == "mean" and minilm.info.normalize and minilm.info.max_seq_length == 256
    # batching by length must not change a text's embedding
    one_by_one = np.stack([minilm.encode([t])[0] for t in texts])
    np.testing.assert_allclose(ours, one_by_one, atol=1e-5)


def test_not_a_sentence_encoder_is_one_clear_error(tmp_path, minilm_dir):
    with pytest.raises(EmbedderError, match="^no model directory at "):
        read_encoder_config(tmp_path / "missing")
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(EmbedderError, match="is not a sentence encoder") as e:
        Embedder(tmp_path / "lm", device="cpu")
    assert "\n" not in str(e.value)
    bad = tmp_path / "nopool"
    shutil.copytree(minilm_dir, bad)
    (bad / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "",
                                                   "type": "sentence_transformers.models.Transformer"}]))
    with pytest.raises(EmbedderError, match="a Transformer and a Pooling module are needed"):
        read_encoder_config(bad)


# -- exactness: the GPU kernel path against faiss exact search ----------------------------------------
def test_gpu_path_equals_faiss_exact_on_real_embeddings(wiki300_dense, minilm):
    cpu = DenseSearcher(wiki300_dense, minilm, backend="cpu")
    gpu = DenseSearcher(wiki300_dense, minilm, backend="gpu", device="cpu",
                        options=DenseOptions(chunk_score_bytes=40_000))  # several chunks of 300 passages
    qv = minilm.encode(nq_questions(60))
    for k in (1, 10, 300):
        a, b = cpu.search_vectors(qv, k), gpu.search_vectors(qv, k)
        for x, y in zip(a, b):
            same_modulo_ties(x.docids.tolist(), x.scores, y.docids.tolist(), y.scores, tol=2e-6)
    # and the whole ranking is the inner product of the stored fp16 embeddings, ties by docid
    emb = DenseIndex(IndexReader(wiki300_dense)).embeddings.astype(np.float32)
    ref_i, ref_v = cpu_sel.topk_rows(cpu_rel.inner_product(qv, emb), 300)
    for r, y in enumerate(gpu.search_vectors(qv, 300)):
        same_modulo_ties(y.docids.tolist(), y.scores, ref_i[r].tolist(), ref_v[r], tol=1e-6)


def test_chunked_ip_topk_equals_faiss_flat_at_scale():
    """60K fp16 unit vectors (some duplicated, so exact ties cross chunk boundaries) against faiss IndexFlatIP."""
    rng = np.random.default_rng(7)
    keys = rng.standard_normal((60_000, 64)).astype(np.float32)
    keys[::997] = keys[5]  # duplicates of one key all over the matrix
    keys = (keys / np.linalg.norm(keys, axis=1, keepdims=True)).astype(np.float16)
    q = rng.standard_normal((12, 64)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)  # unit vectors, as the encoder gives
    q[3] = keys[5]  # a query whose best keys are the duplicates
    index = faiss.IndexFlatIP(64)
    index.add(keys.astype(np.float32))
    for k in (1, 50, 100):
        fs, fi = index.search(q, k)
        gi, gv = ip_topk(torch.from_numpy(q), torch.from_numpy(keys), k, IpTopkTuning(chunk_score_bytes=1 << 20))
        for r in range(len(q)):
            same_modulo_ties(gi[r].tolist(), gv[r].numpy(), fi[r].tolist(), fs[r], tol=1e-6)
        # ties at the cut go to the smaller index, as the kernel library's row top-k rules
        ref_i, _ = cpu_sel.topk_rows(cpu_rel.inner_product(q, keys.astype(np.float32)), k)
        assert np.array_equal(gi[3].numpy(), ref_i[3])


# -- hybrid fusion against a brute-force reference ------------------------------------------------
def brute_fusion(full_bm25: list, full_dense: list, depth: int, k: int, opts: FusionOptions) -> list:
    """Fused ranking by the definition, one passage at a time over the full rankings."""
    score: dict[int, float] = {}
    for ranking, w in ((full_bm25, 1 - opts.alpha), (full_dense, opts.alpha)):
        top = ranking[:depth]
        if not top:
            continue
        lo, hi = min(s for _, s in top), max(s for _, s in top)
        for rank, (d, s) in enumerate(top, 1):
            if opts.method == "rrf":
                c = 1.0 / (opts.rrf_k + rank)
            else:
                c = w * ((s - lo) / (hi - lo) if hi > lo else 1.0)
            score[d] = score.get(d, 0.0) + c
    return sorted(score.items(), key=lambda x: (-x[1], x[0]))[:k]


@pytest.mark.parametrize("opts", [FusionOptions("rrf", depth=20), FusionOptions("rrf", rrf_k=0, depth=7),
                                  FusionOptions("linear", alpha=0.3, depth=20), FusionOptions("linear", alpha=1.0, depth=5)])
def test_hybrid_equals_brute_force_fusion(wiki300_dense, minilm, opts):
    bm25 = Searcher(wiki300_dense)
    dense = DenseSearcher(wiki300_dense, minilm, backend="gpu", device="cpu")
    hybrid = HybridSearcher(bm25, dense, opts)
    qs = nq_questions(25) + ["zzzqqq unmatched by bm25"]
    k = 10
    got = hybrid.search_batch(qs, k=k, with_text=False)
    # full rankings of every passage, the queries embedded in the same batch as the hybrid search did
    full_b = bm25.search_batch(qs, k=300, with_text=False)
    full_d = dense.search_batch(qs, k=300, with_text=False)
    for hits, fb, fd in zip(got, full_b, full_d):
        ref = brute_fusion([(h.docid, h.score) for h in fb], [(h.docid, h.score) for h in fd], max(opts.depth, k),
                           k, opts)
        assert [h.docid for h in hits] == [d for d, _ in ref]
        np.testing.assert_allclose([h.score for h in hits], [s for _, s in ref], rtol=1e-12)


def test_fuse_keeps_ties_by_docid_and_counts_missing_as_zero():
    a = (np.array([5, 3, 9]), np.array([3.0, 2.0, 1.0]))
    b = (np.array([3, 5]), np.array([0.9, 0.8]))
    ids, scores = fuse([a, b], [0.5, 0.5], 10, FusionOptions("rrf", rrf_k=1.0))
    assert ids.tolist() == [3, 5, 9]  # 3 and 5 tie at 1/2 + 1/3: the smaller docid first
    assert scores.tolist() == [1 / 2 + 1 / 3, 1 / 2 + 1 / 3, 1 / 4]
    ids, scores = fuse([a, b], [0.5, 0.5], 2, FusionOptions("linear"))  # min-max: a 1, .5, 0; b 1, 0
    assert ids.tolist() == [3, 5] and scores.tolist() == [0.25 + 0.5, 0.5 + 0.0]


# -- the bi-encoder reranker ---------------------------------------------------------------------
def test_bi_encoder_rerank_uses_the_model_with_or_without_stored_embeddings(wiki300_dense, minilm):
    from ragserve.retrieval.rerank import RerankingSearcher, load_reranker
    from ragserve.retrieval.rerank import BiEncoderReranker

    bm25 = Searcher(wiki300_dense)
    reader = IndexReader(wiki300_dense)
    stored = load_reranker(minilm.info.path, device="cpu", index=reader)
    assert isinstance(stored, BiEncoderReranker) and stored.stored is not None
    fresh = BiEncoderReranker(minilm)  # no index: embeds the hits' text
    q = "who won the football world cup"
    first = bm25.search(q, k=30)
    s_stored, s_fresh = stored.rescore(q, first), fresh.rescore(q, first)
    np.testing.assert_allclose(s_stored, s_fresh, atol=2e-3)  # fp16 storage of the passage vectors
    qv = minilm.encode([q])[0]
    pv = minilm.encode([passage_text(h.title, h.text) for h in first])
    np.testing.assert_allclose(s_fresh, pv @ qv, atol=1e-6)
    hits = RerankingSearcher(bm25, stored, depth=30).search(q, k=5)
    order = sorted(range(30), key=lambda i: (-s_stored[i], i))[:5]
    assert [h.docid for h in hits] == [first[i].docid for i in order]
    assert [h.score for h in hits] == pytest.approx([float(s_stored[i]) for i in order])


# -- building ---------------------------------------------------------------------------------------
def test_interrupted_dense_build_leaves_the_index_as_it_was(wiki300_dense, minilm, tmp_path):
    idx = tmp_path / "idx"
    shutil.copytree(wiki300_dense, idx)
    before = (idx / DENSE_DIR / "manifest.json").read_text()
    seen = []

    def interrupt(n: int) -> None:  # after the encoder's first batch: the build is under way, its folder made
        seen.append(n)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_dense_index(idx, minilm, overwrite=True, on_batch=interrupt)
    assert sorted(p.name for p in idx.iterdir() if p.name.startswith(".")) == []  # no partial directory left
    assert (idx / DENSE_DIR / "manifest.json").read_text() == before  # the previous dense part is intact
    DenseIndex(IndexReader(idx), verify=True)
    shutil.rmtree(idx / DENSE_DIR)
    with pytest.raises(KeyboardInterrupt):
        build_dense_index(idx, minilm, on_batch=interrupt)
    assert not (idx / DENSE_DIR).exists()
    assert len(seen) == 2 and max(seen) < 300  # each build stopped part way through its passages
    assert IndexReader(idx, verify=True).num_docs == 300  # the BM25 index still opens
    with pytest.raises(DenseIndexError, match="has no dense part; build one with 'ragserve index-dense"):
        DenseIndex(IndexReader(idx))


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_approximate_faiss_kinds_find_the_exact_hits(wiki300_dense, minilm, tmp_path, kind):
    idx = tmp_path / "idx"
    shutil.copytree(wiki300_dense, idx)
    opts = FaissOptions(kind=kind, nlist=8, ef_search=256, nprobe=8, rescore=8)
    # wiki300's own vectors (the fixture's build ran the encoder over these 300 passages)
    m = build_dense_index(idx, minilm, opts, overwrite=True, embed=stored_vectors(wiki300_dense))
    assert m["faiss"]["kind"] == kind and (idx / DENSE_DIR / "faiss.index").is_file()
    approx = DenseSearcher(idx, minilm, backend="cpu", options=DenseOptions(faiss=opts))
    exact = DenseSearcher(wiki300_dense, minilm, backend="cpu")
    qv = minilm.encode(nq_questions(30))
    overlap = []
    for a, e in zip(approx.search_vectors(qv, 10), exact.search_vectors(qv, 10)):
        overlap.append(len(set(a.docids.tolist()) & set(e.docids.tolist())) / 10)
        # the scores given are the exact inner products of the hits (hnsw on fp16 storage, ivfpq rescored)
        ref = {d: s for d, s in zip(*[x.tolist() for x in (e.docids, e.scores)])}
        for d, s in zip(a.docids.tolist(), a.scores.tolist()):
            if d in ref:
                assert s == pytest.approx(ref[d], abs=1e-5)
    # 300 passages train only 2-bit PQ codes (39 points a centroid), so ivfpq's candidates are coarse here
    assert np.mean(overlap) >= (0.95 if kind == "hnsw" else 0.75), overlap


# -- bad input ----------------------------------------------------------------------------------------
def test_dense_index_built_with_another_model_is_refused(wiki300_dense, minilm_dir, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(minilm_dir, other)
    (other / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    with pytest.raises(DenseIndexError, match=r"was built with model 'all-MiniLM-L6-v2' .* not 'other-model'"):
        DenseSearcher(wiki300_dense, Embedder(other, device="cpu"))


def test_dimension_mismatch_and_no_dense_part(wiki300_dense, minilm, tmp_path):
    s = DenseSearcher(wiki300_dense, minilm, backend="gpu", device="cpu")
    with pytest.raises(SearchError, match="query embeddings have 128 dimensions, the dense index 384"):
        s.search_vectors(np.zeros((1, 128), np.float32), 5)
    with pytest.raises(SearchError, match="k1 and b are BM25 parameters"):
        s.search("x", k=3, k1=1.2)
    bm25_only = tmp_path / "bm25"
    shutil.copytree(wiki300_dense, bm25_only, ignore=shutil.ignore_patterns(DENSE_DIR))
    with pytest.raises(DenseIndexError, match="has no dense part"):
        DenseSearcher(bm25_only, minilm)
