"""The analysis stage of a build: documents -> postings per document and stored records, in chunks.

Chunks of ``CHUNK_DOCS`` documents go to worker processes (both cores by default), which tokenize
(``indexer/fasttok.py``), count postings and encode the stored records. A worker keeps its own term ids, so only
the terms new to it cross to the main process (``indexer/ingest.py`` maps them to global ones).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Iterable, Iterator

import numpy as np
from numba import njit

from indexer import layout as L
from indexer.analyzer import Analyzer
from indexer.fasttok import TokenTable

CHUNK_DOCS = 1000  # documents per analysis task: large enough to amortise inter-process transfer


class _ChunkAnalyser:
    """Analysis state of one worker process: its own term ids, so only terms new to it cross to the main process.

    Documents go through ``fasttok`` (numba tokenizer, one hash lookup per token) when the analyzer lower-cases
    and their characters allow it, else through the analyzer's tokenizer with a dict from token to term id. Either
    way the Python chain runs once per distinct token.
    """

    def __init__(self, cfg: dict) -> None:
        self.analyzer = Analyzer.from_config(cfg)
        self.table = TokenTable(self.analyzer.config.max_token_length) if self.analyzer.config.lowercase else None
        self.ids: dict[str, int] = {}  # token -> worker-local term id, or -1 (tokens of the analyzer's tokenizer)
        self.term_ids: dict[str, int] = {}  # term -> worker-local term id
        self.terms: list[str] = []
        self.sent = 0  # terms already reported to the main process
        self._slots = np.zeros(0, dtype=np.int32)  # scratch of chunk_postings, one entry per term

    def _term_id(self, term: str) -> int:
        if not term:
            return -1
        tid = self.term_ids.get(term)
        if tid is None:
            tid = self.term_ids[term] = len(self.terms)
            self.terms.append(term)
        return tid

    def _new_token(self, tok: str) -> int:
        return self._term_id(self.analyzer.term(tok, cache=False))  # the token table is the cache

    def _token_id(self, tok: str) -> int:
        tid = self.ids.get(tok)
        if tid is None:
            tid = self._term_id(self.analyzer.term(tok))
            if len(self.ids) < 4_000_000:
                self.ids[tok] = tid
        return tid

    def _full_path_ids(self, text: str) -> np.ndarray:
        return np.fromiter(map(self._token_id, self.analyzer.tokens(text)), dtype=np.int32)

    def _doc_ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Term ids of the tokens of all documents (-1: dropped) and the number of tokens of each document."""
        if self.table is None:
            docs = [self._full_path_ids(t) for t in texts]
            return np.concatenate(docs) if docs else np.zeros(0, np.int32), np.array([d.size for d in docs])
        buf = "".join(texts).encode("utf-8", "surrogatepass")
        ids, ends, rejected = self.table.ids(buf, np.fromiter(map(len, texts), np.int64, len(texts)),
                                             self._new_token, self._token_id)
        counts = np.diff(ends, prepend=0)
        if not rejected.any():
            return ids, counts
        # Documents outside the fast path have no ids in `ids`: splice theirs in at their place.
        parts, prev = [], 0
        for d in np.flatnonzero(rejected):
            full = self._full_path_ids(texts[d])
            parts += [ids[prev:ends[d]], full]
            counts[d] = full.size
            prev = ends[d]
        parts.append(ids[prev:])
        return np.concatenate(parts), counts

    def chunk(self, batch: tuple[list[str], list[str], list[str]], self_contained: bool = False) -> tuple:
        """A chunk of documents (ids, titles, texts): (worker id, terms new since the last chunk, postings grouped
        by document as worker-local term id and tf, distinct terms per doc, length per doc, stored records).

        ``self_contained``: the worker id is None and the terms are those of this chunk alone, numbered from 0,
        so the result means the same whichever worker made it and in whatever order results arrive (an
        executor that may retry or reorder tasks, e.g. Ray, needs this)."""
        ids, titles, texts = batch
        term_ids, counts = self._doc_ids([indexed_text(title, text) for title, text in zip(titles, texts)])
        if self._slots.size < len(self.terms):
            self._slots = np.zeros(2 * len(self.terms), dtype=np.int32)
        local, tfs, uniq, lengths = chunk_postings(term_ids, counts, self._slots)
        stored = _stored_records(ids, titles, texts)
        if self_contained:
            used = np.unique(local)
            terms = self.terms
            return (None, [terms[t] for t in used.tolist()], np.searchsorted(used, local).astype(np.int32), tfs,
                    uniq, lengths, stored)
        new = self.terms[self.sent:]
        self.sent = len(self.terms)
        return os.getpid(), new, local, tfs, uniq, lengths, stored


def _stored_records(ids: list[str], titles: list[str], texts: list[str]) -> tuple[bytes, np.ndarray, bytes, np.ndarray]:
    """store.bin and docids.bin bytes of a chunk, with each record's size (FORMAT.md: title \x1f text)."""
    sep = L.FIELD_SEPARATOR
    recs = [(t.replace(sep, " ") + sep + x.replace(sep, " ")).encode("utf-8", "replace") for t, x in zip(titles, texts)]
    enc_ids = [i.encode("utf-8", "replace") for i in ids]
    return (b"".join(recs), np.fromiter(map(len, recs), dtype=np.uint64, count=len(recs)),
            b"".join(enc_ids), np.fromiter(map(len, enc_ids), dtype=np.uint64, count=len(enc_ids)))


@njit(cache=True, nogil=True)
def chunk_postings(ids, counts, slots):
    """Postings of documents given as term ids (-1: dropped token) and token counts: (term and tf per posting,
    postings and length per document).

    ``slots`` (one entry per term, any content) remembers where each term was last counted; an entry is trusted
    only if it points at a posting of that term in the current document, so it is never reset."""
    n_docs = counts.size
    terms = np.empty(ids.size, dtype=np.int32)
    tfs = np.empty(ids.size, dtype=np.uint32)
    uniq = np.zeros(n_docs, dtype=np.int32)
    lengths = np.zeros(n_docs, dtype=np.int64)
    postings = 0
    k = 0
    for d in range(n_docs):
        first = postings
        for _ in range(counts[d]):
            t = ids[k]
            k += 1
            if t < 0:
                continue
            lengths[d] += 1
            j = slots[t]
            if first <= j < postings and terms[j] == t:
                tfs[j] += 1
            else:
                slots[t] = postings
                terms[postings] = t
                tfs[postings] = 1
                postings += 1
        uniq[d] = postings - first
    return terms[:postings], tfs[:postings], uniq, lengths


# The analysis state of a pool worker process (set by its initializer; a pool task can only reach it as a global).
# Never set in the main process: an in-process build keeps its own ``_ChunkAnalyser`` (two builds may run at once
# in two threads, e.g. a live index's refresh and merge).
_pool_worker: _ChunkAnalyser | None = None


def _init_pool_worker(cfg: dict) -> None:
    global _pool_worker
    # Ctrl-C reaches the whole process group. Only the main process acts on it (it stops the pool and removes
    # the partial index): a worker interrupted inside the pool's queues can leave the pool waiting forever.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _pool_worker = _ChunkAnalyser(cfg)


def _analyse_chunk(batch: tuple[list[str], list[str], list[str]]) -> tuple:
    assert _pool_worker is not None
    return _pool_worker.chunk(batch)


class ChunkAnalyser:
    """Analysis of document chunks for another executor (e.g. Ray workers): each result is self-contained
    (``_ChunkAnalyser.chunk``), for ``build_index_from_analysed``. Chunk boundaries do not change the index."""

    def __init__(self, analyzer_config: dict) -> None:
        self._analyser = _ChunkAnalyser(analyzer_config)

    def __call__(self, ids: list[str], titles: list[str], texts: list[str]) -> tuple:
        return self._analyser.chunk((ids, titles, texts), self_contained=True)


def indexed_text(title: str, text: str) -> str:
    # BEIR/Anserini convention: title and text form one field, joined by a space.
    return f"{title} {text}" if title else text


def _iter_batches(docs: Iterable, size: int) -> Iterator[list]:
    batch = []
    for d in docs:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def analyse_documents(documents: Iterable, analyzer: Analyzer, workers: int) -> Iterator[tuple]:
    """Analysed chunks of ``documents`` in input order, from ``workers`` processes (or this one)."""

    def prepared() -> Iterator[tuple[list[str], list[str], list[str]]]:
        for batch in _iter_batches(documents, CHUNK_DOCS):
            yield [str(d.id) for d in batch], [d.title or "" for d in batch], [d.text or "" for d in batch]

    if workers > 1:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        # ProcessPoolExecutor, not multiprocessing.Pool: Pool's worker-handler thread spins while a large result
        # waits in the pipe (it polls the result pipe), which cost the main process seconds of CPU.
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_pool_worker,
                                 initargs=(analyzer.config_dict(),)) as pool:
            # Up to `window` chunks in flight, results taken in order: this thread reads ahead while the pool's
            # threads move chunks and results, and memory stays bounded.
            window = 2 * workers + 2
            pending: deque[Future] = deque()
            try:
                for batch in prepared():
                    pending.append(pool.submit(_analyse_chunk, batch))
                    if len(pending) >= window:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                pool.shutdown(cancel_futures=True)
    else:
        worker = _ChunkAnalyser(analyzer.config_dict())  # this build's own: nothing shared with another thread's
        for batch in prepared():
            yield worker.chunk(batch)
