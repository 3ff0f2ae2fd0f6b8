"""The searcher's own work around the backend: query preparation (``ragserve.retrieval.prepare``) against the
analyzer's chain, and hits whose passages are read from the index on first use."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from indexer import bm25
from ragserve.kernels.contract import StageTimes
from ragserve.retrieval.prepare import QueryPreparer
from ragserve.retrieval.searcher import Hit, Searcher
from ragserve.topics import read_queries
from tests.conftest import shared


@pytest.fixture(scope="module")
def searcher(hotpot_index):
    s = Searcher(hotpot_index, backend="cpu", threads=1)
    yield s
    s.close()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Real questions, and queries with repeated, unknown, dropped and over-long tokens."""
    nq = read_queries(shared("nq-open", "topics.dpr.nq.test.txt"))[:300]
    marco = read_queries(shared("msmarco-passage-queries", "topics.msmarco-passage.dev-subset.txt"))[:300]
    return [q.text for q in nq + marco] + [
        "the the Paris PARIS paris's capital of France's zzqxyunknown zzqxyunknown", "of the and", "",
        "x" * 300 + " paris " + "Émile Zola ÆSIR naïve 東京 😀", "a_b __ 3.14 U.S.A. can't"]


def chain_terms(s: Searcher, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """The query's terms by the analyzer's chain and the vocabulary, each term's idf computed on its own."""
    counts, _ = s.analyzer.term_counts(text)
    found = sorted((s.index.term_ids[t], c) for t, c in counts.items() if t in s.index.term_ids)
    ids = np.array([t for t, _ in found], dtype=np.uint32)
    boosts = np.array([c for _, c in found], dtype=np.float32)
    idf = bm25.idf_f32(np.asarray(s.index.df)[ids.astype(np.int64)], s.index.doc_count)
    return ids, boosts, boosts * idf, tuple(t for t in counts if t not in s.index.term_ids)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("max_tokens", [1 << 18, 7])
def test_prepared_terms_equal_the_analyzer_chain(searcher, texts, max_tokens):
    """Term ids, boosts and weights to the bit, unknown terms in order, whether the token cache holds every
    token or fills up after seven (then most tokens take the chain each time); asked twice, the same."""
    prep = QueryPreparer(searcher.index, max_tokens=max_tokens)
    for _ in range(2):
        for text in texts:
            q = prep(text)
            ids, boosts, weights, unknown = chain_terms(searcher, text)
            assert q.term_ids.dtype == np.uint32 and np.array_equal(q.term_ids, ids), text
            assert same_bits(q.boosts, boosts) and same_bits(q.weights, weights), text
            assert q.unknown == unknown, text
    assert len(prep._tokens) <= max_tokens


def test_hits_read_their_passages_on_first_use(searcher):
    top = searcher.backend.search_terms([searcher.analyze("which city is the capital of france")], 10,
                                        searcher.index.k1, searcher.index.b)[0]
    ix = searcher.index
    hits = searcher.search("which city is the capital of france", k=10, times=StageTimes())
    assert [(h.docid, h.score) for h in hits] == list(zip(top.docids.tolist(), top.scores.tolist()))
    assert all(h._store is ix for h in hits)  # nothing read yet
    expected = [Hit(d, ix.external_id(d), s, *ix.document(d)) for d, s in zip(top.docids.tolist(),
                                                                              top.scores.tolist())]
    assert hits == expected and [h.to_dict() for h in hits] == [h.to_dict() for h in expected]
    assert all(h._store is None for h in hits)
    bare = searcher.search("which city is the capital of france", k=10, with_text=False)
    assert [(h.id, h.title, h.text) for h in bare] == [(h.id, "", "") for h in expected]
    # A pickled hit carries its passage, not the index; a set field stays set.
    lazy = searcher.search("which city is the capital of france", k=1)[0]
    assert pickle.loads(pickle.dumps(lazy)) == expected[0]
    lazy = searcher.search("which city is the capital of france", k=1)[0]
    lazy.title = "retitled"
    assert (lazy.title, lazy.text) == ("retitled", expected[0].text)
    assert repr(expected[0]).startswith(f"Hit(docid={expected[0].docid}, id={expected[0].id!r}, score=")


def test_stage_times_add_up(searcher):
    times = StageTimes()
    searcher.search_batch(["capital of france", "river in germany"], k=5, times=times)
    once = (times.prepare, times.relevancy, times.retrieval)
    assert all(t > 0 for t in once)
    searcher.search("capital of france", k=5, times=times)
    assert all(t > o for t, o in zip((times.prepare, times.relevancy, times.retrieval), once))
