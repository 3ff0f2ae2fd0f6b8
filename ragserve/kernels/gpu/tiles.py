"""Tiled BM25 scoring and top-k on CUDA (Triton): no f64 accumulator row ever goes to device memory.

The doc space is cut into tiles of ``TILE`` docs inside the layout's doc blocks. One program scores one
(query, tile) at a time into its own ``TILE``-cell f64 scratch (16 KiB: it stays in L1/L2), adding the
query's terms one after the other in ascending term id, so every sum is the canonical one of
``indexer/FORMAT.md`` and the scores equal the CPU backend's bit for bit with no atomics. From the tile it
writes the f32 maximum of each group of ``GROUP`` docs and the f32 scores of the groups that matched. The
device traffic is the postings, the norms they touch, and 4 bytes per matched doc plus the group maxima,
instead of a dense f64 row's 16 bytes per posting and 24 per doc.

Then per query: the threshold is the k-th largest tile maximum (at least k tiles, so at least k docs, reach
it: a lower bound of the k-th score), and a collect kernel reads only the groups whose maximum reaches it, and
clears the maxima it read: they are zero at rest, so a batch starts with no zeroing.

On CUDA the kernels are ``gpu_tiles_cuda``'s (same inputs, outputs and order; the tile in shared memory, 2.2x
faster; the threshold by radix select), where NVRTC can be loaded; the Triton kernels below (with ``torch.topk``
for the threshold) are the fallback and the version CI runs under Triton's interpreter. Either writes scores only
for the groups that can hold one of the tile's k best docs. Where a launch has enough units, the CUDA scorer first
scores a sample of them (``sample_step``): the k-th largest of a row's sampled tile maxima is reached by k docs.
Where few tiles can reach that threshold (``FILTER_RATIO``), a 2-byte pass over every unit (two tiles a block in half
the f64 tile's shared memory, so more blocks a multiprocessor) bounds each tile's maximum from above and lists the units
that may reach it; only they are scored in f64 and read out. Otherwise every unit is scored. Either way a tile whose
maximum falls below the threshold writes nothing. Every CUDA scoring launch also raises a running threshold from its
own finished tiles' maxima (``gpu_tiles_cuda.run_scan``): at large k, where no sample pays, later tiles skip their
read-out by it.

Where each term's postings for a tile begin is found first, for all (entry, tile) pairs at once, by a
vectorised binary search (``_bounds_kernel``); the scoring kernel then walks contiguous posting ranges.

A single query's latency is mostly host work around a hundred or two microseconds of kernels, so the host path is
lean: one compiled call plans a batch (``plan_queries``), the CUDA kernels launch through reused ctypes argument
holders, the plan and the first candidates travel through pinned buffers on the caller's stream, and a single
query's candidates are ranked on the device (up to ``SORT_MAX``; the host's ranking of 1,000 took ~130 us on the
H200 machine's host). A single query of up to ``QMAX`` terms is planned on the device (``plan_single``, from every
shard's ``term_ptr`` kept there: ``QueryTables``), and its copy, plan, scoring, selection and read-back are one
CUDA graph, captured once for each k and BM25 parameters (``start_query``): the host launches once instead of a
dozen times, and the device no longer waits between kernels for the host to launch the next.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from numba import njit

from indexer import bm25
from ragserve.kernels.gpu import tiles_cuda as TC
from ragserve.kernels.gpu.rtc import RtcError, StreamCopies, current_stream
from ragserve.kernels.gpu.planning import ItemPlanner, Items
from ragserve.kernels.gpu.selection import TINY, ranked
from indexer.bm25 import QueryTerms
from ragserve.kernels.contract import TopK

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheel of torch ships without Triton
    triton = None

TILE_MAX = 2048  # docs per tile: 16 KiB of f64 scratch per program
GROUP = 32  # docs per group maximum
CHUNK = 128  # postings per vector step: a term has ~0-1,000 postings in a tile, and idle lanes cost issue slots
COLLECT_GROUPS = TC.COLLECT_GROUPS  # groups per collect program (most have no group reaching the threshold)
COLLECT_SUB = 64  # groups read at once where some do
HOST_RANK_MAX = 1 << 15  # candidates ranked on the host up to this; a device sort beyond (1 << 20 measured slower)
PEEK = 4096  # candidates read back with their count in one transfer, at most; more take a second one
PEEK_PER_HIT, PEEK_MIN = 2, 256  # and no more than this many per hit asked for (H200: 4,096 took 2.5 us a query)
MIN_CAPACITY = 1 << 16  # candidates the collect kernel may append (grown and rerun when more reach the threshold)
CANDIDATES_PER_HIT = 4  # and at least this many per hit asked for
ENTRY_BLOCK = 16  # terms whose tile ranges are read at once
PROGRAMS_PER_SM = 16
NUM_WARPS = 4
# The CUDA scorer's sample: every S-th unit, S = SAMPLE_SCALE * sqrt(units a row / k); 0: none. H200, 21M docs, 64
# queries, with the threshold skipping the read-out only: 1 and 2 alike at k = 10 (scoring -25% MS MARCO, -18% NQ);
# 2 also samples k = 1000 there (-11%).
SAMPLE_SCALE = 2.0
MIN_SAMPLE_STEP = 4  # no sample when it would be more than a quarter of the units
# Nor for fewer units than this, unless the filter runs: the sample alone costs about what it saves (H200, the largest
# queries, scripts/bench_gpu_single.py: one at a time at 21M, ~10,400 units, 1-3% faster without it; two, or one at
# 100M, 3-18% with). With the filter, and a single query's launches in one graph, it pays there too: one run, k = 10
# 5-6% faster with it, k = 1000 (no filter) 4% slower.
SAMPLE_MIN_UNITS = 16384
# The 2-byte filter and a scoring of the units it lists, where at most 1 / FILTER_RATIO of the units are expected to
# reach the sample's threshold (H200, 21M docs, 64 queries, k = 10: scoring -15%, about 6% listed; where nearly all
# are, the filter's pass is added work: k = 1000 +50%).
FILTER_RATIO = 4
MAX_GRAPHS = 8  # single-query graphs kept (one for each k and BM25 parameters asked for lately)
RUNNING_THRESHOLD = True  # the CUDA scorer raises a row's threshold from its own tiles' maxima (``TC.run_scan``)
SCORER = "cuda"  # tile scoring kernel on CUDA devices: "cuda" (gpu_tiles_cuda, if NVRTC loads) or "triton"


def tile_size(block_size: int) -> int:
    """Tiles never straddle a doc block: the largest power of two <= TILE_MAX dividing the block size."""
    return min(block_size, TILE_MAX)


@dataclass
class TilePlan:
    """One launch's work, on the host: entries sorted by (row, block, term id), grouped into (row, block) pairs."""

    table: np.ndarray  # int64: start, count, weight bits (n_ent each), [pad], row, blk, i0, i1, shift (n_pairs each)
    n_ent: int
    n_pairs: int
    pairs_at: int  # index of the pair columns in ``table`` (16-byte aligned)
    max_count: int  # postings of the longest entry

    @property
    def rows(self) -> int:
        """Rows of the batch: pairs are sorted by row."""
        return int(self.table[self.pairs_at + self.n_pairs - 1]) + 1 if self.n_pairs else 0

    @staticmethod
    def of(planned: tuple) -> "TilePlan":
        """From ``_plan``'s (table, n_ent, n_pairs, pairs_at, max_count)."""
        table, n_ent, n_pairs, at, max_count = planned
        return TilePlan(table=table, n_ent=int(n_ent), n_pairs=int(n_pairs), pairs_at=int(at), max_count=int(max_count))


@njit(cache=True, nogil=True)
def _plan(e0, ne, shard, row, wbits, pbase, offsets, blk_start, blk_id, n_rows, n_blocks, row_shift):
    """Counting sort of the items' block entries by (row, block). Within a bucket they keep the items' order,
    which is ascending term id: a block lies in one shard, and a shard's items of a row come in term order."""
    counts = np.zeros(n_rows * n_blocks + 1, np.int64)
    total = 0
    for i in range(e0.size):
        g0 = offsets[shard[i]] + e0[i]
        for g in range(g0, g0 + ne[i]):
            counts[row[i] * n_blocks + np.int64(blk_id[g]) + 1] += 1
        total += ne[i]
    n_pairs = 0
    for b in range(1, counts.size):
        if counts[b]:
            n_pairs += 1
        counts[b] += counts[b - 1]
    at = 3 * total + ((3 * total) & 1)
    table = np.zeros(at + 5 * n_pairs, np.int64)
    max_count = 0
    fill = counts[:-1].copy()
    for i in range(e0.size):
        g0 = offsets[shard[i]] + e0[i]
        for g in range(g0, g0 + ne[i]):
            j = fill[row[i] * n_blocks + np.int64(blk_id[g])]
            fill[row[i] * n_blocks + np.int64(blk_id[g])] = j + 1
            f = np.int64(blk_start[g])
            c = np.int64(blk_start[g + 1]) - f
            table[j] = pbase[i] + f
            table[total + j] = c
            table[2 * total + j] = wbits[i]
            max_count = max(max_count, c)
    p = 0
    for b in range(counts.size - 1):
        if counts[b + 1] > counts[b]:
            table[at + p] = b // n_blocks
            table[at + n_pairs + p] = b % n_blocks
            table[at + 2 * n_pairs + p] = counts[b]
            table[at + 3 * n_pairs + p] = counts[b + 1]
            table[at + 4 * n_pairs + p] = row_shift[b // n_blocks]
            p += 1
    return table, total, n_pairs, at, max_count


def plan_tiles(planner: ItemPlanner, items: Items, pbase: np.ndarray, n_blocks: int,
               shifts: np.ndarray | None = None) -> TilePlan:
    """Expand work items (query, term, shard; in ``ItemPlanner.items`` order) into their block entries and
    order them for the tile kernel. ``pbase`` is each item's arena offset of its shard's posting 0 (resident or
    staged); ``n_blocks`` the index's number of doc blocks; ``shifts`` per row: the CUDA kernel's ``flat_shift``
    (0: its terms are added one after the other; default)."""
    n_rows = int(items.row.max()) + 1 if len(items) else 0
    wbits = items.w.astype(np.float32).view(np.int32).astype(np.int64)
    row_shift = np.zeros(n_rows, np.int64)
    if shifts is not None:
        row_shift[:] = shifts[:n_rows]
    return TilePlan.of(_plan(items.e0, items.ne, items.shard, items.row, wbits, pbase.astype(np.int64),
                             planner.offsets, planner.blk_start, planner.blk_id, n_rows, n_blocks, row_shift))


sum_is_exact = njit(cache=True, nogil=True)(bm25.sum_is_exact)


@njit(cache=True, nogil=True)
def flat_shift(weights: np.ndarray, min_q: float) -> int:
    """The CUDA scorer's flat path for a query (compiled: a single query waits on it): 0 where its f64 sums are not
    exact in any order (``bm25.sum_is_exact``, with ``min_q`` its bound of q), or it has one term; else the shift S of
    the 64-bit fixed-point sums it adds them as: the largest with n * max(w) * 2^S < 2^63. Every term score s lies in
    [min_s, max(w)], and ``sum_is_exact`` holds n * max(w) under 2^53 ulp(min_s), so 2^S ulp(min_s) >= 2^10: s * 2^S
    is an integer, no sum reaches 2^63, the integer sums are exact, and their f32 rounding, scaled back, is the f64
    sum's. (With one term ``sum_is_exact`` bounds nothing; the ordered path adds it alike.)"""
    n = weights.size
    if n < 2 or not sum_is_exact(weights, min_q):
        return 0
    shift = 63 - math.frexp(n * np.float64(weights.max()))[1]  # n * max(w) < 2^(63 - shift)
    return shift if 1 <= shift <= 126 else 0  # 2^-shift a normal f32


@njit(cache=True, nogil=True)
def _plan_queries(terms, weights, lens, auto, min_q, term_ptr, offsets, blk_start, blk_id, pbase_shard,
                  n_blocks):
    """``ItemPlanner.items`` (per row, term and shard instead of per shard: the same order within a (row, block)
    bucket), the rows' ``flat_shift``, then ``_plan``."""
    n_rows = lens.size
    n_shards = term_ptr.shape[1]
    cap = terms.size * n_shards
    e0, ne, shard = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    row, wb, pbase = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    shift = np.zeros(n_rows, np.int64)
    wbits = weights.view(np.int32)
    m = 0
    at = 0
    for r in range(n_rows):
        if auto:
            shift[r] = flat_shift(weights[at:at + lens[r]], min_q)
        for j in range(at, at + lens[r]):
            t = terms[j]
            for sh in range(n_shards):
                a, b = np.int64(term_ptr[t, sh]), np.int64(term_ptr[t + 1, sh])
                if b > a:
                    e0[m], ne[m], shard[m], row[m], wb[m], pbase[m] = a, b - a, sh, r, wbits[j], pbase_shard[sh]
                    m += 1
        at += lens[r]
    return _plan(e0[:m], ne[:m], shard[:m], row[:m], wb[:m], pbase[:m], offsets, blk_start, blk_id, n_rows, n_blocks,
                 shift)


def plan_queries(planner: ItemPlanner, queries: list[QueryTerms], pbase: np.ndarray, n_blocks: int,
                 auto: bool, min_q: float) -> TilePlan:
    """``plan_tiles`` of a batch's items over all shards, straight from the analysed queries in one compiled call
    (the single-query latency is mostly host work). ``pbase`` is each shard's arena offset of its posting 0;
    a row takes the flat path when ``auto``, by its ``flat_shift(weights, min_q)``."""
    if len(queries) == 1:  # no concatenation (a single query waits on every microsecond here)
        terms, weights = queries[0].term_ids.astype(np.int64), queries[0].weights.astype(np.float32, copy=False)
    else:
        terms = np.concatenate([q.term_ids for q in queries]).astype(np.int64)
        weights = np.concatenate([q.weights for q in queries]).astype(np.float32, copy=False)
    lens = np.array([len(q) for q in queries], dtype=np.int64)
    return TilePlan.of(_plan_queries(terms, weights, lens, auto, float(min_q), planner.term_ptr, planner.offsets,
                                     planner.blk_start, planner.blk_id, pbase.astype(np.int64, copy=False), n_blocks))


if triton is not None:

    @triton.jit(do_not_specialize=["n_ent", "steps"])
    def _bounds_kernel(ent, n_ent, post, bounds, tf_bits, steps, TILE: tl.constexpr, TPB: tl.constexpr):
        # bounds[e, j] = first posting of entry e whose doc offset is >= j * TILE (binary search per lane).
        e = tl.program_id(0).to(tl.int64)
        st = tl.load(ent + e)
        cnt = tl.load(ent + n_ent + e)
        j = tl.arange(0, TPB).to(tl.int64)
        target = (j * TILE) << tf_bits
        lo = tl.zeros([TPB], dtype=tl.int64)
        hi = lo + cnt
        for _ in range(steps):
            open_ = lo < hi
            mid = (lo + hi) >> 1
            v = tl.load(post + st + mid, mask=open_, other=0).to(tl.uint32, bitcast=True).to(tl.int64)
            right = v < target
            lo = tl.where(open_ & right, mid + 1, lo)
            hi = tl.where(open_ & (v >= target), mid, hi)
        tl.store(bounds + e * TPB + j, lo.to(tl.int32))

    @triton.jit(do_not_specialize=["n_ent", "n_pairs", "n_units", "num_docs", "n_groups", "n_tiles", "k_tile"])
    def _tile_kernel(ent, n_ent, pairs, n_pairs, n_units, post, norms, cache, bounds, scratch, maxima, tile_maxima,
                     scores, num_docs, n_groups, n_tiles, tf_bits, tf_mask, block_size, k_tile,
                     TILE: tl.constexpr, TPB: tl.constexpr, GROUP_: tl.constexpr, CHUNK_: tl.constexpr,
                     EB: tl.constexpr):
        # Unit u is (pair u // TPB, tile u % TPB); a tile's terms are added one after the other in ascending
        # term id, the canonical summation order, with plain loads and stores to the program's own scratch.
        NG: tl.constexpr = TILE // GROUP_
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        sbase = scratch + pid.to(tl.int64) * TILE
        gr = tl.arange(0, NG)
        cell = gr[:, None] * GROUP_ + tl.arange(0, GROUP_)[None, :]
        lanes = tl.arange(0, CHUNK_)
        eb_lanes = tl.arange(0, EB)
        for u in range(pid, n_units, nprog):  # persistent: the scratch belongs to this program alone
            pair = u // TPB
            tile = u % TPB
            row = tl.load(pairs + pair)
            blk = tl.load(pairs + n_pairs + pair)
            i0 = tl.load(pairs + 2 * n_pairs + pair)
            i1 = tl.load(pairs + 3 * n_pairs + pair)
            d0 = blk * block_size + tile * TILE
            toff = tile * TILE
            work = 0
            if d0 < num_docs:
                for eb in range(i0, i1, EB):
                    # EB terms' ranges in this tile with one round trip; most are empty (rare terms) and cost nothing.
                    ev = eb + eb_lanes
                    em = ev < i1
                    last = (eb_lanes * 0 + tile + 1) >= TPB  # the last tile ends where the entry ends
                    lo_v = tl.load(bounds + ev * TPB + tile, mask=em, other=0)
                    hi_v = tl.load(bounds + ev * TPB + tile + 1, mask=em & ~last, other=0)
                    hi_v = tl.where(last, tl.load(ent + n_ent + ev, mask=em, other=0).to(tl.int32), hi_v)
                    hi_v = tl.where(em, hi_v, lo_v)
                    st_v = tl.load(ent + ev, mask=em, other=0)
                    w_v = tl.load(ent + 2 * n_ent + ev, mask=em, other=0).to(tl.int32).to(tl.float32, bitcast=True)
                    for e in range(0, EB):  # ascending term id
                        sel = eb_lanes == e
                        lo = tl.sum(tl.where(sel, lo_v, 0), axis=0)
                        hi = tl.sum(tl.where(sel, hi_v, 0), axis=0)
                        if hi > lo:
                            st = tl.sum(tl.where(sel, st_v, 0), axis=0)
                            w = tl.sum(tl.where(sel, w_v, 0.0), axis=0)
                            work += hi - lo
                            for c in range(lo, hi, CHUNK_):
                                j = c + lanes
                                m = j < hi
                                p = tl.load(post + st + j, mask=m, other=0).to(tl.uint32, bitcast=True)
                                off = (p >> tf_bits).to(tl.int32) - toff
                                nrm = tl.load(norms + d0 + off, mask=m, other=0).to(tl.int32)
                                q = (p & tf_mask).to(tl.float32) * tl.load(cache + nrm, mask=m, other=0.0)
                                wv = tl.zeros([CHUNK_], dtype=tl.float32) + w
                                s = wv - tl.math.div_rn(wv, 1.0 + q)
                                old = tl.load(sbase + off, mask=m, other=0.0)
                                tl.store(sbase + off, old + s.to(tl.float64), mask=m)
                            tl.debug_barrier()  # the next term may add to the same cells from other threads
            if work > 0:
                sc = tl.load(sbase + cell).to(tl.float32)
                gm = tl.max(sc, axis=1)
                # Only the tile's k best docs can be in the top-k: groups below the k-th largest group maximum
                # (k other docs of the tile score more) are not written, and their maxima read 0.
                above = tl.sum((gm[None, :] >= gm[:, None]).to(tl.int32), axis=1)
                keep_from = tl.where(k_tile > 0, tl.max(tl.where(above >= k_tile, gm, 0.0), axis=0), 0.0)
                keep = (gm > 0.0) & (gm >= keep_from)
                g = d0 // GROUP_ + gr
                tl.store(maxima + row * n_groups + g, tl.where(keep, gm, 0.0), mask=g < n_groups)
                tl.store(tile_maxima + row * n_tiles + d0 // TILE, tl.max(gm, axis=0))
                doc = d0 + cell
                tl.store(scores + row * num_docs + doc, sc, mask=keep[:, None] & (doc < num_docs))
                tl.store(sbase + cell, tl.zeros([NG, GROUP_], dtype=tl.float64))
                tl.debug_barrier()  # the scratch is clean before the next tile adds to it

    @triton.jit(do_not_specialize=["num_docs", "n_groups", "n_tiles", "cap"])
    def _collect_kernel(scores, maxima, tile_maxima, thr, tiny, num_docs, n_groups, n_tiles, found, cap,
                        NGB: tl.constexpr, SUB: tl.constexpr, GROUP_: tl.constexpr, TILE: tl.constexpr):
        # Append (row * num_docs + doc, score bits) pairs of the docs scoring >= the row's threshold (at least the
        # smallest positive score) to found[2:], counting them in found[0]; only the groups whose maximum reaches
        # it are read, and few do, so NGB groups are checked at once and SUB at a time read. Then clears what it
        # read, the group maxima and their tiles' maxima, so they are zero for the next batch.
        row = tl.program_id(1).to(tl.int64)
        g0 = tl.program_id(0).to(tl.int64) * NGB
        t = tl.maximum(tl.load(thr + row), tiny)
        g = g0 + tl.arange(0, NGB)
        gm = tl.load(maxima + row * n_groups + g, mask=g < n_groups, other=0.0)
        if tl.max((gm >= t).to(tl.int32), axis=0) > 0:
            for s0 in range(0, NGB, SUB):
                gs = g0 + s0 + tl.arange(0, SUB)
                sm = tl.load(maxima + row * n_groups + gs, mask=gs < n_groups, other=0.0)
                sel = sm >= t
                if tl.max(sel.to(tl.int32), axis=0) > 0:
                    doc = gs[:, None] * GROUP_ + tl.arange(0, GROUP_)[None, :]
                    m = sel[:, None] & (doc < num_docs)
                    s = tl.load(scores + row * num_docs + doc, mask=m, other=0.0)
                    ok = tl.reshape(m & (s >= t), [SUB * GROUP_])
                    ok_i = ok.to(tl.int64)
                    first = tl.atomic_add(found, tl.sum(ok_i, axis=0))
                    pos = first + tl.cumsum(ok_i, axis=0) - 1
                    keep = ok & (pos < cap)
                    tl.store(found + 2 + 2 * pos, tl.reshape(row * num_docs + doc, [SUB * GROUP_]), mask=keep)
                    bits = tl.reshape(s, [SUB * GROUP_]).to(tl.int32, bitcast=True).to(tl.int64)
                    tl.store(found + 3 + 2 * pos, bits, mask=keep)
        tl.store(maxima + row * n_groups + g, tl.zeros([NGB], dtype=tl.float32), mask=(g < n_groups) & (gm != 0.0))
        tt = g0 * GROUP_ // TILE + tl.arange(0, NGB * GROUP_ // TILE)
        tl.store(tile_maxima + row * n_tiles + tt, tl.zeros([NGB * GROUP_ // TILE], dtype=tl.float32),
                 mask=tt < n_tiles)


def sample_step(n_units: int, rows: int, k: int) -> int:
    """Every how many units the CUDA scorer's sample takes (0: no sample). With m of a row's u units sampled, a
    fraction of about k / m of the others reach the sample's threshold and are read out; m + u * k / m is least at
    m = sqrt(u * k), a step of sqrt(u / k). Odd, so it meets every tile of a block (their number is a power of two).
    Under ``SAMPLE_MIN_UNITS`` units only where the filter runs (``filters``)."""
    if rows == 0 or SAMPLE_SCALE <= 0:
        return 0
    step = int(SAMPLE_SCALE * (n_units / rows / k) ** 0.5)
    step = step | 1 if step >= MIN_SAMPLE_STEP else 0
    return step if step and (n_units >= SAMPLE_MIN_UNITS or filters(n_units, rows, k, step)) else 0


def filters(n_units: int, rows: int, k: int, step: int) -> bool:
    """Does a sampled launch run the filter: are at most 1 / FILTER_RATIO of a row's units expected to reach the
    sample's threshold (k / m of them, m sampled)?"""
    return FILTER_RATIO * k <= n_units // rows // step


def _programs(device: torch.device) -> int:
    """Programs of the persistent scoring kernel: a few per multiprocessor (one on the CPU interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count * PROGRAMS_PER_SM


def triton_available() -> bool:
    return triton is not None


@dataclass
class QueryTables:
    """Device tables ``plan_single`` plans a query from (addresses): every shard's ``term_ptr`` side by side (u32,
    [terms + 1, shards]: row t holds every shard's pointer of term t), each doc block's shard (i32), and per shard its
    entry base in the arena, posting base, first block and number of blocks (i64, [4, shards]); the arena's
    ``blk_id`` and ``blk_start``. ``keep`` holds the tensors."""

    term_ptr: int
    n_shards: int
    blk_shard: int
    shards: int
    blk_id: int
    blk_start: int
    keep: tuple

    @staticmethod
    def nbytes(planner: ItemPlanner, n_blocks: int, block_size: int) -> int:
        """Device bytes of the tables (the arena's are counted with the shards) and of the plan made from them
        (``TileScorer.set_query_tables``)."""
        tpb = block_size // tile_size(block_size)
        plan = n_blocks * TC.QMAX * (24 + 4 * tpb) + 40 * n_blocks
        return 4 * planner.term_ptr.size + 4 * n_blocks + 32 * planner.term_ptr.shape[1] + plan

    @staticmethod
    def build(planner: ItemPlanner, ebase: np.ndarray, pbase: np.ndarray, blocks: list[tuple[int, int]],
              blk_id: torch.Tensor, blk_start: torch.Tensor, device: torch.device) -> "QueryTables":
        """From the planner's ``term_ptr``, every shard's arena bases (``ebase``, ``pbase``: all resident) and block
        range ``[start, end)``."""
        n_blocks = max((e for _, e in blocks), default=0)
        blk_shard = np.zeros(n_blocks, np.int32)
        for i, (b0, b1) in enumerate(blocks):
            blk_shard[b0:b1] = i
        shards = np.array([ebase, pbase, [b for b, _ in blocks], [e - b for b, e in blocks]], np.int64)
        term_ptr = torch.from_numpy(np.ascontiguousarray(planner.term_ptr).view(np.int32)).to(device)
        blk_shard_t, shards_t = torch.from_numpy(blk_shard).to(device), torch.from_numpy(shards).to(device)
        return QueryTables(term_ptr.data_ptr(), len(blocks), blk_shard_t.data_ptr(), shards_t.data_ptr(),
                           blk_id.data_ptr(), blk_start.data_ptr(),
                           (term_ptr, blk_shard_t, shards_t, blk_id, blk_start))


class TileScorer:
    """Device buffers and launches of the tiled pipeline for one index (see the module docstring). One caller at a
    time (the gpu backend's searches are serialised): buffers and launch arguments are reused."""

    def __init__(self, num_docs: int, block_size: int, tf_bits: int, max_rows: int, device: torch.device) -> None:
        self.num_docs, self.block_size, self.tf_bits = num_docs, block_size, tf_bits
        self.tile = tile_size(block_size)
        self.tpb = block_size // self.tile
        self.group = min(GROUP, self.tile)  # a group never straddles tiles
        self.n_groups = (num_docs + self.group - 1) // self.group
        self.device = device
        self.programs = _programs(device)
        self.n_tiles = (num_docs + self.tile - 1) // self.tile
        self.n_blocks = -(-num_docs // block_size)
        # Zero at rest: the collect kernel clears what it reads, so no batch starts by zeroing them.
        self.maxima = torch.zeros((max_rows, self.n_groups), dtype=torch.float32, device=device)
        self.tile_maxima = torch.zeros((max_rows, self.n_tiles), dtype=torch.float32, device=device)
        self._dirty = 0  # rows scored and not cleared by a collect (an interrupted search)
        self.scores = torch.empty((max_rows, num_docs), dtype=torch.float32, device=device)
        self._thr = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self._theta = torch.zeros(max_rows, dtype=torch.float32, device=device)  # the sample's thresholds
        self._no_theta = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self._listed = torch.zeros(2, dtype=torch.int32, device=device)  # the filter's count and units
        # the CUDA scorer's running thresholds (zero at rest: the collect kernel clears a row's)
        self._running = torch.zeros((max_rows, TC.RUN_WORDS), dtype=torch.int32, device=device)
        self._fixed_ptrs = tuple(t.data_ptr() for t in (self.maxima, self.tile_maxima, self.scores, self._theta,
                                                         self._no_theta, self._running))
        self._found: torch.Tensor | None = None  # the collect kernel's count and (index, score bits) pairs
        cuda = device.type == "cuda"
        self._head = torch.empty(2 + 2 * PEEK, dtype=torch.int64, pin_memory=cuda)
        self._head_np = self._head.numpy()
        self._head_f32 = self._head_np.view(np.float32)  # the device ranking's scores
        self._table_host: torch.Tensor | None = None  # pinned staging of the plan tables
        self._table_dev: torch.Tensor | None = None
        self._copies = StreamCopies() if cuda else None
        # where rank_candidates writes a single query's count and keys: the pinned head itself
        self._head_dev = self._copies.device_address(self._head.data_ptr()) if cuda else 0
        self._stream = 0  # the caller's current stream, taken at ``begin``
        self._table_sent = self._copies.event() if cuda else None  # recorded after each plan table's upload
        self._head_back = self._copies.event() if cuda else None  # recorded after the candidates' read-back
        # Candidates past the first PEEK come back on a side stream, beside the next batch's scoring.
        self._side = self._copies.stream() if cuda else 0
        self._rest_back = self._copies.event() if cuda else None
        self._rest_host: torch.Tensor | None = None
        # rows, k, capacity, peek of a started top-k, and whether the device ranks it (one row: into the pinned head)
        self._started: tuple[int, int, int, int, bool] | None = None
        self._bounds = torch.empty(0, dtype=torch.int32, device=device)
        self._samp: torch.Tensor | None = None  # the CUDA kernels' samples of the arena's postings (``sample``)
        self._query_tables: QueryTables | None = None  # set where single queries are planned on the device
        # (k, id of the norm cache tensor) -> graph, the found and listed buffers it writes, the cache, and _started
        self._graphs: dict[tuple[int, int], tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, tuple]] = {}
        self._kernels = None
        if SCORER == "cuda" and device.type == "cuda" and self.group == 32:
            try:
                self._kernels = TC.TileKernels(self.tile, self.tpb, device)
            except RtcError as e:
                warnings.warn(f"the CUDA C tile kernels are unavailable, using the Triton ones (2.2x slower): {e}")
        self.scorer = "cuda" if self._kernels is not None else "triton"
        # The Triton kernel's per-program scratch; the CUDA one keeps its tile in shared memory.
        self.scratch = (torch.zeros(self.programs * self.tile, dtype=torch.float64, device=device)
                        if self._kernels is None else None)

    @staticmethod
    def sample_bytes_per_posting(block_size: int) -> float:
        """Device bytes the CUDA kernels' samples (``sample``) add to each posting of the arena."""
        return TC.sample_bytes(block_size // tile_size(block_size)) / TC.SAMPLE

    def sample(self, post: torch.Tensor, first: int, count: int) -> None:
        """Sample postings [first, first + count) of the arena ``post`` for the CUDA kernels' tile ranges (after
        they are written; on the caller's stream, behind their copy). Nothing to do without those kernels."""
        if self._kernels is None:
            return
        if self._samp is None:
            n = -(-post.numel() // TC.SAMPLE)
            self._samp = torch.zeros(n, dtype=torch.uint8 if TC.sample_bytes(self.tpb) == 1 else torch.int16,
                                     device=self.device)
        i0, i1 = -(-first // TC.SAMPLE), -(-(first + count) // TC.SAMPLE)
        if i1 > i0:
            self._kernels.samples(-(-(i1 - i0) // TC.BOUNDS_THREADS), TC.BOUNDS_THREADS, post.data_ptr(),
                                  self._samp.data_ptr(), i0, i1 - i0, self.tf_bits, stream=current_stream(self.device))

    @staticmethod
    def work_bytes(device: torch.device, block_size: int) -> int:
        """Device bytes of the Triton kernel's per-program scratch (planned before the scorer is known; the CUDA
        one needs none)."""
        return _programs(device) * tile_size(block_size) * 8

    @staticmethod
    def row_bytes(num_docs: int, block_size: int) -> int:
        """Device bytes per query of a batch: kept f32 scores, group and tile maxima, the CUDA filter's list of
        units (one entry at most for each tile of each doc block, and its 8-byte count), three f32 thresholds and the
        running threshold's words."""
        group = min(GROUP, tile_size(block_size))
        tile = tile_size(block_size)
        units = -(-num_docs // block_size) * (block_size // tile)
        maxima = 4 * ((num_docs + group - 1) // group) + 4 * ((num_docs + tile - 1) // tile)
        return 4 * num_docs + maxima + 4 * (units + 2) + 12 + 4 * TC.RUN_WORDS

    def begin(self, rows: int) -> None:
        """Before scoring a batch: clear the maxima an interrupted search left (tiles with no postings leave
        their maxima as they find them)."""
        if self._dirty:
            self.maxima[:self._dirty].zero_()
            self.tile_maxima[:self._dirty].zero_()
            self._running[:self._dirty].zero_()
        self._dirty = rows
        if self._copies is not None:
            self._stream = current_stream(self.device)

    def _upload(self, table: np.ndarray) -> torch.Tensor:
        """The plan table on the device (its first ``table.size`` words), through a pinned buffer (an asynchronous
        copy)."""
        if self._copies is None:
            return torch.from_numpy(table)
        n = table.size
        self._copies.wait_event(self._table_sent)  # the previous table has left the pinned buffer
        if self._table_host is None or self._table_host.numel() < n:
            size = max(n, 1 << 16, 2 * (0 if self._table_host is None else self._table_host.numel()))
            self._table_host = torch.empty(size, dtype=torch.int64, pin_memory=True)
            self._table_dev = torch.empty(size, dtype=torch.int64, device=self.device)
            self._table_np = self._table_host.numpy()
        self._table_np[:n] = table
        self._copies.to_device(self._table_dev.data_ptr(), self._table_host.data_ptr(), 8 * n, self._stream)
        return self._table_dev  # its first n words; the caller records _table_sent after the first launch using it

    def _found_room(self, capacity: int) -> torch.Tensor:
        """The collect kernel's output with room for ``capacity`` candidates."""
        if self._found is None or self._found.numel() < 2 + 2 * capacity:
            self._found = torch.empty(2 + 2 * capacity, dtype=torch.int64, device=self.device)
        return self._found

    def _listed_room(self, n_units: int) -> torch.Tensor:
        """The filter's list with room for ``n_units`` units ([0]: the count, 8 bytes cleared by kth)."""
        if self._listed.numel() < 2 + n_units:
            self._listed = torch.empty(max(2 + n_units, 2 * self._listed.numel()), dtype=torch.int32,
                                       device=self.device)
        return self._listed

    def _bounds_room(self, n_ent: int) -> torch.Tensor:
        if self._bounds.numel() < n_ent * self.tpb:
            self._bounds = torch.empty(max(n_ent * self.tpb, 2 * self._bounds.numel()), dtype=torch.int32,
                                       device=self.device)
        return self._bounds

    def score(self, plan: TilePlan, post: torch.Tensor, norms: torch.Tensor, cache: torch.Tensor, k: int) -> None:
        """Score a plan's tiles for a top-``k``: their maxima, and the f32 scores of the groups that matched and
        hold one of the tile's k best docs."""
        n_ent, n_pairs = plan.n_ent, plan.n_pairs
        if n_ent == 0:
            return
        bounds = self._bounds_room(n_ent)
        dev = self._upload(plan.table)
        if self._kernels is not None:
            # Addresses, not tensors or views: a slice, or finding a tensor's pointer at launch, costs microseconds
            # of host time, and a single query waits on them (from the plan's upload to the first launch most).
            ent, post = dev.data_ptr(), post.data_ptr()
            self._kernels.bounds(-(-n_ent * self.tpb // TC.BOUNDS_THREADS), TC.BOUNDS_THREADS, ent, n_ent, post,
                                 self._samp.data_ptr(), bounds.data_ptr(), self.tf_bits, stream=self._stream)
            self._copies.record(self._table_sent, self._stream)
            self._score_units(ent, n_ent, ent + 8 * plan.pairs_at, n_pairs, plan.rows, post, norms, cache, k,
                              bounds.data_ptr())
            return
        # The pair columns start 16-byte aligned: Triton compiles a kernel per pointer alignment it sees.
        ent, pairs, n_units = dev[:3 * n_ent], dev[plan.pairs_at:], n_pairs * self.tpb
        steps = plan.max_count.bit_length() + 1
        _bounds_kernel[(n_ent,)](ent, n_ent, post, bounds, self.tf_bits, steps, TILE=self.tile, TPB=self.tpb)
        if self._copies is not None:
            self._copies.record(self._table_sent, self._stream)
        # enable_fp_fusion=False: tf * c + 1 must round twice (no FMA), as FORMAT.md's f32 arithmetic does.
        _tile_kernel[(min(n_units, self.programs),)](
            ent, n_ent, pairs, n_pairs, n_units, post, norms, cache, bounds, self.scratch, self.maxima,
            self.tile_maxima, self.scores, self.num_docs, self.n_groups, self.n_tiles, self.tf_bits,
            (1 << self.tf_bits) - 1, self.block_size, self._k_tile(k),
            TILE=self.tile, TPB=self.tpb, GROUP_=self.group, CHUNK_=CHUNK, EB=ENTRY_BLOCK, num_warps=NUM_WARPS,
            enable_fp_fusion=False)

    def plans_on_device(self, query: QueryTerms) -> bool:
        """May ``score_query`` plan this query on the device (CUDA kernels, ``set_query_tables`` called, few enough
        terms)?"""
        return self._query_tables is not None and 0 < len(query) <= TC.QMAX

    def set_query_tables(self, tables: "QueryTables") -> None:
        """The device tables ``score_query`` plans from (every shard resident), and the buffers of its plan: the
        table's columns ``stride`` = blocks * QMAX entries apart whatever the query, so a graph replays it."""
        if self._kernels is None:
            return
        self._query_tables = tables
        self.stride = self.n_blocks * TC.QMAX
        self._qtable = torch.empty(3 * self.stride + 5 * self.n_blocks, dtype=torch.int64, device=self.device)
        self._qbounds = torch.empty(self.stride * self.tpb, dtype=torch.int32, device=self.device)
        # plan_single's Query: written here by the host, copied to the device by query_in
        self._qhost = torch.zeros(TC.QUERY_WORDS, dtype=torch.int32, pin_memory=True)
        self._query, self._qhost_dev = self._qhost.numpy(), self._copies.device_address(self._qhost.data_ptr())
        self._query_f32 = self._query.view(np.float32)  # the weights' words
        self._qdev = torch.empty(TC.QUERY_WORDS, dtype=torch.int32, device=self.device)
        self._capture = self._copies.stream()  # graphs are captured on a stream of our own

    def score_query(self, query: QueryTerms, shift: int, post: torch.Tensor, norms: torch.Tensor, cache: torch.Tensor,
                    k: int) -> None:
        """``score`` of one query (``plans_on_device``) planned on the device (``_queue_plan``): no host planning or
        upload of a plan on the query's latency path; ``shift``: its ``flat_shift`` (0: its terms one after the
        other)."""
        self._set_query(query, shift)
        self._queue_query(post.data_ptr(), norms, cache, k)

    def start_query(self, query: QueryTerms, shift: int, post: torch.Tensor, norms: torch.Tensor, cache: torch.Tensor,
                    k: int) -> None:
        """``score_query`` and ``start_topk(1, k)`` (after ``begin(1)``) as one launch of a CUDA graph, captured once
        for each k and BM25 parameters: a single query's dozen launches cost the host tens of microseconds, and the
        device waited on them. ``finish_topk`` as usual."""
        key = (k, id(cache))  # the cache tensor is kept in the entry (a tensor's own hash costs ~0.4 us)
        got = self._graphs.get(key)
        if got is None or got[1] is not self._found or got[2] is not self._listed or got[3] is not cache:
            if got is not None:  # its buffers moved (or another cache took the id)
                self._copies.drop_graph(got[0])
            elif len(self._graphs) >= MAX_GRAPHS:
                self._copies.drop_graph(self._graphs.pop(next(iter(self._graphs)))[0])
            capacity = self._capacity(1, k)
            self._found_room(capacity)  # allocated before the capture, which fixes their addresses
            self._listed_room(self.n_blocks * self.tpb)
            stream, self._stream = self._stream, self._capture
            try:  # the graph records _head_back itself when it is done (one driver call less a query)
                graph = self._copies.capture(self._capture, lambda: (
                    self._queue_query(post.data_ptr(), norms, cache, k), self._queue_selection(1, k, capacity),
                    self._copies.record_in_graph(self._head_back, self._capture)))
            finally:
                self._stream = stream
            got = self._graphs[key] = (graph, self._found, self._listed, cache,
                                       (1, k, capacity, self._peek(1, k, capacity), True))
        self._set_query(query, shift)
        self._copies.launch_graph(got[0], self._stream)
        self._dirty = 0  # its collect cleared the maxima
        self._started = got[4]

    def _set_query(self, query: QueryTerms, shift: int) -> None:
        """The query in the pinned buffer ``query_in`` reads (the previous query's graph or launches are done)."""
        q, nt = self._query, len(query)
        q[0], q[1] = nt, shift
        q[2:2 + nt] = query.term_ids
        self._query_f32[2 + TC.QMAX:2 + TC.QMAX + nt] = query.weights

    def _queue_plan(self, post: int) -> None:
        """Queue ``query_in`` and ``plan_single`` of the query set last: its dense plan (every doc block a pair, every
        (block, term) an entry) in ``_qtable``, with the tile ranges in ``_qbounds``."""
        qt, kn, qdev = self._query_tables, self._kernels, self._qdev.data_ptr()
        kn.query_in(1, 32 * -(-TC.QUERY_WORDS // 32), self._qhost_dev, qdev, stream=self._stream)  # a word a thread
        kn.plan(-(-self.n_blocks * TC.PLAN_TERMS * self.tpb // TC.BOUNDS_THREADS), TC.BOUNDS_THREADS, qdev, qt.term_ptr,
                qt.n_shards, qt.blk_shard, qt.shards, qt.blk_id, qt.blk_start, post, self._samp.data_ptr(),
                self.n_blocks, self.stride, self._qtable.data_ptr(), self._qbounds.data_ptr(), self.tf_bits,
                stream=self._stream)

    def _queue_query(self, post: int, norms: torch.Tensor, cache: torch.Tensor, k: int) -> None:
        """``_queue_plan`` and the scoring."""
        self._queue_plan(post)
        table = self._qtable.data_ptr()
        self._score_units(table, self.stride, table + 24 * self.stride, self.n_blocks, 1, post, norms, cache, k,
                          self._qbounds.data_ptr())

    def _k_tile(self, k: int) -> int:
        """The Triton scorer's cut: groups below the tile's k-th largest group maximum are not written (0: none)."""
        return k if k < self.tile // self.group else 0

    def _score_units(self, ent: int, n_ent: int, pairs: int, n_pairs: int, rows: int, post: int, norms: torch.Tensor,
                     cache: torch.Tensor, k: int, bounds: int) -> None:
        """The CUDA scoring launches of a plan on the device (table at ``ent``, pair columns at ``pairs``, tile ranges
        at ``bounds``)."""
        kn = self._kernels
        n_units = n_pairs * self.tpb
        norms, cache = norms.data_ptr(), cache.data_ptr()
        maxima, tile_maxima, scores, theta, no_theta, running = self._fixed_ptrs
        running = running if RUNNING_THRESHOLD else 0
        threads = TC.threads(self.tile)
        unit_args = (ent, n_ent, pairs, n_pairs, post, norms, cache, bounds, maxima, tile_maxima, scores,
                     self.num_docs, self.n_groups, self.n_tiles, self.tf_bits, self.block_size, k)
        step = sample_step(n_units, rows, k)
        if not step:
            kn.scorer(n_units, threads, *unit_args, no_theta, running, 1, 0, stream=self._stream)
            return
        # A sample of the units first: the k-th largest of each row's tile maxima is reached by k docs. Few tiles
        # reach it (k / m of them, m sampled a row): a pass bounding every unit's maximum lists those whose tile
        # may, and only they are scored. Many: every other unit is scored, and those below it skip their read-out.
        filtered = filters(n_units, rows, k, step)
        listed = self._listed_room(n_units).data_ptr() if filtered else 0  # kth clears its count
        kn.scorer(-(-n_units // step), threads, *unit_args, no_theta, running, step, 0, stream=self._stream)
        kn.kth(rows, TC.KTH_THREADS, tile_maxima, self.n_tiles, k, theta, listed, stream=self._stream)
        if not filtered:
            kn.scorer(n_units, threads, *unit_args, theta, running, 1, step, stream=self._stream)
            return
        kn.filter(n_units // TC.filter_span(self.tpb), threads, ent, n_ent, pairs, n_pairs, post, norms, cache, bounds,
                  self.num_docs, self.tf_bits, self.block_size, theta, listed, stream=self._stream)
        kn.listed(kn.listed_grid, threads, *unit_args, theta, running, listed, stream=self._stream)

    def _collect(self, rows: int, k: int, capacity: int) -> torch.Tensor:
        """Candidates of the rows scored since ``begin``: the count at [0], (index, score bits) pairs from [2]. The
        threshold is the k-th largest tile maximum (k tiles have a doc scoring at least this: a lower bound of the
        k-th score). Clears the maxima."""
        found, kn = self._found_room(capacity), self._kernels
        if kn is not None:
            tile_maxima, thr, out = self.tile_maxima.data_ptr(), self._thr.data_ptr(), found.data_ptr()
            kn.kth(rows, TC.KTH_THREADS, tile_maxima, self.n_tiles, k, thr, out, stream=self._stream)
            kn.collect((-(-self.n_groups // COLLECT_GROUPS), rows), TC.COLLECT_THREADS, self.scores.data_ptr(),
                       self.maxima.data_ptr(), tile_maxima, thr, self.num_docs, self.n_groups, self.n_tiles, out,
                       capacity, self._running.data_ptr(), stream=self._stream)
        else:
            thr = self._thr[:rows]
            if self.n_tiles > k:
                thr = torch.topk(self.tile_maxima[:rows], k, dim=1, sorted=False).values.amin(dim=1)
            found[:1].zero_()
            grid = (triton.cdiv(self.n_groups, COLLECT_GROUPS), rows)
            _collect_kernel[grid](self.scores, self.maxima, self.tile_maxima, thr, TINY, self.num_docs,
                                  self.n_groups, self.n_tiles, found, capacity, NGB=COLLECT_GROUPS, SUB=COLLECT_SUB,
                                  GROUP_=self.group, TILE=self.tile)
        self._dirty = 0
        return found

    def start_topk(self, rows: int, k: int) -> None:
        """Queue the selection of the rows scored since ``begin`` (threshold, collect, the read-back of the count
        and the first candidates); ``finish_topk`` waits for it. The next batch may be scored in between: the
        collect has read and cleared what it needs."""
        self._start(rows, k, self._capacity(rows, k))

    @staticmethod
    def _capacity(rows: int, k: int) -> int:
        return max(MIN_CAPACITY, CANDIDATES_PER_HIT * k * rows)

    @staticmethod
    def _peek(rows: int, k: int, capacity: int) -> int:
        # About k a row reach the threshold (more at large k, where the tiles' maxima bound it loosely).
        return min(capacity, PEEK, max(PEEK_MIN, PEEK_PER_HIT * k * rows))

    def _start(self, rows: int, k: int, capacity: int) -> None:
        on_device = self._queue_selection(rows, k, capacity)
        if self._copies is not None:
            self._copies.record(self._head_back, self._stream)
        self._started = (rows, k, capacity, self._peek(rows, k, capacity), on_device)

    def _queue_selection(self, rows: int, k: int, capacity: int) -> bool:
        """Queue the threshold, the collect and the count and first candidates to the host: a single query's ranked by
        ``rank_candidates``, which writes the count and the first docs and scores to the pinned head itself (layout:
        ``_rank_room``); otherwise the (index, score bits) pairs in one transfer. Returns whether the device ranks."""
        found = self._collect(rows, k, capacity)
        peek = self._peek(rows, k, capacity)
        if rows == 1 and self._kernels is not None:
            self._kernels.rank(TC.RANK_BLOCKS, TC.RANK_THREADS, found.data_ptr(), capacity, self._head_dev, k,
                               _rank_room(peek), stream=self._stream)
            return True
        if self._copies is not None:
            self._copies.to_host(self._head.data_ptr(), found.data_ptr(), 8 * (2 + 2 * peek), self._stream)
        else:
            self._head[:2 + 2 * peek].copy_(found[:2 + 2 * peek])
        return False

    def finish_topk(self, rescore: Callable[[], None]) -> tuple[list[TopK], bool]:
        """Top-k of the started rows, best first (FORMAT.md's ranking rule), and whether they were scored again:
        when more candidates reach the threshold than there is room for, ``rescore()`` must score the batch again
        (after ``begin``; the first collect cleared the maxima, and a batch scored since is overwritten)."""
        rows, k, capacity, peek, on_device = self._started
        rescored = False
        while True:
            if self._copies is not None:
                self._copies.wait_event(self._head_back)
            head = self._head_np[:2 + 2 * peek]
            total = int(head[0])
            if total <= capacity:
                break
            rescore()
            rescored = True
            self._start(rows, k, total)
            rows, k, capacity, peek, on_device = self._started
        self._started = None
        found = self._found
        n = min(k, total)
        room = _rank_room(peek)
        if on_device and total <= TC.SORT_MAX and n <= room:  # ranked on the device: the first n docs and scores
            scores = self._head_f32[2 * (2 + room):2 * (2 + room) + n]
            return [TopK(head[2:2 + n].copy(), scores.copy())], rescored
        if total <= HOST_RANK_MAX:  # ranked on the host
            pairs = head if total <= peek and not on_device else self._read_back(2 + 2 * total)
            return _rank_host(rows, k, self.num_docs, pairs[2:2 + 2 * total:2], pairs[3:3 + 2 * total:2]), rescored
        idx, order = torch.sort(found[2:2 + 2 * total:2])  # collected in no order: (row, doc) ascending first
        score = found[3:3 + 2 * total:2].to(torch.int32).view(torch.float32)
        r = idx // self.num_docs
        return ranked(rows, k, r, idx - r * self.num_docs, score[order]), rescored

    def _read_back(self, n: int) -> np.ndarray:
        """The first ``n`` words of the collect kernel's output on the host. On CUDA through a side stream that waits
        only for the collect: the next batch, already queued on the caller's stream, is scored meanwhile."""
        if self._copies is None:
            return self._found[:n].cpu().numpy()
        if self._rest_host is None or self._rest_host.numel() < n:
            self._rest_host = torch.empty(max(n, 2 * (0 if self._rest_host is None else self._rest_host.numel())),
                                          dtype=torch.int64, pin_memory=True)
        self._copies.after(self._side, self._head_back)
        self._copies.to_host(self._rest_host.data_ptr(), self._found.data_ptr(), 8 * n, self._side)
        self._copies.record(self._rest_back, self._side)
        self._copies.wait_event(self._rest_back)
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
