"""The BM25 tile scorer in Triton (``_tile_kernel``): the fallback of ``cuda/relevancy.cu``'s scorer.

One program scores one (query, tile) at a time into its own ``TILE``-cell f64 scratch (16 KiB: it stays in L1/L2),
adding the query's terms one after the other in ascending term id, so every sum is the canonical one of
``indexer/FORMAT.md`` and the scores equal the CPU backend's bit for bit with no atomics. From the tile it writes the
f32 maximum of each group of ``GROUP`` docs and the f32 scores of the groups that matched.
"""
from __future__ import annotations

import triton
import triton.language as tl


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
