"""BM25 scores and top-k of the CPU backend against references computed from the raw documents."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest

from indexer import bm25
from indexer.analyzer import Analyzer
from indexer.norms import byte4_to_int, int_to_byte4
from ragserve.kernels.contract import SearchError
from ragserve.retrieval.searcher import Searcher
from tests.conftest import shared


@pytest.fixture(scope="module")
def raw_arguana():
    """Per doc: term counts and token count, from re-analysing the corpus (independent of the writer)."""
    an = Analyzer()
    docs = []
    with gzip.open(shared("beir-arguana", "corpus.jsonl.gz"), "rt") as f:
        for line in f:
            r = json.loads(line)
            text = f"{r['title']} {r['text']}" if r.get("title") else r["text"]
            counts, n = an.term_counts(text)
            docs.append((r["_id"], counts, n))
    df = Counter()
    for _, c, _ in docs:
        df.update(c.keys())
    return docs, df


def _reference(raw, query: str, k1=0.9, b=0.4, exact_f32=True):
    """Score every document by the formula. exact_f32: FORMAT.md's f32 steps; else plain float64 maths."""
    docs, df = raw
    an = Analyzer()
    qc, _ = an.term_counts(query)
    doc_count = sum(1 for _, _, n in docs if n > 0)
    total = sum(n for _, _, n in docs)
    f32 = np.float32
    avgdl = f32(total / doc_count)
    out = {}
    for i, (did, counts, n) in enumerate(docs):
        acc = 0.0
        hit = False
        for term in sorted(t for t in qc if t in df):
            tf = counts.get(term)
            if not tf:
                continue
            hit = True
            idf = np.log1p((doc_count - df[term] + 0.5) / (df[term] + 0.5))
            length = byte4_to_int(int_to_byte4(n))
            if exact_f32:
                w = f32(qc[term]) * f32(idf)
                cache = f32(1) / (f32(k1) * ((f32(1) - f32(b)) + f32(b) * f32(length) / avgdl))
                s = w - w / (f32(1) + f32(tf) * cache)
                acc += float(s)
            else:
                acc += qc[term] * idf * tf / (tf + k1 * (1 - b + b * length / (total / doc_count)))
        if hit:
            out[i] = float(f32(acc)) if exact_f32 else acc
    ranked = sorted(out.items(), key=lambda x: (-x[1], x[0]))
    return ranked


QUERIES = [
    "nuclear power is dangerous",
    "the death penalty should be abolished because innocent people are executed",
    "Animals have rights; zoos are cruel prisons",
    "is it right to ban smoking in public places? Smoking smoking smoking",
    "xyzzy-unknown-term",
]


@pytest.mark.parametrize("query", QUERIES)
def test_scores_equal_f32_reference_bit_for_bit(arguana_index, raw_arguana, query):
    s = Searcher(arguana_index)
    ref = _reference(raw_arguana, query)
    hits = s.search(query, k=1000, with_text=False)
    assert [h.docid for h in hits] == [d for d, _ in ref[:1000]]
    assert [h.score for h in hits] == [sc for _, sc in ref[:1000]]


@pytest.mark.parametrize("query", QUERIES[:3])
def test_scores_match_float64_formula(arguana_index, raw_arguana, query):
    s = Searcher(arguana_index)
    ref = dict(_reference(raw_arguana, query, exact_f32=False))
    hits = s.search(query, k=200, with_text=False)
    assert hits
    for h in hits:
        assert h.score == pytest.approx(ref[h.docid], rel=1e-5)


def test_custom_k1_b_match_reference(arguana_index, raw_arguana):
    s = Searcher(arguana_index)
    q = QUERIES[1]
    ref = _reference(raw_arguana, q, k1=1.2, b=0.75)
    hits = s.search(q, k=100, k1=1.2, b=0.75, with_text=False)
    assert [(h.docid, h.score) for h in hits] == ref[:100]


@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_pruned_search_equals_exhaustive(arguana_index, arguana_queries, k):
    pruned = Searcher(arguana_index)
    full = Searcher(arguana_index, prune=False)
    texts = [q.text for q in arguana_queries[:150]]
    a = pruned.search_batch(texts, k=k, with_text=False)
    b = full.search_batch(texts, k=k, with_text=False)
    for ha, hb in zip(a, b):
        assert [(h.docid, h.score) for h in ha] == [(h.docid, h.score) for h in hb]


def test_ties_break_by_ascending_docid(tmp_path):
    from dataclasses import dataclass

    from indexer.options import BuildOptions
    from indexer.writer import build_index_from_documents

    @dataclass
    class D:
        id: str
        title: str
        text: str

    docs = [D(f"d{i}", "", "apple banana" if i % 2 else "cherry") for i in range(50)]
    build_index_from_documents(docs, tmp_path / "idx", BuildOptions(block_size=8, bank_bytes=4096, progress=False))
    hits = Searcher(tmp_path / "idx").search("apple", k=10)
    assert [h.id for h in hits] == [f"d{i}" for i in range(1, 20, 2)]
    assert len({h.score for h in hits}) == 1


def test_bad_search_input_raises(arguana_index):
    s = Searcher(arguana_index)
    for kwargs in ({"k": 0}, {"k": 10_001}, {"k": 2.5}, {"k1": -1.0}, {"b": 1.5}):
        with pytest.raises(SearchError):
            s.search("nuclear", **kwargs)
    with pytest.raises(SearchError):
        s.search_batch(["ok", "  "])
    with pytest.raises(SearchError):
        Searcher(arguana_index, backend="no-such-backend")
    assert s.search("the of and", k=10) == []  # only stopwords: nothing to match


def test_vocabulary_idf_equals_each_query_own(arguana_index):
    """The searcher's idf table (computed once for every term) has the bits of a query's own idf computation,
    whatever the number of terms it is computed with."""
    s = Searcher(arguana_index)
    df = np.asarray(s.index.df)
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 8, 9, 31, 64):
        for _ in range(50):
            ids = rng.choice(df.size, n, replace=False)
            own = bm25.idf_f32(df[ids], s.index.doc_count)
            assert np.array_equal(own.view(np.uint32), s._idf[ids].view(np.uint32))
    q = s.analyze("nuclear nuclear power is dangerous")
    expected = q.boosts * bm25.idf_f32(df[q.term_ids.astype(np.int64)], s.index.doc_count)
    assert np.array_equal(q.weights.view(np.uint32), expected.astype(np.float32).view(np.uint32))
