"""The tile pipeline's Triton kernels: tile ranges (``_bounds_kernel``), tile scoring (``_tile_kernel``) and the collect
of candidates (``_collect_kernel``). They are the fallback where the CUDA C kernels (``cuda/*.cu``) cannot be compiled
(no NVRTC), and the version CI runs under Triton's interpreter (``TRITON_INTERPRET=1``) on the CPU; same inputs,
outputs and summation order as the CUDA ones. ``relevancy`` and ``selection`` launch them.

One program scores one (query, tile) at a time into its own ``TILE``-cell f64 scratch (16 KiB: it stays in L1/L2),
adding the query's terms one after the other in ascending term id, so every sum is the canonical one of
``indexer/FORMAT.md`` and the scores equal the CPU backend's bit for bit with no atomics. From the tile it writes the
f32 maximum of each group of ``GROUP`` docs and the f32 scores of the groups that matched.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheel of torch ships without Triton
    triton = None


def triton_available() -> bool:
    return triton is not None


def programs(device: torch.device, per_sm: int) -> int:
    """Programs of the persistent scoring kernel: ``per_sm`` a multiprocessor (one on the CPU interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count * per_sm


if triton is not None:

    @triton.jit(do_not_specialize=["n_ent"])
    def _bounds_kernel(ent, n_ent, post, bounds, tf_bits, TILE: tl.constexpr, TPB: tl.constexpr, STEPS: tl.constexpr):
        # bounds[e, j] = first posting of entry e whose doc offset is >= j * TILE (binary search per lane).
        # STEPS is a constexpr: Triton 3.6's interpreter cannot take a runtime scalar as a loop bound (it converts
        # the 1-element array with int(), which NumPy 2.4 refuses).
        e = tl.program_id(0).to(tl.int64)
        st = tl.load(ent + e)
        cnt = tl.load(ent + n_ent + e)
        j = tl.arange(0, TPB).to(tl.int64)
        target = (j * TILE) << tf_bits
        lo = tl.zeros([TPB], dtype=tl.int64)
        hi = lo + cnt
        for _ in range(STEPS):
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
