"""GPU selection stage: the exact top-k of each query, with the ranking rule of ``FORMAT.md`` (score descending, then
docid ascending), from what the relevancy stage left.

Both paths first find a threshold per row that at least k matched documents reach (a lower bound of the k-th score),
then take every doc scoring at least that threshold (ties included) as a candidate, and rank the candidates.

Dense path (``select_topk``, torch ops, any device), from f64 accumulator rows; two ways to the threshold:
- ``topk``: the row's exact k-th largest f32 score, from ``torch.topk`` (whose tie order is arbitrary, hence
  only its value is used);
- ``blockmax``: the k-th largest of the maxima of groups of ``GROUP`` consecutive docs. At least k groups,
  so at least k docs, reach it, so it is <= the k-th score: a lower bound found in a 1/GROUP-sized array.
  Candidates are then at most GROUP times the number of groups reaching it (plus ties).

Rows of dense scores (``topk_rows``: dense vectors' inner products): exact top-k with ties broken by position, as on
every device.

Tiled path (``TileSelector``), from the tile scorer's group and tile maxima and kept scores: the threshold is the k-th
largest tile maximum (k tiles have a doc scoring at least this; ``kth_largest``'s radix select on CUDA, ``torch.topk``
under Triton), and a collect kernel reads only the groups whose maximum reaches it and clears the maxima it read: they
are zero at rest, so a batch starts with no zeroing. A single query's candidates are ranked on the device (up to
``SORT_MAX``; the host's ranking of 1,000 took ~130 us on the H200 machine's host) and land in a pinned head the host
reads; a batch's come back with their count in one transfer and are ranked on the host (up to ``host_rank_max``), or
by a device sort beyond.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from numba import njit

from ragserve.kernels.contract import TopK
from ragserve.kernels.gpu.cuda import kernels as CK
from ragserve.kernels.gpu.relevancy import TileScorer
from ragserve.kernels.gpu.settings import GpuSettings

TINY = float(np.finfo(np.float32).smallest_subnormal)  # the smallest positive f32 score
GROUP = 32
METHODS = ("blockmax", "topk")


def _threshold(scores: torch.Tensor, k: int, method: str) -> torch.Tensor:
    rows, num_docs = scores.shape
    if method == "blockmax" and num_docs >= GROUP * k:
        full = num_docs // GROUP * GROUP
        maxima = scores[:, :full].view(rows, -1, GROUP).amax(dim=2)
        if full < num_docs:
            maxima = torch.cat((maxima, scores[:, full:].amax(dim=1, keepdim=True)), dim=1)
        return torch.topk(maxima, k, dim=1, largest=True, sorted=False).values.min(dim=1).values
    return torch.topk(scores, min(k, num_docs), dim=1, largest=True, sorted=False).values.min(dim=1).values


def ranked(rows: int, k: int, r: torch.Tensor, d: torch.Tensor, s: torch.Tensor) -> list[TopK]:
    """Candidates (row, doc, score), already ordered by (row, doc), ranked per row and cut at k."""
    # Positive f32 scores order like their bit patterns; a stable sort keeps docid order among ties.
    key = (r << 32) | (0x7FFFFFFF - s.view(torch.int32).long())
    key, order = torch.sort(key, stable=True)
    out = torch.stack((key, d[order])).cpu().numpy()  # one transfer
    r = out[0] >> 32
    s = (0x7FFFFFFF - (out[0] & 0xFFFFFFFF)).astype(np.int32).view(np.float32)
    bounds = np.searchsorted(r, np.arange(rows + 1))
    return [TopK(out[1, bounds[i]:min(bounds[i] + k, bounds[i + 1])].astype(np.int64),
                 s[bounds[i]:min(bounds[i] + k, bounds[i + 1])].copy()) for i in range(rows)]


def select_topk(acc: torch.Tensor, k: int, method: str = "blockmax") -> list[TopK]:
    """Top-k of each row of ``acc`` (f64 sums, 0 = doc not matched), best first; zeroes ``acc`` for reuse."""
    rows, num_docs = acc.shape
    scores = acc.to(torch.float32)
    acc.zero_()
    kth = _threshold(scores, k, method)
    # Only matched docs (score > 0) rank; a row with fewer than k of them keeps them all.
    r, d = (scores >= kth.clamp_min(TINY)[:, None]).nonzero(as_tuple=True)  # row-major, docid ascending
    return ranked(rows, k, r, d, scores[r, d])


def topk_rows(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of each row of ``scores`` [m, n]: (indices int64, values) [m, min(k, n)], best first.

    ``torch.topk`` gives the k-th value; its tie order is arbitrary, so the entries are chosen again by rule:
    all above the k-th, then the first (by position) of those equal to it, as ``cpu.selection.topk_rows``.
    """
    s = scores if scores.dim() == 2 else scores[None]
    m, n = s.shape
    k = min(int(k), n)
    if k <= 0:
        return torch.zeros((m, 0), dtype=torch.int64, device=s.device), s[:, :0]
    kth = torch.topk(s, k, dim=1, largest=True, sorted=False).values.amin(dim=1, keepdim=True)
    gt = s > kth
    eq = s == kth
    need = k - gt.sum(dim=1, keepdim=True)
    take = gt | (eq & (torch.cumsum(eq, dim=1, dtype=torch.int32) <= need))
    idx = take.nonzero(as_tuple=True)[1].view(m, k)  # row-major: ascending positions within each row
    vals = torch.gather(s, 1, idx)
    vals, order = torch.sort(vals, dim=1, descending=True, stable=True)
    return torch.gather(idx, 1, order), vals


class TileSelector:
    """The selection launches and host buffers of the tiled path, over a ``TileScorer``'s outputs: ``start`` queues a
    batch's threshold, collect and read-back, ``finish`` waits for them and ranks. One caller at a time."""

    def __init__(self, scorer: TileScorer, max_rows: int, settings: GpuSettings) -> None:
        self.scorer, self.settings = scorer, settings
        device, copies = scorer.device, scorer.copies
        self.copies = copies
        self._thr = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self.found: torch.Tensor | None = None  # the collect kernel's count and (index, score bits) pairs
        # zeros: a head nothing was written to reads as no candidates
        self._head = torch.zeros(2 + 2 * settings.peek, dtype=torch.int64, pin_memory=scorer._pinned)
        self._head_np = self._head.numpy()
        self._head_f32 = self._head_np.view(np.float32)  # the device ranking's scores
        # where rank_candidates writes a single query's count and keys: the pinned head itself
        self.head_dev = copies.device_address(self._head.data_ptr()) if copies is not None else 0
        self.head_back = copies.event() if copies is not None else None  # after the candidates' read-back
        # Candidates past the first peek come back on a side stream, beside the next batch's scoring.
        self._side = copies.stream() if copies is not None else 0
        self._rest_back = copies.event() if copies is not None else None
        self._rest_host: torch.Tensor | None = None
        # rows, k, capacity, peek of a started top-k, and whether the device ranks it (one row: into the pinned head)
        self.started: tuple[int, int, int, int, bool] | None = None

    def found_room(self, capacity: int) -> torch.Tensor:
        """The collect kernel's output with room for ``capacity`` candidates."""
        if self.found is None or self.found.numel() < 2 + 2 * capacity:
            self.found = torch.empty(2 + 2 * capacity, dtype=torch.int64, device=self.scorer.device)
        return self.found

    def _collect(self, rows: int, k: int, capacity: int) -> torch.Tensor:
        """Candidates of the rows scored since ``begin``: the count at [0], (index, score bits) pairs from [2]. The
        threshold is the k-th largest tile maximum (k tiles have a doc scoring at least this: a lower bound of the
        k-th score). Clears the maxima."""
        sc = self.scorer
        found, kn = self.found_room(capacity), sc.kernels
        if kn is not None:
            tile_maxima, thr, out = sc.tile_maxima.data_ptr(), self._thr.data_ptr(), found.data_ptr()
            kn.kth(rows, CK.KTH_THREADS, tile_maxima, sc.n_tiles, k, thr, out, stream=sc.stream)
            kn.collect((-(-sc.n_groups // CK.COLLECT_GROUPS), rows), CK.COLLECT_THREADS, sc.scores.data_ptr(),
                       sc.maxima.data_ptr(), tile_maxima, thr, sc.num_docs, sc.n_groups, sc.n_tiles, out,
                       capacity, sc.running.data_ptr(), stream=sc.stream)
        else:
            thr = self._thr[:rows]
            if sc.n_tiles > k:
                thr = torch.topk(sc.tile_maxima[:rows], k, dim=1, sorted=False).values.amin(dim=1)
            found[:1].zero_()
            from ragserve.kernels.gpu.triton.selection import _collect_kernel

            grid = (-(-sc.n_groups // CK.COLLECT_GROUPS), rows)
            _collect_kernel[grid](sc.scores, sc.maxima, sc.tile_maxima, thr, TINY, sc.num_docs, sc.n_groups,
                                  sc.n_tiles, found, capacity, NGB=CK.COLLECT_GROUPS, SUB=self.settings.collect_sub,
                                  GROUP_=sc.group, TILE=sc.tile)
        sc.cleared()
        return found

    def start(self, rows: int, k: int) -> None:
        """Queue the selection of the rows scored since ``begin`` (threshold, collect, the read-back of the count
        and the first candidates); ``finish`` waits for it. The next batch may be scored in between: the
        collect has read and cleared what it needs."""
        self._start(rows, k, self.capacity(rows, k))

    def capacity(self, rows: int, k: int) -> int:
        return max(self.settings.min_capacity, self.settings.candidates_per_hit * k * rows)

    def peek(self, rows: int, k: int, capacity: int) -> int:
        # About k a row reach the threshold (more at large k, where the tiles' maxima bound it loosely).
        s = self.settings
        return min(capacity, s.peek, max(s.peek_min, s.peek_per_hit * k * rows))

    def _start(self, rows: int, k: int, capacity: int) -> None:
        on_device = self.queue(rows, k, capacity)
        if self.copies is not None:
            self.copies.record(self.head_back, self.scorer.stream)
        self.started = (rows, k, capacity, self.peek(rows, k, capacity), on_device)

    def queue(self, rows: int, k: int, capacity: int) -> bool:
        """Queue the threshold, the collect and the count and first candidates to the host: a single query's ranked by
        ``rank_candidates``, which writes the count and the first docs and scores to the pinned head itself (layout:
        ``_rank_room``); otherwise the (index, score bits) pairs in one transfer. Returns whether the device ranks."""
        found = self._collect(rows, k, capacity)
        peek = self.peek(rows, k, capacity)
        stream = self.scorer.stream
        if rows == 1 and self.scorer.kernels is not None:
            self.scorer.kernels.rank(CK.RANK_BLOCKS, CK.RANK_THREADS, found.data_ptr(), capacity, self.head_dev, k,
                                     _rank_room(peek), stream=stream)
            return True
        if self.copies is not None:
            self.copies.to_host(self._head.data_ptr(), found.data_ptr(), 8 * (2 + 2 * peek), stream)
        else:
            self._head[:2 + 2 * peek].copy_(found[:2 + 2 * peek])
        return False

    def finish(self, rescore: Callable[[], None]) -> tuple[list[TopK], bool]:
        """Top-k of the started rows, best first (FORMAT.md's ranking rule), and whether they were scored again:
        when more candidates reach the threshold than there is room for, ``rescore()`` must score the batch again
        (after ``begin``; the first collect cleared the maxima, and a batch scored since is overwritten)."""
        rows, k, capacity, peek, on_device = self.started
        rescored = False
        while True:
            if self.copies is not None:
                self.copies.wait_event(self.head_back)
            head = self._head_np[:2 + 2 * peek]
            total = int(head[0])
            if total <= capacity:
                break
            rescore()
            rescored = True
            self._start(rows, k, total)
            rows, k, capacity, peek, on_device = self.started
        self.started = None
        found = self.found
        n = min(k, total)
        room = _rank_room(peek)
        if on_device and total <= CK.SORT_MAX and n <= room:  # ranked on the device: the first n docs and scores
            scores = self._head_f32[2 * (2 + room):2 * (2 + room) + n]
            return [TopK(head[2:2 + n].copy(), scores.copy())], rescored
        num_docs = self.scorer.num_docs
        if total <= self.settings.host_rank_max:  # ranked on the host
            pairs = head if total <= peek and not on_device else self._read_back(2 + 2 * total)
            return _rank_host(rows, k, num_docs, pairs[2:2 + 2 * total:2], pairs[3:3 + 2 * total:2]), rescored
        idx, order = torch.sort(found[2:2 + 2 * total:2])  # collected in no order: (row, doc) ascending first
        score = found[3:3 + 2 * total:2].to(torch.int32).view(torch.float32)
        r = idx // num_docs
        return ranked(rows, k, r, idx - r * num_docs, score[order]), rescored

    def _read_back(self, n: int) -> np.ndarray:
        """The first ``n`` words of the collect kernel's output on the host. On CUDA through a side stream that waits
        only for the collect: the next batch, already queued on the caller's stream, is scored meanwhile."""
        if self.copies is None:
            return self.found[:n].cpu().numpy()
        if self._rest_host is None or self._rest_host.numel() < n:
            self._rest_host = torch.empty(max(n, 2 * (0 if self._rest_host is None else self._rest_host.numel())),
                                          dtype=torch.int64, pin_memory=self.scorer._pinned)
        self.copies.after(self._side, self.head_back)
        self.copies.to_host(self._rest_host.data_ptr(), self.found.data_ptr(), 8 * n, self._side)
        self.copies.record(self._rest_back, self._side)
        self.copies.wait_event(self._rest_back)
        return self._rest_host[:n].numpy()


def _rank_room(peek: int) -> int:
    """Results ``rank_candidates`` writes to the head when it has room for 2 + 2 * ``peek`` words: a word a doc from
    word 2, half a word a score from word 2 + the room."""
    return 4 * peek // 3


@njit(cache=True, nogil=True)
def _rank_keys(rows: int, k: int, num_docs: int, idx: np.ndarray, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first k candidates by (score desc, doc asc), rows one after the other, as keys
    ``(0x7FFFFFFF - score bits) << 32 | doc`` (positive f32 scores order like their bits); and the rows' bounds."""
    counts = np.zeros(rows + 1, np.int64)
    for i in range(idx.size):
        counts[idx[i] // num_docs + 1] += 1
    for r in range(rows):
        counts[r + 1] += counts[r]
    keys = np.empty(idx.size, np.int64)
    fill = counts[:-1].copy()
    for i in range(idx.size):
        r = idx[i] // num_docs
        keys[fill[r]] = ((0x7FFFFFFF - bits[i]) << 32) | (idx[i] - r * num_docs)
        fill[r] += 1
    out = np.empty(idx.size, np.int64)
    bounds = np.zeros(rows + 1, np.int64)
    for r in range(rows):
        seg = keys[counts[r]:counts[r + 1]]
        if seg.size > k:  # keys are distinct: the k smallest, then only they sorted
            seg = np.partition(seg, k - 1)[:k]
        seg = np.sort(seg)
        out[bounds[r]:bounds[r] + seg.size] = seg
        bounds[r + 1] = bounds[r] + seg.size
    return out[:bounds[rows]], bounds


def _rank_host(rows: int, k: int, num_docs: int, idx: np.ndarray, bits: np.ndarray) -> list[TopK]:
    """``ranked`` on the host: candidates (row * num_docs + doc, score bits) by (row, score desc, doc asc), each row
    cut at k."""
    keys, bounds = _rank_keys(rows, k, num_docs, np.ascontiguousarray(idx), np.ascontiguousarray(bits))
    ranked_all = _of_keys(keys)
    return [TopK(ranked_all.docids[a:b], ranked_all.scores[a:b])
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


def _of_keys(keys: np.ndarray) -> TopK:
    """Docs and scores of ranking keys ``(0x7FFFFFFF - score bits) << 32 | doc`` (``_rank_keys``'s), in their
    order."""
    return TopK(keys & 0xFFFFFFFF, (0x7FFFFFFF - (keys >> 32)).astype(np.int32).view(np.float32))


def topk_rows_radix(scores: torch.Tensor, k: int, sort: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_rows`` by the Triton radix select of ``triton/selection.py`` (the same entries; on a GPU, one pass
    per 11 bits of the scores, no host round trip). ``sort=False`` returns the same set unranked."""
    from ragserve.kernels.gpu.triton.selection import radix_topk

    return radix_topk(scores, k, sort)


def topk_rows_bucket(scores: torch.Tensor, k: int, sort: bool = True,
                     offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_rows`` by the Triton bucket select of ``triton/selection.py`` (the same entries; four launches
    whatever the row length), indices counted from ``offset``. ``sort=False`` returns the same set in position
    order."""
    from ragserve.kernels.gpu.triton.selection import BUCKET, bucket_topk

    return bucket_topk(scores, k, sort, BUCKET, offset)
