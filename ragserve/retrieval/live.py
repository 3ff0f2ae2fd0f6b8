"""``LiveSearcher``: exact BM25 top-k over a live index (``indexer/segments.py``) on any registered backend.

Each search takes the index's current ``Snapshot`` (never waiting for a writer) and prepares the query once with
the live collection's statistics: idf from the live df and live document count, weights ``f32(boost * idf)``
exactly as ``QueryPreparer`` makes them for a fresh build. The query's terms go to each segment as its own term
ids (ascending: every segment's vocabulary is sorted like the fresh build's, so the canonical summation order
holds and the f32 score bits are the fresh build's), scored with the live average length. Then:
- on the cpu backend, all segments in ONE kernel call a query (``kernels/cpu/segments.py``): one top-k over a
  shared docid space (segments in order, so its order is the global docids'), deleted documents never entering
  it, block-max pruning across segments; a call per segment cost 2.5x the merged index with 10 small deltas;
- on the others (and on cpu with ``per_segment``), one backend call per segment (``Backend.search_terms(avgdl=)``),
  each segment asked for more than k (its deleted share, then doubling up to k + its deleted count, which always
  suffices) until k live hits or all its matches are in hand, deleted ones dropped, the lists merged;
- each hit maps to its global docid (its place in last-written order: the fresh build's docid) and the best k
  rank by score, then docid: the fresh build's order, ties included.
"""
from __future__ import annotations

import contextlib
import heapq
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer import bm25
from indexer.bm25 import QueryTerms
from indexer.segments import SMALL_SEGMENT, LiveIndex, Snapshot, open_live
from ragserve.kernels.contract import Backend, SearchError, StageTimes, TopK
from ragserve.kernels.registry import get_backend_class, resolve_backend_name
from ragserve.retrieval.contract import MAX_K, Hit, Retriever, bm25_params


class LiveView:
    """What callers read from ``Searcher.index``, for the current snapshot (passages, counts, the path)."""

    def __init__(self, searcher: "LiveSearcher") -> None:
        self._s = searcher

    @property
    def path(self) -> Path:
        return self._s.live.path

    @property
    def num_docs(self) -> int:
        return self._s.live.snapshot().num_docs

    @property
    def manifest(self) -> dict:
        snap = self._s.live.snapshot()
        return {"format": "ragserve-live", "generation": snap.generation, "bm25": snap.settings["bm25"],
                "analyzer": snap.settings["analyzer"],
                "stats": {"num_docs": snap.num_docs, "doc_count": snap.doc_count, "sum_total_tf": snap.sum_total_tf,
                          "avgdl": float(snap.avgdl)},
                "segments": [{"name": s.name, "docs": s.reader.num_docs, "deleted": int(s.deleted.size)}
                             for s in snap.segments]}

    def document(self, docid: int) -> tuple[str, str]:
        return self._s.live.snapshot().document(docid)

    def external_id(self, docid: int) -> str:
        return self._s.live.snapshot().external_id(docid)


class _Store:
    """A hit's passage source: the snapshot it was found in (a later merge does not move it)."""

    __slots__ = ("snap",)

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def document(self, docid: int) -> tuple[str, str]:
        return self.snap.document(docid)


class SnapshotPins:
    """The snapshots searches are reading, counted, so that a refresh keeps their segments' resources until the
    last search on them ends. Shares its owner's lock."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._uses: dict[int, list] = {}  # id(snapshot) -> [snapshot, searches using it]

    @contextlib.contextmanager
    def pin(self, snap: Snapshot):
        key = id(snap)
        with self._lock:
            use = self._uses.get(key)
            if use is None:
                self._uses[key] = [snap, 1]
            else:
                use[1] += 1
        try:
            yield
        finally:
            with self._lock:
                use = self._uses[key]
                use[1] -= 1
                if not use[1]:
                    del self._uses[key]

    def segments(self, current: Snapshot) -> set[str]:
        """Names of the segments ``current`` and the pinned snapshots hold (the caller holds the lock)."""
        return {s.name for sn in [current, *(u[0] for u in self._uses.values())] for s in sn.segments}


class LiveSearcher(Retriever):
    """A ``Retriever`` with ``Searcher``'s extras (``index``, ``backend``, ``analyze``) over a live index: one
    backend per segment, opened when a snapshot first shows the segment, closed once no snapshot in use holds it.
    Exact: a fresh build of the live documents, in last-written order, ranks the same ids, order and score bits."""

    kind = "bm25"
    exact = True
    takes_bm25_params = True
    queue = None  # no batching queue: each search runs on its caller's thread

    def __init__(self, live: LiveIndex | str | Path, backend: str = "cpu", per_segment: bool = False,
                 **backend_options) -> None:
        """``per_segment``: on cpu too, a backend call per segment and a merge of their lists (the other backends'
        way; on cpu only a reference for the one-call path, which is faster)."""
        # Anything with ``snapshot()``, ``on_refresh()`` and ``path`` serves (a LiveIndex; a benchmark's pinned
        # snapshot). One opened here is closed with the searcher.
        self._owns_live = not hasattr(live, "snapshot")
        self.live = open_live(live) if self._owns_live else live
        self.backend_name = resolve_backend_name(backend)
        if self.backend_name not in ("cpu", "gpu", "fpga", "fpga-sim"):
            raise SearchError(f"backend {self.backend_name!r} does not search live indexes")
        self._one_call = self.backend_name == "cpu" and not per_segment
        self._cls = get_backend_class(self.backend_name)
        self._options = backend_options
        # The most hits one backend call may return while a segment is over-asked for its deleted share: the
        # backend's declared limit where its kernel holds fewer than MAX_K (the FPGA's 1024); else any number
        # (k + a segment's deleted count may pass MAX_K, which bounds the caller's k, not the kernel's).
        self._call_k = self._cls.max_k if self._cls.max_k < MAX_K else math.inf
        self._lock = threading.Lock()
        self._backends: dict[str, tuple[Backend, threading.Lock | None]] = {}
        self._pins = SnapshotPins(self._lock)
        self._maxqs: dict[str, np.ndarray] = {}  # per segment: each term's largest blk_maxq (the skip bound)
        self._ratios: dict[tuple[str, float], float] = {}
        self._plans: dict[int, tuple[Snapshot, list]] = {}
        self._sets: dict[tuple, tuple] = {}
        self.skipped = 0  # per-segment calls: (query, segment) pairs skipped, the segment unable to reach the top-k
        self.index = LiveView(self)
        self._sync(self.live.snapshot())
        self.live.on_refresh(self._sync)

    @property
    def max_k(self) -> int:
        return min(MAX_K, self._cls.max_k)

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @property
    def backend(self) -> Backend:
        """A backend to describe (the first segment's)."""
        with self._lock:
            return next(iter(self._backends.values()))[0] if self._backends else _NoSegments(self.backend_name)

    # -- backends per segment -------------------------------------------------------------------
    def _sync(self, snap: Snapshot) -> None:
        """Open the backends of the snapshot's new segments and, on cpu, its segment set (called before the index
        publishes it: no search pays for that), and close those of segments gone from it that no search is using
        (nor the snapshot still current)."""
        for s in snap.segments:
            self._backend(s)
        names = {s.name for s in snap.segments}
        with self._lock:
            busy = self._pins.segments(self.live.snapshot())
            gone = [n for n in self._backends if n not in names and n not in busy]
            closing = [self._backends.pop(n)[0] for n in gone]
            for n in gone:
                self._maxqs.pop(n, None)
            if gone:
                self._plans.clear()
                self._sets.clear()
        for be in closing:
            be.close()
        if self._one_call:  # built here, at the refresh, rather than by the first search after it
            self._segment_set(snap, snap.k1, snap.b)

    def _backend(self, seg) -> tuple[Backend, threading.Lock | None]:
        got = self._backends.get(seg.name)
        if got is None:
            options = self._options
            n = seg.reader.num_docs
            if self.backend_name == "cpu" and "tuning" not in options and n < SMALL_SEGMENT:
                # A delta segment: huge-page copies (2 MiB an array at least) would cost more than they save, and a
                # window as large as the segment is enough. Plain copies, not the file maps: the one-call search
                # takes arrays in memory.
                from ragserve.kernels.cpu.backend import CpuTuning

                options = {**options, "tuning": CpuTuning(huge_pages=False, window=max(64, 1 << (n - 1).bit_length()))}
            be = self._cls(seg.reader, **options)
            with self._lock:
                got = self._backends.setdefault(seg.name, (be, None if be.thread_safe else threading.Lock()))
            if got[0] is not be:
                be.close()
        return got

    # -- search ----------------------------------------------------------------------------------
    def analyze(self, query: str) -> QueryTerms:
        """The query's live terms (ids are positions in its term list: a live index has no global term ids)."""
        q = self.live.snapshot().prepare(query)
        return QueryTerms(term_ids=np.arange(len(q.terms), dtype=np.uint32), boosts=q.boosts, weights=q.weights)

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None, deadline: float | None = None) -> list[list[Hit]]:
        """``deadline`` is taken as ``Searcher`` takes it and never passes: without a queue, work starts at once."""
        return self.search_in(self.live.snapshot(), queries, k, k1, b, with_text, times)

    def search_in(self, snap: Snapshot, queries: list[str], k: int, k1: float | None = None, b: float | None = None,
                  with_text: bool = False, times: StageTimes | None = None) -> list[list[Hit]]:
        """``search_batch`` over the snapshot ``snap`` (hybrid search pins one for both of its rankings)."""
        k1, b = bm25_params(snap, k1, b)  # the snapshot's k1 and b where not given (a live index has no reader)
        with self._pins.pin(snap):
            t0 = time.perf_counter()
            prepared = [snap.prepare(q) for q in queries]
            t1 = time.perf_counter()
            found = self.search_prepared(snap, prepared, k, k1, b, times)
            t2 = time.perf_counter()
            store = _Store(snap)
            out = []
            for f in found:
                top = f.top
                hits = [Hit(d, i, s) for d, i, s in zip(top.docids.tolist(), self.external_ids(snap, f),
                                                         top.scores.tolist())]
                if with_text:
                    for h in hits:
                        h._store = store
                out.append(hits)
            if times is not None:
                times.prepare += t1 - t0
                times.retrieval += time.perf_counter() - t2
            return out

    def _plan(self, snap: Snapshot) -> list[tuple]:
        """Per snapshot, once: its segments with live documents, largest first (the first one's k-th score lets the
        small ones be skipped when they cannot reach it), each as (index, segment, backend, lock, documents,
        deleted, term max q, ratio of the live norm cache to its own)."""
        got = self._plans.get(id(snap))
        if got is not None and got[0] is snap:
            return got[1]
        order = sorted((si for si, s in enumerate(snap.segments) if s.n_live),
                       key=lambda si: -snap.segments[si].reader.num_docs)
        plan = []
        for si in order:
            seg = snap.segments[si]
            be, lock = self._backend(seg)
            plan.append((si, seg, be, lock, seg.reader.num_docs, int(seg.deleted.size), self._maxq(seg),
                         self._ratio(seg, snap.avgdl)))
        if len(self._plans) > 8:
            self._plans.clear()
        self._plans[id(snap)] = (snap, plan)
        return plan

    def search_prepared(self, snap: Snapshot, queries: list, k: int, k1: float, b: float,
                        times: StageTimes | None = None) -> list["Found"]:
        """The exact top-k (global docids, f32 scores) of each prepared query (``Snapshot.prepare``), with the
        segment and local docid of each hit."""
        if self._one_call:
            got = self._segment_set(snap, k1, b)
            if got is not None:
                return self._search_set(snap, got, queries, k, times)
        return self._search_each(snap, queries, k, k1, b, times)

    def _segment_set(self, snap: Snapshot, k1: float, b: float) -> tuple | None:
        """Per snapshot and (k1, b), once: the cpu ``SegmentSet`` of its segments with live documents, their
        indexes in the snapshot, and how many of them lead before the trailing run of small segments it searches
        as one (``SegmentSet(fold=)``: the deltas' term metadata in one place, where ten apart cost ten times one);
        None where a backend keeps its arrays in file maps, e.g. a ``tuning`` with ``resident=False``: then a call
        per segment."""
        key = (id(snap), float(k1), float(b))
        got = self._sets.get(key)
        if got is not None and got[0] is snap:
            return got[1]
        from ragserve.kernels.cpu.segments import SegmentSet

        sis = [si for si, s in enumerate(snap.segments) if s.n_live]
        out = None
        if sis:
            bes = [self._backend(snap.segments[si])[0] for si in sis]
            if all(SegmentSet.can_search(be) for be in bes):
                sizes = [snap.segments[si].reader.num_docs for si in sis]
                head = len(sis)
                while head and sizes[head - 1] < SMALL_SEGMENT:
                    head -= 1
                fold = None
                if len(sis) - head >= 2:
                    small, row, ids, _ = snap.small_terms
                    col = {si: c for c, si in enumerate(small.tolist())}
                    maps = []
                    for si in sis[head:]:  # each small segment's term id -> row of the shared vocabulary
                        c = col[si]
                        r = np.flatnonzero(ids[:, c] >= 0)
                        m = np.empty(snap.segments[si].reader.vocab_size, np.int64)
                        m[ids[r, c]] = r
                        maps.append(m)
                    fold = (head, maps, len(row))
                parts = [(be, snap.segments[si].deleted_mask) for be, si in zip(bes, sis)]
                sset = SegmentSet(parts, k1, b, snap.avgdl, seed_part=int(np.argmax(sizes)), fold=fold)
                folded = sset.rows < len(sis)  # then its first rows - 1 segments are searched each on its own
                out = (sset, np.array(sis, np.int64), sset.rows - 1 if folded else None)
        if len(self._sets) > 8:
            self._sets.clear()
        self._sets[key] = (snap, out)
        return out

    def _search_set(self, snap: Snapshot, got: tuple, queries: list, k: int,
                    times: StageTimes | None) -> list["Found"]:
        sset, sis, head = got
        firsts = sset.firsts
        todo = [i for i, q in enumerate(queries) if q.terms]
        if head is not None:  # the leading segments' term ids, then the folded ones' shared rows
            terms = [np.vstack((queries[i].local[sis[:head]], queries[i].small_rows[None])) for i in todo]
        elif sis.size == len(snap.segments):
            terms = [queries[i].local for i in todo]
        else:
            terms = [queries[i].local[sis] for i in todo]
        tops = sset.search(terms, [queries[i].weights for i in todo], k, times)
        e = np.zeros(0, np.int64)
        out = [Found(TopK(e, np.zeros(0, np.float32)), e, e) for _ in queries]
        for i, top in zip(todo, tops):
            raw = top.docids
            part = np.searchsorted(firsts, raw, side="right") - 1
            loc = raw - firsts[part]
            segs = sis[part]
            glob = snap.offsets[segs] + loc
            for si in np.unique(segs).tolist():  # live ranks where a segment has deleted documents
                seg = snap.segments[si]
                if seg.deleted.size:
                    at = segs == si
                    glob[at] = snap.offsets[si] + seg.live_rank(loc[at])
            out[i] = Found(TopK(glob, top.scores), segs, loc)
        return out

    def _search_each(self, snap: Snapshot, queries: list, k: int, k1: float, b: float,
                     times: StageTimes | None) -> list["Found"]:
        """A backend call per segment (the gpu and fpga way), the lists merged."""
        parts: list[list[tuple]] = [[] for _ in queries]
        best: list[list[float]] = [[] for _ in queries]  # each query's k best scores so far (a min-heap)
        prune = np.float32(k1) == np.float32(snap.k1) and np.float32(b) == np.float32(snap.b)
        weights = [q.weights.tolist() for q in queries]
        for si, seg, be, lock, n, dead, mq, r in self._plan(snap):
            todo = []
            for i, q in enumerate(queries):
                if not q.terms:
                    continue
                if prune and len(best[i]) == k:
                    # An upper bound on any score in the segment: per term its largest q there, scaled to the live
                    # avgdl as the cpu backend scales its bounds, in w - w / (1 + q), summed, with a margin for
                    # the f32 rounding. Only a bound strictly below the k-th score skips (ties are kept).
                    bound = 0.0
                    for w, t in zip(weights[i], q.local[si].tolist()):
                        if t >= 0:
                            x = mq.item(t) * r
                            bound += w * x / (1.0 + x)
                    if bound * (1.0 + 1e-5) < best[i][0]:
                        self.skipped += 1
                        continue
                t = snap.segment_terms(q, si)
                if t is not None:
                    todo.append((i, t))
            if not todo:
                continue
            # The expected share of deleted hits and a margin (then doubling), never beyond k + dead: enough.
            full = min(n, k + dead)  # asking for this many always yields k live hits, or all there are
            ks = full if not dead else min(full, math.ceil(k / max(1e-9, 1.0 - dead / n) * 1.1) + 2)
            ks = min(ks, self._call_k)
            while todo:
                tops = self._call(be, lock, [t for _, t in todo], ks, k1, b, times, snap.avgdl)
                again = []
                for (i, t), top in zip(todo, tops):
                    docs, scores = top.docids, top.scores
                    if dead:
                        keep = ~seg.is_deleted(docs)
                        docs, scores = docs[keep], scores[keep]
                    if docs.size >= k or top.docids.size < ks or ks >= full:
                        docs, scores = docs[:k], scores[:k]
                        parts[i].append((snap.offsets[si] + seg.live_rank(docs), scores, si, docs))
                        if prune:
                            h = best[i]
                            for x in scores.tolist():
                                if len(h) < k:
                                    heapq.heappush(h, x)
                                elif x > h[0]:
                                    heapq.heapreplace(h, x)
                    else:
                        again.append((i, t))
                todo = again
                if todo and ks >= self._call_k:
                    raise SearchError(f"segment {seg.name} holds {dead} deleted documents, too many to find k={k} "
                                      f"live hits within the {self.backend_name} backend's {self._call_k} per call; "
                                      f"merge the index (ragserve merge) or ask for a smaller k")
                ks = min(full, 2 * ks, self._call_k)
        return [_best(p, k) for p in parts]

    def _maxq(self, seg) -> np.ndarray:
        """Each term's largest ``blk_maxq`` in the segment (0 for a term without postings)."""
        got = self._maxqs.get(seg.name)
        if got is None:
            out = np.zeros(seg.reader.vocab_size, np.float32)
            for sh in seg.reader.shards:
                mq = np.append(np.asarray(sh.blk_maxq, np.float32), np.float32(0))
                tp = np.asarray(sh.term_ptr, np.int64)
                red = np.maximum.reduceat(mq, tp[:-1])  # a term's entries are tp[t]..tp[t+1]-1
                out = np.maximum(out, np.where(tp[1:] > tp[:-1], red, np.float32(0)))
            got = self._maxqs[seg.name] = out
        return got

    def _ratio(self, seg, avgdl: np.float32) -> float:
        """The largest ratio of the norm cache under the live avgdl to the segment's own, with a margin (inf where
        there is none: then nothing is skipped)."""
        key = (seg.name, float(avgdl))
        got = self._ratios.get(key)
        if got is None:
            ix = seg.reader
            own = bm25.norm_cache(ix.k1, ix.b, ix.avgdl).astype(np.float64)
            new = bm25.norm_cache(ix.k1, ix.b, avgdl).astype(np.float64)
            ok = np.all(np.isfinite(own)) and np.all(np.isfinite(new)) and np.all(own > 0)
            got = float((new / own).max()) * (1.0 + 2.0**-20) if ok else math.inf
            if len(self._ratios) > 4096:
                self._ratios.clear()
            self._ratios[key] = got
        return got

    @staticmethod
    def external_ids(snap: Snapshot, found: "Found") -> list[str]:
        """The hits' external ids, read segment by segment (one gather each)."""
        out: list[str] = [""] * found.top.docids.size
        for si in np.unique(found.segments).tolist():
            at = np.flatnonzero(found.segments == si)
            for j, i in zip(at.tolist(), snap.segments[si].reader.external_ids(found.locals[at])):
                out[j] = i
        return out

    @staticmethod
    def _call(be: Backend, lock: threading.Lock | None, qs: list[QueryTerms], k: int, k1: float, b: float,
              times: StageTimes | None, avgdl: np.float32) -> list[TopK]:
        if lock is None:
            return be.search_terms(qs, k, k1, b, times, avgdl=avgdl)
        with lock:
            return be.search_terms(qs, k, k1, b, times, avgdl=avgdl)

    def close(self) -> None:
        with self._lock:
            backends = [be for be, _ in self._backends.values()]
            self._backends.clear()
            self._sets.clear()
            self._plans.clear()
        for be in backends:
            be.close()
        if self._owns_live:
            self.live.close()


@dataclass
class Found:
    """A query's top-k over the live index, and where each hit lives."""

    top: TopK  # global docids (the fresh build's), f32 scores, best first
    segments: np.ndarray  # int64: the segment of each hit in the snapshot
    locals: np.ndarray  # int64: its docid in that segment


def _best(parts: list[tuple], k: int) -> Found:
    """The best k of the segments' lists: score descending, then global docid ascending (the fresh build's tie
    order). One u64 key per hit, (~score bits) << 32 | docid, as ``merge_shards`` ranks FPGA shards."""
    if not parts:
        e = np.zeros(0, np.int64)
        return Found(TopK(e, np.zeros(0, np.float32)), e, e)
    if len(parts) == 1:  # one segment's list: already in score, then docid, order
        g, sc, si, loc = parts[0]
        return Found(TopK(docids=g.astype(np.int64), scores=sc.astype(np.float32)), np.full(g.size, si, np.int64),
                     loc.astype(np.int64))
    docs = np.concatenate([p[0] for p in parts]).astype(np.uint64)
    scores = np.concatenate([p[1] for p in parts]).astype(np.float32)
    segs = np.concatenate([np.full(p[0].size, p[2], np.int64) for p in parts])
    locs = np.concatenate([p[3] for p in parts]).astype(np.int64)
    key = ((np.uint64(0xFFFFFFFF) - scores.view(np.uint32).astype(np.uint64)) << np.uint64(32)) | docs
    order = np.argsort(key, kind="stable")[:k]
    return Found(TopK(docids=docs[order].astype(np.int64), scores=scores[order]), segs[order], locs[order])


class _NoSegments:
    """``backend`` of an empty live index (nothing to describe yet)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self) -> dict:
        return {"backend": self.name, "segments": 0}
