"""The prepare stage: query text to the weighted terms a backend scores (``QueryTerms``), for one index.

Every step after tokenization (possessive filter, lower case, stopwords, stemming, the vocabulary lookup) depends
on the token alone, so ``QueryPreparer`` keeps one entry per distinct token: its term id, or the unknown term,
or nothing (a dropped token). A query then costs its tokenization, one small-dict lookup per token and three tiny
arrays, where the chain and a lookup in the index's vocabulary (a dict of every term: a few cache misses a term)
cost several times that. The cache is exact (the same terms as the analyzer's chain) and bounded.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from indexer import bm25
from indexer.bm25 import QueryTerms
from indexer.reader import IndexReader

# Distinct tokens remembered (~150 bytes each): queries repeat a small vocabulary; junk must not grow it forever.
MAX_TOKENS = 1 << 18


class QueryPreparer:
    """``prepare(text)``: distinct query terms ascending by id, boosted by their count in the query (pyserini's
    rule), weighted by boost * idf in f32."""

    def __init__(self, index: IndexReader, max_tokens: int = MAX_TOKENS) -> None:
        self.index = index
        self.analyzer = index.analyzer
        self.max_tokens = max_tokens
        # token -> term id (int), or the term (str) when the index lacks it, or "" when the chain drops the token
        self._tokens: dict[str, int | str] = {}
        self._idf_of: dict[int, float] = {}  # the f32 idf of each term id in ``_tokens``

    @cached_property
    def idf(self) -> np.ndarray:
        """Every term's f32 idf, computed once (element by element, as for a single query's terms)."""
        return bm25.idf_f32(np.asarray(self.index.df), self.index.doc_count)

    def _learn(self, token: str) -> int | str:
        term = self.analyzer.term(token, cache=False)
        entry: int | str = term
        if term:
            tid = self.index.term_ids.get(term)
            if tid is not None:
                entry = tid
                self._idf_of[tid] = float(self.idf[tid])
        if len(self._tokens) < self.max_tokens:
            self._tokens[token] = entry
        return entry

    def __call__(self, query: str) -> QueryTerms:
        tokens = self.analyzer.tokens(query)
        get = self._tokens.get
        counts: dict[int, int] = {}
        unknown: dict[str, None] = {}  # in order of first occurrence, as the analyzer's term counts list them
        for token in tokens:
            e = get(token)
            if e is None:
                e = self._learn(token)
            if e.__class__ is int:
                counts[e] = counts.get(e, 0) + 1
            elif e:
                unknown[e] = None
        ids = sorted(counts)
        boosts = [counts[t] for t in ids]
        term_ids = np.array(ids, dtype=np.uint32)
        if len(tokens) < 1 << 24:
            # boost * idf in f64 is exact (24-bit integer times a 24-bit significand), so rounding it to f32 gives
            # the bits of the f32 product (Lucene's boost * idf) without the gather and multiply (numpy calls cost
            # several microseconds each right after a scoring pass has flushed the caches).
            idf_of = self._idf_of
            weights = np.array([c * idf_of[t] for t, c in zip(ids, boosts)], dtype=np.float32)
            boosts_f = np.array(boosts, dtype=np.float32)
        else:  # counts that f32 rounds: the f32 product itself
            boosts_f = np.array(boosts, dtype=np.float32)
            weights = boosts_f * self.idf[term_ids]
        return QueryTerms(term_ids=term_ids, boosts=boosts_f, weights=weights, unknown=tuple(unknown))
