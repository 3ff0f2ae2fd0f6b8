"""Dense and hybrid retrieval over a live index (``indexer/FORMAT.md``, "Live index", "Dense part of a live index").

Each segment of a live index whose plain index had a dense part carries its own (``seg_NNNNNN/dense/``, the
version-1 "Dense part" layout of the segment's documents, faiss kind ``flat``). ``DenseSegmentWriter`` writes them:
a refresh embeds the new segment's stored passages with the encoder the dense part records (the same model
fingerprint, device type and dtype), a merge copies the merged documents' rows. ``LiveDenseSearcher`` scores every
segment's live rows with faiss's per-pair inner product (``dense.flat_topk``: one rule for a fresh build and for
any segment), and ranks them by score, then global docid: the fresh build's ids, score bits and order.
``LiveHybridSearcher`` fuses the BM25 and dense rankings of one snapshot.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from indexer.reader import IndexReader
from indexer.segments import LiveIndex, LiveIndexError, Snapshot, register_dense_writer
from ragserve.kernels.contract import SearchError, StageTimes, TopK
from ragserve.retrieval.contract import Hit, Retriever
from ragserve.retrieval.dense import (DenseIndex, DenseIndexError, DenseOptions, FaissOptions, build_dense_index,
                                      flat_topk, live_selector, passage_text, write_dense_part)
from ragserve.retrieval.embedder import Embedder, EmbedderError
from ragserve.retrieval.hybrid import FusionOptions, HybridSearcher, fuse
from ragserve.retrieval.live import Found, LiveSearcher, LiveView, SnapshotPins, _Store

COPY_ROWS = 1 << 16  # rows copied at a time by a merge


class DenseSegmentWriter:
    """Writes the dense parts of a live index's segments (``indexer.segments.DenseWriter``). The encoder loads at the
    first embedding: deletes and merges never need it."""

    def __init__(self, settings: dict, model: str | None = None, embedder: Embedder | None = None) -> None:
        """``settings``: the commit's ``settings.dense``; ``model``: the encoder's directory where it is not at the
        recorded path; ``embedder``: one already loaded (checked against the record)."""
        self.settings = settings
        self.model = model
        self._embedder = self._checked(embedder) if embedder is not None else None
        self._cache: dict[str, np.ndarray] = {}  # passage text -> f32 vector (prefetched, not yet written)
        self._lock = threading.Lock()

    def _checked(self, e: Embedder) -> Embedder:
        try:
            e.check_same_model(self.settings["encoder"], "the live index's dense part")
        except EmbedderError as err:
            raise LiveIndexError(str(err)) from None
        want = self.settings["embedding"]
        got = e.compute
        if (got["device"], got["dtype"]) != (want["device"], want["dtype"]):
            raise LiveIndexError(f"the dense part was embedded on {want['device']} in {want['dtype']}; an encoder on "
                                 f"{got['device']} in {got['dtype']} makes other vector bits")
        return e

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            enc, how = self.settings["encoder"], self.settings["embedding"]
            path = self.model or enc["path"]
            if not Path(path).is_dir():
                raise LiveIndexError(f"the dense part's encoder {enc['name']!r} is not at {path}; pass its "
                                     f"directory (--dense-model DIR) to embed the added documents")
            try:
                e = Embedder(path, device=how["device"], dtype=how["dtype"])
            except EmbedderError as err:
                raise LiveIndexError(f"cannot load the dense part's encoder: {err}") from None
            self._embedder = self._checked(e)
        return self._embedder

    def prefetch(self, docs: list[tuple[str, str]]) -> None:
        with self._lock:
            texts = list(dict.fromkeys(t for t in (passage_text(a, b) for a, b in docs) if t not in self._cache))
        if texts:
            vecs = self.embedder.encode(texts)
            with self._lock:
                self._cache.update(zip(texts, vecs))

    def _embed(self, texts: list[str]) -> np.ndarray:
        """Vectors of ``texts``: prefetched ones looked up, the rest embedded now (the same bits either way)."""
        with self._lock:
            miss = list(dict.fromkeys(t for t in texts if t not in self._cache))
        got = dict(zip(miss, self.embedder.encode(miss))) if miss else {}
        with self._lock:
            return np.stack([got[t] if t in got else self._cache[t] for t in texts])

    def write_segment(self, seg: Path) -> None:
        e = self.embedder
        build_dense_index(seg, e, FaissOptions(kind="flat"), embed=self._embed)
        with self._lock:
            self._cache.clear()

    def write_merged(self, seg: Path, parts: list[tuple[IndexReader, np.ndarray]]) -> None:
        def fill(emb: np.ndarray) -> None:
            at = 0
            for reader, docs in parts:
                src = DenseIndex(reader).embeddings
                for i in range(0, docs.size, COPY_ROWS):
                    rows = docs[i:i + COPY_ROWS]
                    emb[at:at + rows.size] = src[rows]
                    at += rows.size

        write_dense_part(IndexReader(seg), self.settings["encoder"], self.settings["embedding"], fill,
                         FaissOptions(kind="flat"))


register_dense_writer(lambda settings, model: DenseSegmentWriter(settings, model))


class _SegmentDense:
    """One segment's dense part as the searcher holds it: the faiss index over its rows (f32, made once)."""

    def __init__(self, reader: IndexReader) -> None:
        self.dense = DenseIndex(reader)
        self.index = self.dense.faiss_index(FaissOptions(kind="flat"))
        self._sels: dict[int, object] = {}

    def selector(self, deleted: np.ndarray):
        """Its live rows (keyed by the deleted count: a segment's tombstones only grow)."""
        got = self._sels.get(int(deleted.size))
        if got is None:
            got = live_selector(deleted, self.dense.num_docs)
            self._sels = {int(deleted.size): got}
        return got


class LiveDenseSearcher(Retriever):
    """Exact dense (flat) top-k over a live index: the ids, f32 score bits and order of a fresh build's
    ``DenseSearcher`` (cpu) over the live documents in last-written order."""

    kind = "dense"

    def __init__(self, live: LiveIndex, embedder: Embedder, options: DenseOptions = DenseOptions(),
                 owns_live: bool = False) -> None:
        settings = live.settings.get("dense")
        if settings is None:
            raise DenseIndexError(f"live index {live.path} has no dense part (its index had none when it became "
                                  f"live); search it with --retriever bm25")
        try:
            embedder.check_same_model(settings["encoder"], f"the dense part of {live.path}")
        except EmbedderError as e:
            raise DenseIndexError(str(e)) from None
        self.live = live
        self.embedder = embedder
        self.options = options
        self.backend_name = "cpu"
        self._owns_live = owns_live
        self._lock = threading.Lock()
        self._segs: dict[str, _SegmentDense] = {}
        self._pins = SnapshotPins(self._lock)
        self.index = LiveView(self)
        self._sync(live.snapshot())
        live.on_refresh(self._sync)

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @property
    def backend(self):
        return self

    def describe(self) -> dict:
        return {"backend": "cpu", "retriever": "dense", "model": self.embedder.info.name, "faiss": "flat",
                "segments": len(self.live.snapshot().segments)}

    def _sync(self, snap: Snapshot) -> None:
        """Ready the snapshot's new segments (before it is published) and let go of those no search uses."""
        for s in snap.segments:
            self._segment(s)
        names = {s.name for s in snap.segments}
        with self._lock:
            busy = self._pins.segments(self.live.snapshot())
            for n in [n for n in self._segs if n not in names and n not in busy]:
                del self._segs[n]

    def _segment(self, seg) -> _SegmentDense:
        got = self._segs.get(seg.name)
        if got is None:
            got = _SegmentDense(seg.reader)
            with self._lock:
                got = self._segs.setdefault(seg.name, got)
        return got

    def embed(self, queries: list[str]) -> np.ndarray:
        return self.embedder.encode(queries)

    def search_vectors_in(self, snap: Snapshot, qv: np.ndarray, k: int) -> list[Found]:
        """The exact top-k of each query vector over the snapshot's live rows: global docids, f32 scores, best
        first, ties by global docid (each segment's own top-k holds its share of the global one)."""
        if qv.ndim != 2 or qv.shape[1] != int(self.live.settings["dense"]["dim"]):
            raise SearchError(f"query embeddings have {qv.shape[-1]} dimensions, the dense part "
                              f"{self.live.settings['dense']['dim']}")
        parts: list[list[tuple]] = [[] for _ in range(qv.shape[0])]
        for si, seg in enumerate(snap.segments):
            if not seg.n_live:
                continue
            sd = self._segment(seg)
            tops = flat_topk(sd.index, qv, min(k, seg.n_live), sd.selector(seg.deleted))
            for i, top in enumerate(tops):
                loc = top.docids
                parts[i].append((snap.offsets[si] + seg.live_rank(loc), top.scores, si, loc))
        out = []
        for p in parts:
            if not p:
                e = np.zeros(0, np.int64)
                out.append(Found(TopK(e, np.zeros(0, np.float32)), e, e))
                continue
            g = np.concatenate([x[0] for x in p]).astype(np.int64)
            sc = np.concatenate([x[1] for x in p]).astype(np.float32)
            segs = np.concatenate([np.full(x[0].size, x[2], np.int64) for x in p])
            loc = np.concatenate([x[3] for x in p]).astype(np.int64)
            order = np.lexsort((g, -sc))[:k]  # inner products may be negative: no bit-pattern keys here
            out.append(Found(TopK(g[order], sc[order]), segs[order], loc[order]))
        return out

    def search_in(self, snap: Snapshot, queries: list[str], k: int, with_text: bool = False,
                  times: StageTimes | None = None) -> list[list[Hit]]:
        with self._pins.pin(snap):
            t0 = time.perf_counter()
            qv = self.embed(queries)
            t1 = time.perf_counter()
            found = self.search_vectors_in(snap, qv, k)
            t2 = time.perf_counter()
            store = _Store(snap)
            out = []
            for f in found:
                hits = [Hit(d, i, s) for d, i, s in zip(f.top.docids.tolist(), LiveSearcher.external_ids(snap, f),
                                                         f.top.scores.tolist())]
                if with_text:
                    for h in hits:
                        h._store = store
                out.append(hits)
            if times is not None:
                times.add(StageTimes(prepare=t1 - t0, relevancy=t2 - t1, retrieval=time.perf_counter() - t2))
            return out

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None) -> list[list[Hit]]:
        return self.search_in(self.live.snapshot(), queries, k, with_text, times)

    def close(self) -> None:
        with self._lock:
            self._segs.clear()
        if self._owns_live:
            self.live.close()


class LiveHybridSearcher(HybridSearcher):
    """``HybridSearcher`` over a live index: both rankings from one snapshot (a refresh between them would fuse
    two collections), fused by the same ``fuse``."""

    def __init__(self, bm25: LiveSearcher, dense: LiveDenseSearcher, options: FusionOptions = FusionOptions()) -> None:
        super().__init__(bm25, dense, options)

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None) -> list[list[Hit]]:
        snap = self.bm25.live.snapshot()
        depth = min(max(k, self.options.depth), self.max_k)
        sparse = self.bm25.search_in(snap, queries, depth, k1, b, False, times)
        dense = self.dense.search_in(snap, queries, depth, False, times)
        t0 = time.perf_counter()
        w = [1.0 - self.options.alpha, self.options.alpha]
        store = _Store(snap)
        out = []
        for hs, hd in zip(sparse, dense):
            rank = [(np.array([h.docid for h in hits], np.int64), np.array([h.score for h in hits], np.float64))
                    for hits in (hs, hd)]
            ids = {h.docid: h.id for h in (*hs, *hd)}
            hits = []
            for d, sc in zip(*fuse(rank, w, k, self.options)):
                h = Hit(docid=int(d), id=ids[int(d)], score=float(sc))
                if with_text:
                    h._store = store
                hits.append(h)
            out.append(hits)
        if times is not None:
            times.retrieval += time.perf_counter() - t0
        return out


__all__ = ["DenseSegmentWriter", "LiveDenseSearcher", "LiveHybridSearcher"]
