"""The CPU backend's traversal (numba): block-max MaxScore over windows of a doc block, with an exact top-k.

A query walks the shard's doc blocks in docid order, and each block in windows of ``window`` docs. Per window,
each query term's fine blocks (runs of ``fine_block`` postings, FORMAT.md "Fine bounds") that overlap the window
give it a window bound ``w - w / (1 + max q)``. Once k documents are kept, a later document must score strictly
above the k-th score so far (the tie rule favours smaller docids), so:
- a window whose bounds sum to no more than the k-th score is skipped (block-max skipping);
- otherwise the terms are ordered by window bound (MaxScore): the essential ones, whose bounds together could
  lift an unseen document above the k-th score, are scored into the window's f64 accumulator; the others only
  update the surviving candidates (by binary search or by a scan of their window's postings), in decreasing
  bound order, candidates being dropped once their partial score plus the remaining bounds cannot win;
- an essential term's fine blocks whose bound plus the other terms' window bounds cannot beat the k-th score are
  passed over (block-max skipping at the grain of 128 postings: no doc of theirs can enter);
- every comparison is made after rounding to f32, as final scores are, with the f64 sums of bounds given a slack
  that covers their rounding.
Before the first window the threshold is seeded with a score k documents are known to reach
(``initial_threshold``), so pruning starts at once. Where the backend has fused each doc's length byte into its
postings (``relevancy.fuse_norms``), ``shift`` skips that byte and no norms are read.
Reordering the terms needs the f64 sum of the query's term scores to be order-free (``bm25.sum_is_exact``);
without it every term of a window is added in ascending term-id order (FORMAT.md's canonical order) and only
whole windows are skipped. Either way the result equals the exhaustive run bit for bit.

The stages it strings together live in ``relevancy`` (term scores into the accumulator) and ``selection``
(the top-k, candidate pruning); every kernel releases the GIL.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from ragserve.kernels.cpu.hints import LINE, prefetch
from ragserve.kernels.cpu.relevancy import F1, NORM_BITS, probe_entry, scan_entry, score_blocks, score_entry
from ragserve.kernels.cpu.selection import SMALL_TOPK, flush_block, initial_key, key_score, prune_candidates, topk_small


# The kernels' arguments, named. Python hands each to numba as a plain tuple of the fields (``tuple(Tuning(...))``)
# and the entry points name it again (``Tuning(*tuning)``): numba types a plain tuple in C at each call, a
# NamedTuple in Python (measured 2-5 us a call for these, a fifth of a short query on a small index).
class ShardArrays(NamedTuple):
    """A shard's arrays as the traversal reads them (FORMAT.md)."""

    postings: np.ndarray
    term_ptr: np.ndarray
    blk_id: np.ndarray
    blk_start: np.ndarray
    blk_maxq: np.ndarray
    blk_maxtf: np.ndarray
    blk_minnorm: np.ndarray
    fine_ptr: np.ndarray
    fine_maxq: np.ndarray
    fine_last: np.ndarray


class Shard(NamedTuple):
    """A shard to search: its arrays (``ShardArrays`` fields) and its doc blocks [block_lo, block_hi)."""

    arrays: tuple
    block_lo: int
    block_hi: int


class Layout(NamedTuple):
    """How an index's postings are packed: its norms (empty where ``fused``: each posting carries its doc's length
    byte, ``relevancy.fuse_norms``), postings per fine block, docs per block and tf bits."""

    norms: np.ndarray
    fine_block: int
    block_size: int
    tf_bits: int
    fused: bool


class Tuning(NamedTuple):
    """The traversal's settings (``backend.CpuTuning``): ``prune`` off scores every posting (the exhaustive
    reference); ``seed``, ``seed_exact``: the first threshold (``initial_threshold``); ``probe_ratio``,
    ``prefetch_norms``: ``search_shard``."""

    prune: bool
    seed: bool
    seed_exact: int
    probe_ratio: int
    prefetch_norms: bool


class Scratch(NamedTuple):
    """A thread's scratch for one query: one window's f64 accumulator, live marks (u8) and doc offsets
    (``touched``, ``cands``), the top-k keys (2k: ``selection.flush_block``), the top-k state and the work
    counters (``ST_*``)."""

    acc: np.ndarray
    live: np.ndarray
    touched: np.ndarray
    cands: np.ndarray
    top: np.ndarray
    state: np.ndarray
    stats: np.ndarray


class Segment(NamedTuple):
    """One shard of one of several indexes searched as one (``search_segments``)."""

    shard: tuple  # ``Shard`` fields
    layout: tuple  # ``Layout`` fields
    deleted: np.ndarray  # u8 per doc (1: deleted), or empty
    doc_off: int  # the index's first docid in the shared docid space
    row: int  # the row of the query's term ids in this index
    bounds: bool  # whether the layout's bounds apply (the layout's k1 and b, bounds scaled to the live avgdl)
    window: int
    seed: bool  # seed the threshold from this shard


class TermScratch(NamedTuple):
    """``search_shard``'s per-term scratch (``term_scratch``), allocated once a query, not once a shard."""

    ints: np.ndarray  # [7, terms]: block entry cursor and end, entry, posting cursor and end, window end, order
    floats: np.ndarray  # [2, terms]: the window bound, the sum of the bounds after each term in MaxScore order
    cq: np.ndarray  # [terms]: the q bound of the term's block entry

# Slack on f64 sums of bounds, per query term: 2^-50 = 8 f64 ulps, covering the rounding of summing n bounds in any
# order (and, without an exact sum, of the scores' own sum), far below one f32 ulp.
SLACK_PER_TERM = 2.0 ** -50

# Counters of a query's work (``stats``), summed over its shards.
ST_SCORED = 0  # postings scored into the accumulator (essential terms, or every term without reordering)
ST_SCANNED = 1  # postings of non-essential terms read by a scan
ST_PROBES = 2  # candidate look-ups by binary search in a non-essential term's window
ST_CANDIDATES = 3  # documents touched by the essential terms
ST_WINDOWS = 4  # windows with at least one posting
ST_SKIPPED = 5  # of those, skipped whole by their bounds
ST_SKIPPED_POSTINGS = 6  # postings in skipped windows
ST_FLUSHED = 7  # documents offered to the top-k
ST_PUSHES = 8  # of those, inserted
ST_DEAD_POSTINGS = 9  # postings of essential terms passed over in fine blocks whose bounds cannot win
N_STATS = 10


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _shard(t):
    """A ``Shard`` as Python passes it (a plain tuple, its arrays one too), named."""
    s = Shard(*t)
    return Shard(ShardArrays(*s.arrays), s.block_lo, s.block_hi)


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _bound(w, q):
    return np.float64(w - w / (F1 + q))


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _window_end(postings, fine_maxq, fine_last, pos, pend, f, fend, fstart, fine_block, w1, shift):
    """(first posting at or past window end w1, max q of the fine blocks overlapping [pos, that posting)).

    ``f`` is the fine block holding ``pos`` and ``fstart`` its first posting."""
    mq = np.float32(0.0)
    while f < fend and fine_last[f] < w1:  # fine blocks wholly before the window's end
        mq = max(mq, fine_maxq[f])
        f += 1
        fstart += fine_block
    if f == fend:
        return pend, mq
    lo = max(pos, fstart)
    last = min(fstart + fine_block, pend) - 1  # the block's last posting, at or past w1
    # Galloping search from lo: a rare term has a posting or two in the window, found within lo's cache line;
    # a search over the whole block would touch its every line at each window.
    prev = lo - 1  # postings[prev] < w1 (or prev before lo)
    step = 1
    a = lo
    while a < last and (postings[a] >> shift) < w1:
        prev = a
        a = min(lo + step, last)
        step <<= 1
    n = a - prev  # the first posting at or past w1 is in (prev, a]; postings[a] is one
    b = prev + 1
    while n > 1:  # branch-free: which half holds it is unpredictable
        half = n >> 1
        b = b + half if (postings[b + half - 1] >> shift) < w1 else b
        n -= half
    a = b
    if a > lo:
        mq = max(mq, fine_maxq[f])
    return a, mq


@njit(nogil=True, cache=True, error_model="numpy")
def initial_threshold(arrays, layout, cache, term_ids, weights, bounds, k, exact_limit, deleted):
    """A score that at least k documents of the shard reach (0.0 if none is known), to prune from the first window
    (``arrays``: ``ShardArrays``, ``layout``: ``Layout``, ``bounds``: whether the layout's bounds apply).

    A document's score is at least each of its term scores, so k distinct postings of one term give one: the
    k-th largest exact score of the postings of the heaviest term with at least k postings, over all of them up
    to ``exact_limit``, else over its fine blocks with the largest bounds (about 2k postings, chosen by one pass
    over its bounds). Bounded work: a few microseconds a query. ``deleted`` (u8 per doc, or empty) marks deleted
    documents, whose postings do not count: looked up only for the postings at or above the candidate score (a
    look-up per gathered posting, at random in the marks, cost more than the seed saved)."""
    postings, term_ptr, blk_id, blk_start = arrays.postings, arrays.term_ptr, arrays.blk_id, arrays.blk_start
    fine_ptr, fine_maxq = arrays.fine_ptr, arrays.fine_maxq
    norms, fine_block, block_size = layout.norms, layout.fine_block, layout.block_size
    tf_bits, fused = layout.tf_bits, layout.fused
    tfb = np.uint32(tf_bits)
    shift = np.uint32(tf_bits + NORM_BITS) if fused else tfb
    mask = np.uint32((1 << tf_bits) - 1)
    best_i = -1
    n_post = np.int64(0)
    for i in range(term_ids.size):
        n = np.int64(0)
        for e in range(term_ptr[term_ids[i]], term_ptr[term_ids[i] + 1]):
            n += np.int64(blk_start[e + 1]) - np.int64(blk_start[e])
        if n >= k and (best_i < 0 or weights[i] > weights[best_i]):
            best_i = i
            n_post = n
    if best_i < 0:
        return np.float32(0.0)
    e0 = term_ptr[term_ids[best_i]]
    e1 = term_ptr[term_ids[best_i] + 1]
    f0 = np.int64(fine_ptr[e0])
    nf = np.int64(fine_ptr[e1]) - f0
    cut = np.float32(-1.0)  # exact scores of the postings of the blocks whose bound is at least this
    if n_post > exact_limit:
        if not bounds:
            return np.float32(0.0)  # no bounds to choose blocks by
        nb = min(nf, (2 * k + fine_block - 1) // fine_block)
        top = np.zeros(nb, dtype=np.float32)  # the nb largest bounds, ascending (insertion: nb is small)
        for f in range(f0, f0 + nf):
            v = fine_maxq[f]
            if v > top[0]:
                j = 0
                while j + 1 < nb and top[j + 1] < v:
                    top[j] = top[j + 1]
                    j += 1
                top[j] = v
        cut = top[0]
    n = np.int64(0)
    for f in range(f0, f0 + nf):
        if fine_maxq[f] >= cut:
            n += fine_block
    qs = np.empty(n, dtype=np.float32)
    docs = np.empty(n if deleted.size else 0, dtype=np.int64)
    n = 0
    for e in range(e0, e1):
        base = np.int64(blk_id[e]) * block_size
        ef0 = np.int64(fine_ptr[e])
        for f in range(ef0, np.int64(fine_ptr[e + 1])):
            if fine_maxq[f] < cut:
                continue
            a = np.int64(blk_start[e]) + (f - ef0) * fine_block
            for j in range(a, min(a + fine_block, np.int64(blk_start[e + 1]))):
                p = postings[j]
                nrm = (p >> tfb) & np.uint32(0xFF) if fused else norms[base + np.int64(p >> shift)]
                qs[n] = np.float32(p & mask) * cache[nrm]
                if deleted.size:
                    docs[n] = base + np.int64(p >> shift)
                n += 1
    m = k  # the m-th largest score: at least m postings (distinct docs) reach it; enough once k of them are live
    while True:
        if n < m:
            return np.float32(0.0)
        q_k = np.partition(qs[:n], n - m)[n - m]
        if not deleted.size:
            break
        alive = 0
        for j in range(n):
            if qs[j] >= q_k and not deleted[docs[j]]:
                alive += 1
        if alive >= k:
            break
        m += k - alive
    w = weights[best_i]
    return np.float32(w - w / (F1 + q_k))


@njit(nogil=True, cache=True, error_model="numpy")
def seed_threshold(arrays, layout, cache, term_ids, weights, bounds, k, exact_limit, deleted, state):
    """Start the top-k's threshold (``state``: ``Scratch.state``) at ``initial_threshold``
    (``selection.initial_key``) where it is above the current one."""
    score = initial_threshold(arrays, layout, cache, term_ids, weights, bounds, k, exact_limit, deleted)
    if score > 0.0:
        key = initial_key(score)
        if key > state[1]:
            state[1] = key


@njit(nogil=True, cache=True, error_model="numpy")
def search_shard(shard, layout, window, cache, term_ids, weights, bounds, exact_sum, k, tuning, scratch, work, doc_off,
                 deleted):
    """Add one shard's matches (``shard``: a ``Shard`` of ``ShardArrays``, ``layout``: ``Layout``) to the top-k
    (``selection.flush_block``: keys ``scratch.top``, state ``scratch.state``).

    ``window`` (a power of two, at most the block size) is the docs per window, and the scratch's ``acc``,
    ``live`` (u8 marks of the docs still candidates), ``touched`` and ``cands`` hold one window (``acc`` and
    ``live`` zero on entry and exit). A non-essential term is probed by binary search when ``candidates *
    tuning.probe_ratio`` is below its postings in the window, else scanned. Without ``tuning.prune`` every
    posting is scored (the exhaustive reference). ``bounds``: whether the layout's bounds apply (else each block
    entry's is taken from its max tf and min norm). Docids enter the top-k plus ``doc_off`` (several segments
    share one top-k: ``search_segments``), and documents ``deleted`` marks (u8 per doc, or empty) never enter it.
    ``work``: ``TermScratch``."""
    a = shard.arrays
    postings, term_ptr, blk_id, blk_start = a.postings, a.term_ptr, a.blk_id, a.blk_start
    blk_maxq, blk_maxtf, blk_minnorm = a.blk_maxq, a.blk_maxtf, a.blk_minnorm
    fine_ptr, fine_maxq, fine_last = a.fine_ptr, a.fine_maxq, a.fine_last
    norms, fine_block, block_size = layout.norms, layout.fine_block, layout.block_size
    tf_bits, fused = layout.tf_bits, layout.fused
    prune, probe_ratio, prefetch_norms = tuning.prune, tuning.probe_ratio, tuning.prefetch_norms
    acc, live, touched, cands = scratch.acc, scratch.live, scratch.touched, scratch.cands
    buf, st, stats = scratch.top, scratch.state, scratch.stats
    nq = term_ids.size
    slack = 1.0 + (nq + 1) * SLACK_PER_TERM
    tfb = np.uint32(tf_bits)
    shift = np.uint32(tf_bits + NORM_BITS) if fused else tfb
    mask = np.uint32((1 << tf_bits) - 1)
    iw = work.ints
    cur = iw[0]
    end = iw[1]
    for i in range(nq):
        cur[i] = term_ptr[term_ids[i]]
        end[i] = term_ptr[term_ids[i] + 1]
    ent = iw[2]
    pos = iw[3]  # next posting of the term in the block
    pend = iw[4]
    wend = iw[5]  # the term's first posting past the current window
    order = iw[6]
    wb = work.floats[0]  # the term's bound in the window (0: no posting there)
    remaining = work.floats[1]
    cq = work.cq  # the term's q bound in the block entry
    for b in range(shard.block_lo, shard.block_hi):
        base = np.int64(b) * block_size
        total = 0.0
        present = 0
        for i in range(nq):
            while cur[i] < end[i] and blk_id[cur[i]] < b:
                cur[i] += 1
            pos[i] = pend[i] = 0
            ent[i] = -1
            if cur[i] < end[i] and blk_id[cur[i]] == b:
                e = cur[i]
                ent[i] = e
                pos[i] = blk_start[e]
                pend[i] = blk_start[e + 1]
                cq[i] = blk_maxq[e] if bounds else np.float32(blk_maxtf[e]) * cache[blk_minnorm[e]]
                total += _bound(weights[i], cq[i])
                present += 1
        if present == 0:
            continue
        if prune and st[1] != 0 and np.float32(total * slack) <= key_score(st[1]):
            continue  # no document of this block can beat the k-th score so far
        while True:
            first = block_size
            for i in range(nq):
                if pos[i] < pend[i]:
                    first = min(first, np.int64(postings[pos[i]] >> shift))
            if first == block_size:
                break
            w0 = first - first % window
            w1 = w0 + window
            total = 0.0
            n_w = 0
            for i in range(nq):
                wb[i] = 0.0
                wend[i] = pos[i]
                if pos[i] == pend[i]:
                    continue
                e = ent[i]
                f0 = np.int64(fine_ptr[e])
                f = f0 + (pos[i] - np.int64(blk_start[e])) // fine_block
                fstart = np.int64(blk_start[e]) + (f - f0) * fine_block
                we, mq = _window_end(postings, fine_maxq, fine_last, pos[i], pend[i], f, np.int64(fine_ptr[e + 1]),
                                     fstart, fine_block, w1, shift)
                if we == pos[i]:
                    continue
                wend[i] = we
                wb[i] = _bound(weights[i], mq if bounds else cq[i])
                total += wb[i]
                n_w += 1
            stats[ST_WINDOWS] += 1
            heap_full = st[1] != 0
            theta = key_score(st[1]) if heap_full else np.float32(0.0)
            if prune and heap_full and np.float32(total * slack) <= theta:
                stats[ST_SKIPPED] += 1
                for i in range(nq):
                    stats[ST_SKIPPED_POSTINGS] += wend[i] - pos[i]
                    pos[i] = wend[i]
                continue
            n_t = 0
            canonical = not prune or not exact_sum or n_w == 1 or not heap_full
            # MaxScore: terms by decreasing window bound; the essential ones are those before the first term from
            # which the remaining bounds sum to no more than the k-th score (all of them in the canonical order).
            n_o = 0
            for i in range(nq):
                if wend[i] > pos[i]:
                    j = n_o
                    while j > 0 and not canonical and wb[order[j - 1]] < wb[i]:
                        order[j] = order[j - 1]
                        j -= 1
                    order[j] = i
                    n_o += 1
            remaining[n_o - 1] = 0.0
            for j in range(n_o - 2, -1, -1):
                remaining[j] = remaining[j + 1] + wb[order[j + 1]]
            m_ess = n_o
            if not canonical:
                m_ess = 1
                while m_ess < n_o and np.float32(remaining[m_ess - 1] * slack) > theta:
                    m_ess += 1
            # The norms are read at random by the scoring: with enough postings to score, fetch the window's norms
            # as one stream first (a query after other work would otherwise wait on a miss for most of them).
            to_score = 0
            for j in range(m_ess):
                to_score += wend[order[j]] - pos[order[j]]
            if prefetch_norms and not fused and to_score * 2 * LINE >= window:
                for d in range(base + w0, min(base + w1, norms.size), LINE):
                    prefetch(norms, d)
            dead = 0
            for j in range(m_ess):
                i = order[j]
                others = 0.0
                if prune and heap_full and bounds:
                    for jj in range(n_o):
                        if order[jj] != i:
                            others += wb[order[jj]]
                if prune and heap_full and bounds and np.float32(others * slack) < theta:
                    # Block-max: this term's fine blocks whose bound cannot lift any doc of theirs above theta.
                    e = ent[i]
                    f0 = np.int64(fine_ptr[e])
                    f = f0 + (pos[i] - np.int64(blk_start[e])) // fine_block
                    n_t, d = score_blocks(postings, pos[i], wend[i], fine_maxq, f,
                                          np.int64(blk_start[e]) + (f - f0) * fine_block, fine_block, others, slack,
                                          theta, weights[i], cache, norms, base, w0, acc, live, touched, n_t, shift,
                                          mask, fused, tfb)
                    dead += d
                else:
                    n_t = score_entry(postings, pos[i], wend[i], weights[i], cache, norms, base, w0, acc, live,
                                      touched, n_t, shift, mask, fused, tfb)
            stats[ST_SCORED] += to_score - dead
            stats[ST_DEAD_POSTINGS] += dead
            m = m_ess
            stats[ST_CANDIDATES] += n_t
            src = touched
            n_c = n_t
            is_sorted = False
            pruned = False  # src is cands (else touched)
            while m < n_o:
                i = order[m]
                lo = pos[i]
                hi = wend[i]
                # A pruning pass costs about what a scan of as many postings does: prune when the term has more
                # postings in the window than there are candidates (it may then be probed); the flush drops the
                # rest (their scores are complete: a scan adds to every doc still in the accumulator).
                if hi - lo > n_c:
                    n_c = prune_candidates(acc, live, src, n_c, remaining[m - 1] * slack, theta, cands)
                    src = cands
                    pruned = True
                    if n_c == 0:
                        break
                if n_c * probe_ratio < hi - lo:
                    if not is_sorted:  # pruning keeps the order, so one sort serves every later term
                        if not pruned:
                            cands[:n_c] = touched[:n_c]
                            src = cands
                            pruned = True
                        cands[:n_c].sort()
                        is_sorted = True
                    e = ent[i]
                    f0 = np.int64(fine_ptr[e])
                    f = f0 + (lo - np.int64(blk_start[e])) // fine_block
                    probe_entry(postings, lo, hi, fine_last, f, np.int64(blk_start[e]) + (f - f0) * fine_block,
                                fine_block, weights[i], cache, norms, base, w0, acc, cands, n_c, shift, mask, fused,
                                tfb)
                    stats[ST_PROBES] += n_c
                else:
                    scan_entry(postings, lo, hi, weights[i], cache, norms, base, w0, acc, live, shift, mask, fused, tfb)
                    stats[ST_SCANNED] += hi - lo
                m += 1
            for j in range(n_o):
                pos[order[j]] = wend[order[j]]
            stats[ST_FLUSHED] += n_c
            flush_block(acc, live, src, n_c, doc_off + base + w0, buf, st, k, stats, ST_PUSHES, deleted, base + w0)


@njit(nogil=True, cache=True, error_model="numpy")
def term_scratch(nq):
    """``search_shard``'s per-term scratch for up to ``nq`` terms."""
    return TermScratch(np.empty((7, nq), dtype=np.int64), np.empty((2, nq), dtype=np.float64),
                       np.empty(nq, dtype=np.float32))


@njit(nogil=True, cache=True, error_model="numpy")
def sum_is_exact(weights, min_q):
    """``bm25.sum_is_exact`` compiled (the same f64 operations): called per query inside ``search_query``."""
    if weights.size <= 1:
        return True
    if min_q <= 0.0:
        return False
    max_s = np.float64(weights[0])
    min_w = np.float64(weights[0])
    for i in range(1, weights.size):
        max_s = max(max_s, np.float64(weights[i]))
        min_w = min(min_w, np.float64(weights[i]))
    min_s = min_w * min_q / (1.0 + min_q) * (1 - 1e-6)
    if min_s <= 0.0:
        return False
    ulp_min = 2.0 ** (math.frexp(min_s)[1] - 24)
    return weights.size * max_s < 2.0 ** 53 * ulp_min


@njit(nogil=True, cache=True, error_model="numpy")
def search_query(shards, layout, window, cache, min_q, term_ids, weights, bounds, k, tuning, scratch):
    """One query's whole pass over one index in one call (the per-call costs of several are a few percent of a
    short query): the exactness test, the seeded threshold, ``search_shard`` over ``shards`` (``Shard`` tuples,
    in docid order) and, when at most ``SMALL_TOPK`` keys are kept, their ranking. ``layout``: ``Layout``,
    ``tuning``: ``Tuning``, ``scratch``: ``Scratch`` (its state is reset here; its top-k holds 2k keys); ``bounds``:
    whether the layout's bounds apply. Returns (docids, f32 scores) best first, or two empty arrays with more
    keys kept (``scratch.state[0]``: the caller ranks ``scratch.top[:state[0]]``)."""
    layout = Layout(*layout)
    tuning = Tuning(*tuning)
    scratch = Scratch(*scratch)
    st = scratch.state
    st[0] = 0
    st[1] = 0
    st[2] = 0
    exact = sum_is_exact(weights, min_q)
    tids = term_ids.astype(np.int64)
    none = np.zeros(0, dtype=np.uint8)
    work = term_scratch(tids.size)
    if tuning.prune and tuning.seed:
        for sh in shards:
            seed_threshold(_shard(sh).arrays, layout, cache, tids, weights, bounds, k, tuning.seed_exact, none, st)
    for sh in shards:  # in docid order: the top-k carries the k-th score across shards
        search_shard(_shard(sh), layout, window, cache, tids, weights, bounds, exact, k, tuning, scratch, work, 0, none)
    if st[0] > SMALL_TOPK:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    return topk_small(scratch.top, np.int64(st[0]), k)


@njit(nogil=True, cache=True, error_model="numpy")
def search_segments(segments, terms, weights, cache, min_q, k, tuning, scratch):
    """One query over several indexes (a live index's segments, ``retrieval/live.py``) into ONE top-k: one call
    however many segments, where a call per segment costs its dispatch, a top-k and a merge each.

    ``segments`` (a numba typed List, in docid order) holds a ``Segment`` tuple per shard of each index.
    ``terms[row]`` holds the query's term ids in a segment's index (-1: not there), the order of ``weights`` (the
    canonical order in every segment: their vocabularies are sorted alike); ``cache`` is the norm cache of the
    collection's statistics, the same for every segment. Docids returned are in the shared space (a segment's
    first docid plus its local docid). Returns as ``search_query`` does."""
    tuning = Tuning(*tuning)
    scratch = Scratch(*scratch)
    st = scratch.state
    st[0] = 0
    st[1] = 0
    st[2] = 0
    exact = sum_is_exact(weights, min_q)
    nq = weights.size
    tids = np.empty(nq, dtype=np.int64)
    wts = np.empty(nq, dtype=weights.dtype)
    work = term_scratch(nq)
    for phase in range(2):  # 0: seed the threshold from the segments marked for it; 1: search
        if phase == 0 and not (tuning.prune and tuning.seed):
            continue
        for entry in segments:
            seg = Segment(*entry)
            if phase == 0 and not seg.seed:
                continue
            row = terms[seg.row]
            n = 0
            for i in range(nq):
                if row[i] >= 0:
                    tids[n] = row[i]
                    wts[n] = weights[i]
                    n += 1
            if n == 0:
                continue
            shard = _shard(seg.shard)
            layout = Layout(*seg.layout)
            if phase == 0:
                seed_threshold(shard.arrays, layout, cache, tids[:n], wts[:n], seg.bounds, k, tuning.seed_exact,
                               seg.deleted, st)
            else:
                search_shard(shard, layout, seg.window, cache, tids[:n], wts[:n], seg.bounds, exact, k, tuning,
                             scratch, work, seg.doc_off, seg.deleted)
    if st[0] > SMALL_TOPK:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    return topk_small(scratch.top, np.int64(st[0]), k)


@njit(nogil=True, cache=True, error_model="numpy")
def fold_layouts(layouts, rowmaps, n_rows, block_offs):
    """Several small indexes' search arrays (``ShardArrays`` tuples, each one shard) as one index whose blocks are
    theirs side by side: index j's block b becomes block ``block_offs[j] + b``, its term t the term
    ``rowmaps[j][t]`` of a shared vocabulary of ``n_rows`` terms (sorted as theirs are), and each term's block
    entries are those of every index in index order (ascending blocks, as the layout has them). Postings, bounds
    and fine bounds are copied as they are (they are block-relative), so a search of the result scores every
    document exactly as a search of its own index, with its term metadata in one place: ten small delta segments
    searched this way cost what one does (``search_segments``). Needs one block size, tf bits, fine block and
    norm fusion for all. Returns the ``ShardArrays``."""
    cnt = np.zeros(n_rows, dtype=np.int64)
    n_post = 0
    n_fine = 0
    for j in range(len(layouts)):
        a = ShardArrays(*layouts[j])
        rm = rowmaps[j]
        tp = a.term_ptr
        for t in range(tp.size - 1):
            cnt[rm[t]] += np.int64(tp[t + 1]) - np.int64(tp[t])
        n_post += a.postings.size
        n_fine += a.fine_maxq.size
    term_ptr = np.zeros(n_rows + 1, dtype=np.uint32)
    for r in range(n_rows):
        term_ptr[r + 1] = term_ptr[r] + cnt[r]
    n_ent = np.int64(term_ptr[n_rows])
    cur = term_ptr[:n_rows].astype(np.int64)
    src_j = np.empty(n_ent, dtype=np.int64)
    src_e = np.empty(n_ent, dtype=np.int64)
    for j in range(len(layouts)):
        rm = rowmaps[j]
        tp = ShardArrays(*layouts[j]).term_ptr
        for t in range(tp.size - 1):
            r = rm[t]
            for e in range(np.int64(tp[t]), np.int64(tp[t + 1])):
                src_j[cur[r]] = j
                src_e[cur[r]] = e
                cur[r] += 1
    postings = np.empty(n_post, dtype=np.uint32)
    blk_id = np.empty(n_ent, dtype=np.uint32)
    blk_start = np.empty(n_ent + 1, dtype=np.uint32)
    blk_maxq = np.empty(n_ent, dtype=np.float32)
    blk_maxtf = np.empty(n_ent, dtype=np.uint32)
    blk_minnorm = np.empty(n_ent, dtype=np.uint8)
    fine_ptr = np.empty(n_ent + 1, dtype=np.uint32)
    fine_maxq = np.empty(n_fine, dtype=np.float32)
    fine_last = np.empty(n_fine, dtype=np.uint32)
    p = 0
    f = 0
    for i in range(n_ent):
        j = src_j[i]
        e = src_e[i]
        a = ShardArrays(*layouts[j])
        blk_id[i] = a.blk_id[e] + np.uint32(block_offs[j])
        blk_start[i] = p
        for x in range(np.int64(a.blk_start[e]), np.int64(a.blk_start[e + 1])):
            postings[p] = a.postings[x]
            p += 1
        blk_maxq[i] = a.blk_maxq[e]
        blk_maxtf[i] = a.blk_maxtf[e]
        blk_minnorm[i] = a.blk_minnorm[e]
        fine_ptr[i] = f
        for x in range(np.int64(a.fine_ptr[e]), np.int64(a.fine_ptr[e + 1])):
            fine_maxq[f] = a.fine_maxq[x]
            fine_last[f] = a.fine_last[x]
            f += 1
    blk_start[n_ent] = p
    fine_ptr[n_ent] = f
    return ShardArrays(postings, term_ptr, blk_id, blk_start, blk_maxq, blk_maxtf, blk_minnorm, fine_ptr, fine_maxq,
                       fine_last)
