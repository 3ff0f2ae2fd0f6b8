"""The cpu backend's dynamic pruning (block-max MaxScore over windows) returns the exhaustive top-k bit for bit.

Real questions (NQ-open test, MS MARCO dev) against real Wikipedia paragraphs (HotpotQA) and ArguAna, indexed with
small doc blocks and shards; windows as small as 64 docs so that a query crosses many windows, blocks and shards.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from indexer import layout as L
from indexer.bm25 import QueryTerms, norm_cache, sum_is_exact
from indexer.reader import IndexReader
from ragserve.kernels.cpu.backend import CpuBackend, CpuTuning
from ragserve.kernels.cpu.selection import flush_block, initial_key, topk_sorted
from ragserve.retrieval.searcher import Searcher
from ragserve.topics import read_queries
from tests.conftest import shared

KS = (1, 10, 100, 1000)


def _questions(n: int) -> list[str]:
    nq = [q.text for q in read_queries(shared("nq-open", "topics.dpr.nq.test.txt"))][:n]
    ms = [q.text for q in read_queries(shared("msmarco-passage-queries", "topics.msmarco-passage.dev-subset.txt"))][:n]
    return nq + ms


def _compare(index_path, texts, tuning: CpuTuning, ks=KS, k1=None, b=None) -> tuple[int, int, int]:
    """(pairs compared, postings scored pruned, postings scored exhaustive); asserts every pair is equal."""
    s = Searcher(index_path, threads=1)
    ix = s.index
    k1 = ix.k1 if k1 is None else k1
    b = ix.b if b is None else b
    pruned = CpuBackend(ix, threads=1, tuning=tuning)
    # The reference reads the file maps (no norms fused into its postings): each pair also compares the two.
    full = CpuBackend(ix, threads=1, prune=False, tuning=CpuTuning(resident=False))
    assert pruned.describe()["fused_norms"] == (tuning.resident and tuning.fuse_norms)
    assert not full.describe()["fused_norms"]
    n = scored = scored_full = 0
    for text in texts:
        q = s.analyze(text)
        if not len(q):
            continue
        for k in ks:
            a, st = pruned.search_with_stats(q, k, k1, b)
            e, st_full = full.search_with_stats(q, k, k1, b)
            assert a.same_as(e), (text, k)
            n += 1
            scored += st["scored"]
            scored_full += st_full["scored"]
    return n, scored, scored_full


@pytest.mark.parametrize("window", [64, 1024])
def test_pruned_equals_exhaustive_on_real_questions_hotpot(hotpot_index, window):
    n, scored, scored_full = _compare(hotpot_index, _questions(150), CpuTuning(window=window))
    assert n >= 4 * 290
    assert scored < scored_full  # the pruning did skip postings


def test_pruned_equals_exhaustive_on_real_questions_arguana(arguana_index):
    n, scored, scored_full = _compare(arguana_index, _questions(100), CpuTuning(window=256, probe_ratio=4))
    assert n >= 4 * 190
    assert scored < scored_full


def test_pruned_equals_exhaustive_without_fused_norms_or_seed(hotpot_index):
    n, scored, scored_full = _compare(hotpot_index, _questions(60), CpuTuning(window=128, fuse_norms=False, seed=False))
    assert scored < scored_full


def test_initial_threshold_is_reached_by_k_documents(hotpot_index):
    """The seeded threshold (the k-th exact score among the postings of the heaviest term's best fine blocks, or
    of all its postings) is at most the exhaustive k-th score of every query, and it is known for most of them."""
    from ragserve.kernels.cpu import search as S

    s = Searcher(hotpot_index, threads=1)
    ix = s.index
    be = CpuBackend(ix, threads=1)
    full = CpuBackend(ix, threads=1, prune=False, tuning=CpuTuning(resident=False))
    cache, default, _ = be._params(ix.k1, ix.b)
    seeded = compared = 0
    for text in _questions(60):
        q = s.analyze(text)
        if not len(q):
            continue
        for k in (1, 10, 100):
            for exact_limit in (0, 1 << 20):  # exact scores of the best blocks; of every posting
                seed = max(float(S.initial_threshold(
                    S.ShardArrays(*S.Shard._make(sh).arrays), S.Layout._make(be._layout), cache,
                    q.term_ids.astype(np.int64), q.weights, default, k, exact_limit, np.zeros(0, np.uint8)))
                    for sh in be._shard_args)
                top = full.search_terms([q], k, ix.k1, ix.b)[0]
                if len(top.scores) < k:
                    assert seed == 0.0
                    continue
                assert seed <= float(top.scores[k - 1]), (text, k)
                seeded += seed > 0.0
                compared += 1
    assert seeded > compared // 2


def test_block_max_passes_over_fine_blocks_of_a_dominant_term(hotpot_index):
    """One- and two-term queries: the essential term's fine blocks whose bound cannot win are not scored."""
    s = Searcher(hotpot_index, threads=1)
    ix = s.index
    pruned = CpuBackend(ix, threads=1, tuning=CpuTuning(window=1024))
    full = CpuBackend(ix, threads=1, prune=False, tuning=CpuTuning(resident=False))
    df = np.asarray(ix.df)
    dead = 0
    for t in np.argsort(-df)[:40:4]:
        for extra in (None, int(np.argsort(-df)[200])):
            tids = np.array([t] if extra is None else sorted({int(t), extra}), np.uint32)
            q = QueryTerms(term_ids=tids, boosts=np.ones(tids.size, np.float32),
                           weights=np.linspace(3.0, 1.0, tids.size).astype(np.float32))
            for k in (1, 10):
                a, st = pruned.search_with_stats(q, k, ix.k1, ix.b)
                assert a.same_as(full.search_terms([q], k, ix.k1, ix.b)[0]), (tids, k)
                dead += st["dead_postings"]
    assert dead > 0


def test_pruned_equals_exhaustive_with_other_k1_b(hotpot_index):
    # The fine bounds hold for the layout's k1 and b only: other parameters fall back to the block entries' bounds.
    _compare(hotpot_index, _questions(60), CpuTuning(window=128), ks=(10, 1000), k1=1.2, b=0.75)


def test_index_without_fine_bounds_gives_the_same_results(hotpot_index, tmp_path):
    """An index written before the fine bounds (or by scripts/synth_layout.py) gets them derived at open."""
    old = tmp_path / "old"
    shutil.copytree(hotpot_index, old)
    m = json.loads((old / L.MANIFEST).read_text())
    del m["layout"]["fine_block"]
    for sh in m["shards"]:
        for name in L.FINE_FILES:
            (old / sh["dir"] / name).unlink()
            del m["files"][f"{sh['dir']}/{name}"]
    (old / L.MANIFEST).write_text(json.dumps(m))
    new_ix, old_ix = IndexReader(hotpot_index), IndexReader(old)
    assert old_ix.fine_block is None and old_ix.shards[0].fine_ptr is None
    a_be, b_be = CpuBackend(new_ix, threads=1), CpuBackend(old_ix, threads=1)
    for (_, a), (_, b) in zip(a_be._shards, b_be._shards):
        for name in ("fine_ptr", "fine_maxq", "fine_last"):
            assert np.array_equal(a[name], b[name]), name
    s = Searcher(hotpot_index, threads=1)
    for text in _questions(20):
        q = s.analyze(text)
        if len(q):
            assert a_be.search_terms([q], 50, 0.9, 0.4)[0].same_as(b_be.search_terms([q], 50, 0.9, 0.4)[0])


def test_order_dependent_sums_take_the_canonical_order(hotpot_index):
    """Weights so far apart that the f64 sum of the term scores depends on the order (``sum_is_exact`` fails):
    terms are added in ascending term id, and only whole windows are skipped."""
    ix = IndexReader(hotpot_index)
    df = np.asarray(ix.df)
    common = np.argsort(-df)[:4].astype(np.uint32)
    term_ids = np.sort(common)
    weights = np.array([3.0e7, 1.0e-3, 2.5, 7.0e4], dtype=np.float32)
    assert not sum_is_exact(weights, float(norm_cache(ix.k1, ix.b, ix.avgdl).min()))
    q = QueryTerms(term_ids=term_ids, boosts=np.ones(4, np.float32), weights=weights)
    pruned, full = CpuBackend(ix, threads=1, tuning=CpuTuning(window=64)), CpuBackend(ix, threads=1, prune=False)
    for k in KS:
        assert pruned.search_terms([q], k, ix.k1, ix.b)[0].same_as(full.search_terms([q], k, ix.k1, ix.b)[0])


@pytest.mark.parametrize("seeded,with_deleted", [(False, False), (True, False), (False, True), (True, True)])
def test_topk_buffer_keeps_the_k_best_by_the_tie_rule(seeded, with_deleted):
    """flush_block / topk_sorted against a sort: score descending, then docid ascending, with many equal scores;
    seeded, the threshold starts at the k-th best score itself (``initial_key``): docs tied with it still enter;
    docs marked deleted never enter (a live index's segment), however well they score."""
    rng = np.random.default_rng(1)
    deleted = (rng.random(60 * 64) < 0.2).astype(np.uint8) if with_deleted else np.zeros(0, np.uint8)
    for k in (1, 3, 10, 100, 1000):  # 1000: the radix sort of the kept keys
        windows = []
        for w in range(60):  # windows of docs in docid order, offered in a shuffled order within each window
            n = int(rng.integers(0, 60))
            scores = rng.integers(1, 6, n).astype(np.float64) / 4  # few distinct values: ties everywhere
            windows.append((w * 64, scores, rng.permutation(64)[:n].astype(np.int64)))
        seen = [(float(np.float32(sc)), base + int(o)) for base, scores, offs in windows for sc, o in zip(scores, offs)
                if not (deleted.size and deleted[base + o])]
        want = sorted(seen, key=lambda x: (-x[0], x[1]))[:k]
        buf = np.empty(2 * k, np.uint64)
        st = np.zeros(3, np.uint64)
        if seeded:
            st[1] = initial_key(np.float32(want[-1][0]))
        stats = np.zeros(2, np.int64)
        for base, scores, offs in windows:
            acc = np.zeros(64)
            acc[offs] = scores
            live = (acc != 0).astype(np.uint8)
            flush_block(acc, live, offs, offs.size, base, buf, st, k, stats, 0, deleted, base)
            assert not acc.any() and not live.any()
        docs, out = topk_sorted(buf, st, k)
        assert [(float(s), int(d)) for s, d in zip(out, docs)] == want


def test_compiled_sum_is_exact_agrees_with_bm25():
    """``search.sum_is_exact`` (run inside the kernel's entry point) decides as ``bm25.sum_is_exact`` does,
    around its boundary too."""
    from ragserve.kernels.cpu.search import sum_is_exact as compiled

    rng = np.random.default_rng(3)
    cases = [(np.zeros(0, np.float32), 0.1), (np.array([5.0], np.float32), 0.0), (np.ones(3, np.float32), 0.0)]
    for n in (2, 3, 8, 40):
        for spread in (1.0, 1e2, 1e5, 1e7, 1e9):
            w = (rng.random(n) * spread + 1e-3).astype(np.float32)
            cases += [(w, q) for q in (1e-4, 0.05, 0.3, 2.0)]
    decided = {compiled(w, q) for w, q in cases}
    assert decided == {True, False}  # both answers are exercised
    for w, q in cases:
        assert compiled(w, q) == sum_is_exact(w, q), (w, q)
