"""The tile scoring kernel of ``gpu_tiles`` in CUDA C: the same inputs, outputs and summation order, with the
tile's f64 accumulator in shared memory.

Triton has no shared memory that threads index freely, so its kernel keeps the tile in a per-program scratch in
global memory (L1/L2): every posting's read-modify-write, the read-out and the zeroing go through the cache
hierarchy, and the per-term scalars are pulled out of vectors by reductions. Here one thread block scores one
(query, tile) unit: the terms' ranges go to shared memory with one round trip, each term's postings are added
by all threads at once (its docs are distinct, so no two threads touch one cell), a block barrier separates
the terms (ascending term id: the canonical sum of ``indexer/FORMAT.md``). Arithmetic: every f32 operation
rounded as written (``--fmad=false``, ``__f*_rn``).

Queries whose f64 sums are exact in any order (``bm25.sum_is_exact``: nearly all) take a flat path instead: the tile's
postings of all terms are numbered end to end, each thread takes every THREADS-th one, ``UNROLL`` at a time with their
loads in flight together, and adds it with shared-memory atomics to the doc's 64-bit fixed-point sum (the plan's
``flat_shift`` per pair: every score an integer there, so the sums are exact, and their f32 roundings are the f64
sums'). No barrier separates the terms, so a tile costs a few memory round trips instead of a few per term.

Blocks a multiprocessor holds are bounded by the tile's shared memory, so the register budget is set from that
limit (``min_blocks``; one H200 run, 21M docs, a batch of 64 NQ queries: 5.33 ms with 40 registers and 12 blocks a
multiprocessor, 5.79 ms with 56 and 9, 6.14 ms with 64 and 8). With the blocks resident, the kernel is bound by
instruction issue (Nsight Compute: 77% of issue slots busy, DRAM 15%), so the read-out is kept lean: each thread
compares the f32 scores of its own run of cells, and every warp finds the tile's cut itself, with no second
barrier.

Under a row's threshold (``theta``, from a sample of the units: see ``gpu_tiles``; or the running threshold, which
the launch raises from its own tiles' maxima as they finish: ``run_scan``) a tile whose maximum, or a bound above it,
tracked from the sums the adds store, falls below it returns before the read-out, and groups below it are not
written: at k > 32, where the tile's own cut keeps every matched group, that was most of the read-out.
``bm25_filter`` lists the units that may reach the threshold by the same adds as an upper bound (a 2-ulp division and
16-bit fixed-point sums, two a word, by the integer atomics Hopper has in shared memory while a float's is a
compare-and-swap loop; a margin for the rest; two tiles a block, 16 blocks a multiprocessor instead of 12), and
``bm25_listed`` scores the listed ones exactly.

``SELECT_SOURCE`` holds the kernels around the scorer, in the same module: the plan's tile ranges (binary searches of
samples of the postings, then of SAMPLE postings; the samples are made once the postings are on the device), a
single query's whole plan with them (``plan_single``: no host planning on its latency path), the k-th largest tile
maximum (radix select), the collect kernel, which also clears the maxima it read, and a single query's ranking of its
candidates.
"""
from __future__ import annotations

import torch

from ragserve.kernels.gpu.rtc import CudaModule

THREADS = 128  # threads per block: a tile's term has ~0-1,000 postings
MAX_TERMS = 64  # entries whose ranges sit in shared memory at once (the flat path's prefix sum: 2 per lane)
UNROLL = 2  # postings per thread in flight at once on the flat path (H200, two runs: 2 beat 4 by 3-10%; 1 and 8 lose)
COLLECT_GROUPS = 1024  # groups a collect block reads (its tiles' maxima cleared with them: a multiple of TILE / 32)
BOUNDS_THREADS = 256
SAMPLE = 32  # tile_start's samples: the tile of every SAMPLE-th posting of the arena (a 128-byte line of postings)
KTH_THREADS = 1024
KTH_REG = 16  # tile maxima a kth_largest thread keeps in registers: all of a row up to 16,384 tiles (33M docs)
COLLECT_THREADS = 256
SORT_MAX = 2048  # candidates of a single query ranked on the device (16 KiB of keys in shared memory)
RANK_THREADS = 256
RANK_SPLIT = 32  # threads counting the keys below one key (a power of two, <= 32: lanes of one warp; H200,
# 1,050 keys: 2.3 us with 32, 2.6 with 16, 3.0 with 8)
RANK_BLOCKS = SORT_MAX * RANK_SPLIT // RANK_THREADS
QMAX = 128  # terms of a query planned on the device (``plan_single``); more: on the host
QUERY_WORDS = 2 + 2 * QMAX  # its Query struct, in 4-byte words
PLAN_TERMS = 32  # plan_single's grid covers queries of up to this many terms in one pass
# The scorer's running threshold (``run_scan``): a histogram of tile maxima, 16 bins a power of two from 2^-40 (the
# bins' edges 4.4% apart), scanned every RUN_SCAN tiles a row; a row's words: the bins, the tiles counted, the threshold
# and two spare (rows 16 bytes apart: the scan reads the bins 16 bytes at a time).
RUN_BINS, RUN_SHIFT, RUN_BASE = 1024, 19, (127 - 40) << 4
RUN_SCAN = 256
RUN_WORDS = RUN_BINS + 4

SOURCE = r"""
#define NG (TILE / 32)
#define CPT (TILE / THREADS)  // read-out: consecutive cells per thread
#define VPL ((NG + 31) / 32)  // group maxima per lane when one warp selects the k-th largest
static_assert(CPT * THREADS == TILE && CPT <= 32 && THREADS % 32 == 0, "THREADS divides TILE into warps");
static_assert(NG <= THREADS, "one ballot per warp finds its kept groups");
static_assert(MAX_TERMS <= 64, "the flat path's prefix sum takes two counts per lane of one warp");
// The flat path's adds: postings j = tid, tid + THREADS, ... of the tile's terms numbered end to end (t_end: the
// inclusive prefix sum of their counts; t_first: a term's first posting minus its first flat index), UNROLL at a
// time with their loads in flight together. SCORE(w, q) is a posting's term score from its weight and tf * cache[norm];
// ADD(off, s) adds s to the sum of the doc at offset off from the tile's first and keeps track of the largest sum
// stored. A macro, not a function: the scorer and the filter compile to the same code as when each spelled it out (a
// function taking the shared arrays by pointer did not).
#define FLAT_ADDS(SCORE, ADD)                                                                                   \
    {                                                                                                           \
        int t = 0; /* the term of this thread's posting: flat indices only grow */                              \
        for (int j0 = tid; j0 < total; j0 += THREADS * UNROLL) {                                                \
            unsigned p[UNROLL];                                                                                 \
            int term[UNROLL];                                                                                   \
            unsigned char nb[UNROLL];                                                                           \
            _Pragma("unroll") for (int r = 0; r < UNROLL; ++r) {                                                \
                const int j = j0 + r * THREADS;                                                                 \
                if (j < total) {                                                                                \
                    while (t_end[t] <= j) ++t;                                                                  \
                    term[r] = t;                                                                                \
                    p[r] = __ldg(post + t_first[t] + j);                                                        \
                }                                                                                               \
            }                                                                                                   \
            _Pragma("unroll") for (int r = 0; r < UNROLL; ++r)                                                  \
                if (j0 + r * THREADS < total) nb[r] = __ldg(norms + d0 + ((int)(p[r] >> tf_bits) - toff));      \
            _Pragma("unroll") for (int r = 0; r < UNROLL; ++r) {                                                \
                if (j0 + r * THREADS < total) {                                                                 \
                    const float w = t_w[term[r]];                                                               \
                    const float q = __fmul_rn((float)(p[r] & tf_mask), __ldg(cache + nb[r]));                   \
                    const float s = SCORE(w, q);                                                                \
                    ADD((int)(p[r] >> tf_bits) - toff, s);                                                      \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
    }
// FORMAT.md's f32 term score, every operation rounded as written: the exact scorer's.
#define SCORE_EXACT(w, q) __fsub_rn(w, __fdiv_rn(w, __fadd_rn(1.0f, q)))
// The filter's: w q / (1 + q) with a 2-ulp division (two instructions instead of IEEE division's ~8, in a pass bound
// by instruction issue). It is within 2^-20 w below SCORE_EXACT (which loses up to an ulp of w by cancellation when
// q is small); the filter's test allows for that.
#define SCORE_BOUND(w, q) __fmul_rn(w, __fdividef(q, __fadd_rn(1.0f, q)))
// The flat path's sums (exact in any order): s * 2^shift is an integer (``gpu_tiles.flat_shift``), added to the doc's
// 64-bit fixed-point sum as two 32-bit words by the shared-memory atomic Hopper has natively, the low word's carry
// with the high one (a 64-bit add, integer or float, is a compare-and-swap loop: ncu counted 3.2 tries an add). run
// keeps the largest high word this thread stored: a doc's last high-word add sees its final value, so (run + 1) << 32
// bounds the tile's sums from above.
__device__ __forceinline__ unsigned add_fixed64(unsigned* cell, const float s, const float scale, const unsigned run)
{
    const unsigned long long v = __float2ull_rn(__fmul_rn(s, scale));
    const unsigned lo = (unsigned)v, old = atomicAdd(cell, lo);
    const unsigned hi = (unsigned)(v >> 32) + (old + lo < old ? 1u : 0u);
    return max(run, atomicAdd(cell + 1, hi) + hi);
}
#define UNSCALE __int_as_float((127 - s_shift) << 23)  // 1 / scale
#define ADD_FIXED64(off, s) run = add_fixed64(reinterpret_cast<unsigned*>(acc) + 2 * (off), s, scale, run)
// A cell's f32 score: the flat path's fixed-point sum (its f32 rounding is the exact sum's, then scaled by a power of
// two) or the ordered path's f64.
__device__ __forceinline__ float cell_f32(const double* acc, const int i, const bool flat, const float unscale)
{
    return flat ? __fmul_rn(__ull2float_rn(reinterpret_cast<const unsigned long long*>(acc)[i]), unscale)
                : (float)acc[i];
}
// The largest f32 score of a thread's CPT consecutive cells (its start rotated by tid: no bank conflicts), that is the
// f32 of the largest sum: rounding is monotone, so f32 compares suffice (an f64 or a 64-bit integer max takes several
// instructions, and the kernel is bound by instruction issue: ncu, 62-77% of issue slots busy), and the flat path's
// scaling is applied once.
__device__ __forceinline__ float cells_max(const double* acc, const int tid, const bool flat, const float unscale)
{
#if CPT >= 2  // 16-byte reads, the 8 threads of a quarter warp on distinct banks; two chains of comparisons
    if (flat) {
        float m = 0.0f, mb = 0.0f;
#pragma unroll
        for (int i = 0; i < CPT / 2; ++i) {
            const ulonglong2 v =
                reinterpret_cast<const ulonglong2*>(acc)[tid * (CPT / 2) + ((i + tid) & (CPT / 2 - 1))];
            m = fmaxf(m, __ull2float_rn(v.x));
            mb = fmaxf(mb, __ull2float_rn(v.y));
        }
        return __fmul_rn(fmaxf(m, mb), unscale);
    }
    float gm = 0.0f, gmb = 0.0f;
#pragma unroll
    for (int i = 0; i < CPT / 2; ++i) {
        const double2 v = reinterpret_cast<const double2*>(acc)[tid * (CPT / 2) + ((i + tid) & (CPT / 2 - 1))];
        gm = fmaxf(gm, (float)v.x);
        gmb = fmaxf(gmb, (float)v.y);
    }
    return fmaxf(gm, gmb);
#else
    float gm = 0.0f;
    for (int i = 0; i < CPT; ++i) gm = fmaxf(gm, cell_f32(acc, tid * CPT + ((i + tid) & (CPT - 1)), flat, unscale));
    return gm;
#endif
}
// The filter's bound: s * scale rounded up to an integer, added by the one shared-memory atomic Hopper has natively (a
// float's is a compare-and-swap loop) to a 16-bit sum, two a word (the scale keeps every sum under 2^16: no carry
// crosses into the other half). run keeps the largest sum stored in each tile of the span, one a 16-bit half.
static_assert(FSPAN == 1 || FSPAN == 2, "a filter block's tiles' maxima are the halves of one word");
__device__ __forceinline__ unsigned add_fixed(unsigned* acc, const int off, const float s, const float scale,
                                              const unsigned run)
{
    const unsigned u = __float2uint_ru(__fmul_rn(s, scale));
    const int sh = (off & 1) << 4;
    const unsigned sum = ((atomicAdd(acc + (off >> 1), u << sh) >> sh) & 0xFFFFu) + u;
    return __vmaxu2(run, sum << ((off / TILE) << 4));
}
#define ADD_FIXED(off, s) run = add_fixed(acc, off, s, scale, run)

#define UNIT_PARAMS const long long* __restrict__ ent, long long n_ent, const long long* __restrict__ pairs, \
    long long n_pairs, const unsigned* __restrict__ post, const unsigned char* __restrict__ norms, \
    const float* __restrict__ cache, const int* __restrict__ bounds, float* __restrict__ maxima, \
    float* __restrict__ tile_maxima, float* __restrict__ scores, long long num_docs, long long n_groups, \
    long long n_tiles, int tf_bits, long long block_size, int k, const float* __restrict__ theta, \
    unsigned* __restrict__ running
#define UNIT_ARGS ent, n_ent, pairs, n_pairs, post, norms, cache, bounds, maxima, tile_maxima, scores, num_docs, \
    n_groups, n_tiles, tf_bits, block_size, k, theta, running

// Entry e's postings in tiles tile, ..., tile + span - 1 of its doc block: the index of the first in post (at first),
// and their count.
__device__ __forceinline__ int tile_range(const long long* __restrict__ ent, const long long n_ent,
                                          const int* __restrict__ bounds, const long long e, const int tile,
                                          const int span, long long& first)
{
    const int lo = bounds[e * TPB + tile];
    const int hi = tile + span < TPB ? bounds[e * TPB + tile + span] : (int)ent[n_ent + e];
    first = ent[e] + lo;
    return hi - lo;
}

// Warp 0's term ranges numbered end to end for the flat adds: lane l holds entries 2 l and 2 l + 1 (first posting,
// count; ne entries in all); t_first[i] becomes entry i's first posting minus its first flat index, t_end[i] the
// inclusive prefix sum of the counts.
__device__ __forceinline__ void number_end_to_end(const long long (&first)[2], const int (&count)[2], const int ne,
                                                  const int lane, long long* t_first, int* t_end)
{
    int incl = count[0] + count[1];
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    int before = incl - count[0] - count[1];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = 2 * lane + r;
        if (i < ne) {
            t_first[i] = first[r] - before;
            before += count[r];
            t_end[i] = before;
        }
    }
}

// The running threshold (``running``: RUN_WORDS a row; null: none). Each tile read out counts its maximum in the row's
// histogram (RUN_BINS bins of RUN_SHIFT-bit steps of the f32 bits from RUN_BASE: 16 a power of two, values outside in
// the end bins); at the k-th tile counted and every RUN_SCAN-th after, one block finds the highest bin edge that k of
// the tiles counted so far reach and raises the row's threshold (word RUN_BINS + 1) to it. The k-th largest tile
// maximum, and so the k-th score, is at least that edge: tiles and groups below it hold no top-k doc, so they are not
// read out or written, like those under a sample's threshold, but from the launch's own tiles. Tiles below the
// threshold are not counted: counts of a subset of the tiles keep every edge valid, and counts below the threshold
// can no longer raise it. Counts only grow and every edge reached stays valid, so the scan reads whatever counts have
// landed (L2, no ordering needed). The collect kernel clears a row's words.
__device__ __forceinline__ int run_bin(const float x)
{
    return min(max((int)(__float_as_uint(x) >> RUN_SHIFT) - RUN_BASE, 0), RUN_BINS - 1);
}

// Warp 0 of a block: lane l sums the l-th RUN_BINS / 32 bins from the top; the first lane whose running sum reaches k
// holds the bin, found by a second read of its bins, a lane each (counts that grew meanwhile only move it up).
__device__ __forceinline__ void run_scan(unsigned* __restrict__ st, const int k, const int lane)
{
    constexpr int PER = RUN_BINS / 32;
    static_assert(PER == 32, "the second read takes one of a lane's bins a lane");
    const uint4* mine = reinterpret_cast<const uint4*>(st + RUN_BINS - PER * (lane + 1));
    unsigned sum = 0;
#pragma unroll
    for (int i = 0; i < PER / 4; ++i) {
        const uint4 v = __ldcg(mine + i);
        sum += v.x + v.y + v.z + v.w;
    }
    unsigned incl = sum;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, incl >= (unsigned)k);
    if (hit == 0) return;
    const int f = __ffs(hit) - 1;
    const unsigned above = __shfl_sync(0xffffffffu, incl - sum, f);
    const int bin = RUN_BINS - PER * f - 1 - lane;
    unsigned c = __ldcg(st + bin);
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned up = __shfl_up_sync(0xffffffffu, c, o);
        if (lane >= o) c += up;
    }
    const unsigned hit2 = __ballot_sync(0xffffffffu, above + c >= (unsigned)k);
    if (lane == __ffs(hit2) - 1 && bin > 0) atomicMax(st + RUN_BINS + 1, (unsigned)(bin + RUN_BASE) << RUN_SHIFT);
}

// One (query, tile) unit: its f64 sums, and the read-out of the groups that can hold a top-k doc; RUN: with the
// running threshold (where ``running`` is not null).
template <bool RUN>
__device__ __forceinline__ void score_unit(const long long unit, UNIT_PARAMS)
{
    __shared__ __align__(16) double acc[TILE];
    __shared__ float g_max[NG];
    __shared__ long long t_first[MAX_TERMS];  // the term's first posting; flat path: minus its first flat index
    __shared__ int t_count[MAX_TERMS];  // not flat: the term's postings in the tile
    __shared__ float t_w[MAX_TERMS];
    __shared__ int t_end[MAX_TERMS];  // flat path: inclusive prefix sum of the counts
    __shared__ float w_max[THREADS / 32];
    __shared__ float g_top[THREADS / 32];
    __shared__ float s_run;
    __shared__ int s_shift;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long pair = unit / TPB;
    const int tile = (int)(unit % TPB);
    const long long row = pairs[pair], blk = pairs[n_pairs + pair];
    const long long i0 = pairs[2 * n_pairs + pair], i1 = pairs[3 * n_pairs + pair];
    // the flat path's fixed-point shift (gpu_tiles.flat_shift; 0: the terms in order, f64 sums), kept in shared memory
    // until used (a register held through the ranges made bm25_listed spill)
    const int shift = (int)pairs[4 * n_pairs + pair];
    const bool flat = shift != 0;
    if (tid == 0) s_shift = shift;
    unsigned* const st = RUN && running ? running + row * RUN_WORDS : nullptr;
    // the running threshold as the tile starts (read now: its latency passes while the tile is scored)
    const float run_th = st && tid == 0 ? __uint_as_float(__ldcg(st + RUN_BINS + 1)) : 0.0f;
    const long long d0 = blk * block_size + (long long)tile * TILE;
    if (d0 >= num_docs) return;
    const unsigned tf_mask = (1u << tf_bits) - 1u;
    const int toff = tile * TILE;
#if TILE / 2 >= THREADS  // a count the compiler knows, so no loop (3% less scoring time on the H200)
    double2* acc2 = reinterpret_cast<double2*>(acc);
#pragma unroll
    for (int j = 0; j < TILE / 2 / THREADS; ++j) acc2[j * THREADS + tid] = make_double2(0.0, 0.0);
#else
    if (tid < TILE / 2) reinterpret_cast<double2*>(acc)[tid] = make_double2(0.0, 0.0);
#endif
    long long work = 0;  // the same in every thread: read from shared memory
    // the largest sum this thread stored, its f32's bits (non-negative floats order like their bits: scores only grow,
    // so their maximum is the tile's); flat: the largest high word it stored
    unsigned run = 0;
    for (long long e0 = i0; e0 < i1; e0 += MAX_TERMS) {
        const int ne = (int)min((long long)MAX_TERMS, i1 - e0);
        if (e0 != i0) __syncthreads();  // the previous terms' ranges are no longer read
        if (warp == 0) {  // lane l: entries 2 l and 2 l + 1; on the flat path numbered end to end
            long long first[2];
            int count[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = 2 * lane + r;
                count[r] = 0;
                if (i < ne) {
                    const long long e = e0 + i;
                    count[r] = tile_range(ent, n_ent, bounds, e, tile, 1, first[r]);
                    t_w[i] = __int_as_float((int)ent[2 * n_ent + e]);
                }
            }
            if (flat) {
                number_end_to_end(first, count, ne, lane, t_first, t_end);
            } else {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int i = 2 * lane + r;
                    if (i < ne) {
                        t_first[i] = first[r];
                        t_count[i] = count[r];
                    }
                }
            }
        }
        __syncthreads();  // the ranges are read, the zeroing is done
        if (flat) {
            const int total = t_end[ne - 1];
            const float scale = __int_as_float((127 + s_shift) << 23);
            work += total;
            FLAT_ADDS(SCORE_EXACT, ADD_FIXED64)
            __syncthreads();  // the adds are done before the read-out or the next terms' ranges
            continue;
        }
        for (int t = 0; t < ne; ++t) {  // ascending term id
            const int n = t_count[t];
            if (n == 0) continue;
            work += n;
            const unsigned* p_t = post + t_first[t];
            const float w = t_w[t];
            for (int j = tid; j < n; j += THREADS) {
                const unsigned p = __ldg(p_t + j);
                const int off = (int)(p >> tf_bits) - toff;
                const float q = __fmul_rn((float)(p & tf_mask), __ldg(cache + __ldg(norms + d0 + off)));
                const float s = SCORE_EXACT(w, q);
                const double v = __dadd_rn(acc[off], (double)s);
                acc[off] = v;
                run = max(run, __float_as_uint((float)v));
            }
            __syncthreads();  // the next term may add to the same cells from other threads
        }
    }
    if (work == 0) return;
    // the tile's maximum; flat: a bound above it, (run + 1) << 32 scaled
    float top = flat ? __fmul_rn(__ull2float_ru((unsigned long long)(run + 1) << 32), UNSCALE) : __uint_as_float(run);
    for (int o = 16; o; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
    if (lane == 0) w_max[warp] = top;
    if (tid == 0) s_run = run_th;
    __syncthreads();
    float t_max = w_max[0];  // the tile's maximum (flat: a bound above it)
    for (int w = 1; w < THREADS / 32; ++w) t_max = fmaxf(t_max, w_max[w]);
    // Below the row's threshold (a sample's k-th largest tile maximum, or the running one: k docs score at least this)
    // no doc of the tile can be in the top-k: nothing is read out or written, and its maxima stay zero. Nor is it
    // counted for the running threshold: a count below the threshold can no longer raise it.
    const float th = fmaxf(theta[row], s_run);
    if (t_max < th) return;
    float gm = cells_max(acc, tid, flat, UNSCALE);  // group maxima
    for (int o = 1; o < 32 / CPT; o <<= 1) gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, o));
    if (tid % (32 / CPT) == 0) g_max[tid / (32 / CPT)] = gm;
    if (flat) {  // and the warps' maxima: the tile's maximum itself, where t_max was a bound
        for (int o = 32 / CPT; o < 32; o <<= 1) gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, o));
        if (lane == 0) g_top[warp] = gm;
    }
    __syncthreads();
    // Every warp alike (no second barrier): the tile maximum, and a cut no higher than the k-th largest group maximum:
    // the k-th largest of the lanes' maxima (each lane holds VPL groups; k lanes reaching it are k groups), by a
    // bitonic sort across the warp, descending. Groups below it are not written and their maxima read 0: k other
    // docs of the tile score more than any of theirs. 0 (every matched group kept) when k > 32. Nor are groups below
    // the row's threshold.
    const int k_tile = k < NG ? k : 0;  // 0: every matched group
    float lane_max = 0.0f;
    for (int i = 0; i < VPL; ++i) lane_max = fmaxf(lane_max, lane + 32 * i < NG ? g_max[lane + 32 * i] : 0.0f);
    if (flat) {
        t_max = g_top[0];
        for (int w = 1; w < THREADS / 32; ++w) t_max = fmaxf(t_max, g_top[w]);
        if (t_max < th) return;
    }
    unsigned c = 0;  // thread 0: the row's tiles counted so far, this one too (used last: the read-out hides the wait)
    if (st && tid == 0) {
        atomicAdd(st + run_bin(t_max), 1u);
        c = atomicAdd(st + RUN_BINS, 1u) + 1;
    }
    float keep_from = 0.0f;
    if (k_tile > 0 && k_tile <= 32) {
        float x = lane_max;
        for (int size = 2; size <= 32; size <<= 1) {
            for (int stride = size >> 1; stride; stride >>= 1) {
                const float y = __shfl_xor_sync(0xffffffffu, x, stride);
                x = ((lane & stride) == 0) == ((lane & size) == 0) ? fmaxf(x, y) : fminf(x, y);
            }
        }
        keep_from = __shfl_sync(0xffffffffu, x, k_tile - 1);
    }
    keep_from = fmaxf(keep_from, th);  // a group below the threshold holds no top-k doc either
    if (tid == 0) tile_maxima[row * n_tiles + d0 / TILE] = t_max;
    for (int g = tid; g < NG; g += THREADS) {  // the tile's group maxima are adjacent: one coalesced write
        const float m = g_max[g];
        if (d0 / 32 + g < n_groups) maxima[row * n_groups + d0 / 32 + g] = m > 0.0f && m >= keep_from ? m : 0.0f;
    }
    // A kept group's scores: one warp, 128 adjacent bytes; warp w takes groups w, w + NW, ... Under a k-th largest
    // cut few are kept, and one ballot finds them; with every matched group kept, a loop of fixed length over all of
    // them keeps its reads in flight together (the ballot's loop would wait on each in turn).
    if (k_tile > 0) {
        const int mine = warp + (THREADS / 32) * lane;
        const float m = mine < NG ? g_max[mine] : 0.0f;
        for (unsigned kept = __ballot_sync(0xffffffffu, m > 0.0f && m >= keep_from); kept; kept &= kept - 1) {
            const int g = warp + (THREADS / 32) * (__ffs(kept) - 1);
            const long long doc = d0 + g * 32 + lane;
            if (doc < num_docs) scores[row * num_docs + doc] = cell_f32(acc, g * 32 + lane, flat, UNSCALE);
        }
    } else {
        for (int g = warp; g < NG; g += THREADS / 32) {
            const long long doc = d0 + g * 32 + lane;
            const float m = g_max[g];
            if (m > 0.0f && m >= keep_from && doc < num_docs)
                scores[row * num_docs + doc] = cell_f32(acc, g * 32 + lane, flat, UNSCALE);
        }
    }
    if (st && warp == 0) {  // at the k-th tile counted and every RUN_SCAN-th after, the running threshold is raised
        c = __shfl_sync(0xffffffffu, c, 0);
        if (c >= (unsigned)k && (c == (unsigned)k || c % RUN_SCAN == 0)) run_scan(st, k, lane);
    }
}

// Every unit_step-th unit (the sample; 1: every unit but every skip_step-th, those of a sample), one a block.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) bm25_tiles(UNIT_PARAMS, long long unit_step,
                                                                             long long skip_step)
{
    const long long unit = (long long)blockIdx.x * unit_step;  // < 2^31: a grid's blocks
    if (skip_step > 0 && (unsigned)unit % (unsigned)skip_step == 0) return;
    score_unit<true>(unit, UNIT_ARGS);
}

// The units bm25_filter listed (listed[0] of them, from listed[1]), a grid of resident blocks taking turns. No running
// threshold: they reach the sample's already (and its scan spilled registers in this loop).
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) bm25_listed(UNIT_PARAMS,
                                                                              const unsigned* __restrict__ listed)
{
    const unsigned n = listed[0];
    for (unsigned i = blockIdx.x; i < n; i += gridDim.x) {
        __syncthreads();  // the previous unit's shared memory is no longer read
        score_unit<false>(listed[1 + i], UNIT_ARGS);
    }
}

// Which units can hold a doc reaching the row's threshold: a block bounds FSPAN adjacent tiles of a pair at once, their
// sums as 16-bit fixed point (a quarter of the f64 tile's shared memory a doc, so more blocks a multiprocessor, and
// native integer atomics), added in any order, only to bound each tile's maximum from above; the tiles that may reach
// it are appended to listed as units for bm25_listed. The scale is the largest power of two that keeps the sum of the
// unit's weights under 2^15: a doc's score is below that sum, so no sum of fewer than 2^15 terms rounded up reaches
// 2^16. At 21M docs an MS MARCO unit holds ~110 postings at the median (under one a thread; a batch launches ~660,000),
// so the kernel is bound by each block's fixed work (ncu: ~1,500 warp instructions a unit before these changes):
// hence the span, one barrier after the ranges (two only past MAX_TERMS entries), and the verdicts by barrier
// reductions instead of maxima gathered through shared memory.
extern "C" __global__ void __launch_bounds__(THREADS, FILTER_BLOCKS)
bm25_filter(const long long* __restrict__ ent, long long n_ent, const long long* __restrict__ pairs,
            long long n_pairs, const unsigned* __restrict__ post, const unsigned char* __restrict__ norms,
            const float* __restrict__ cache, const int* __restrict__ bounds, long long num_docs, int tf_bits,
            long long block_size, const float* __restrict__ theta, unsigned* __restrict__ listed)
{
    __shared__ __align__(16) unsigned acc[FSPAN * TILE / 2];
    __shared__ long long t_first[MAX_TERMS];  // minus the term's first flat index
    __shared__ float t_w[MAX_TERMS];
    __shared__ int t_end[MAX_TERMS];  // inclusive prefix sum of the counts
    __shared__ float s_w_sum;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long pair = blockIdx.x / (TPB / FSPAN);
    const int tile = (int)(blockIdx.x % (TPB / FSPAN)) * FSPAN;  // the span's first
    const long long row = pairs[pair], blk = pairs[n_pairs + pair];
    const long long i0 = pairs[2 * n_pairs + pair], i1 = pairs[3 * n_pairs + pair];
    const long long d0 = blk * block_size + (long long)tile * TILE;
    if (d0 >= num_docs) return;
    const unsigned tf_mask = (1u << tf_bits) - 1u;
    const int toff = tile * TILE;
#if FSPAN * TILE / 8 >= THREADS  // a count the compiler knows: no loop
#pragma unroll
    for (int j = 0; j < FSPAN * TILE / 8 / THREADS; ++j)
        reinterpret_cast<uint4*>(acc)[j * THREADS + tid] = make_uint4(0u, 0u, 0u, 0u);
#else
    if (tid < FSPAN * TILE / 8) reinterpret_cast<uint4*>(acc)[tid] = make_uint4(0u, 0u, 0u, 0u);
#endif
    const bool one_pass = i1 - i0 <= MAX_TERMS;  // nearly always: the ranges' pass sums the weights too
    if (!one_pass && warp == 0) {  // the unit's weights (the first barrier below publishes their sum)
        float w = 0.0f;
        for (long long e = i0 + lane; e < i1; e += 32) w = __fadd_rn(w, __int_as_float((int)ent[2 * n_ent + e]));
        for (int o = 16; o; o >>= 1) w = __fadd_rn(w, __shfl_xor_sync(0xffffffffu, w, o));
        if (lane == 0) s_w_sum = w;
    }
    int work = 0;
    unsigned run = 0;  // the largest sum this thread stored in each tile (16 bits each), in units of 1 / scale
    float scale = 0.0f;
    for (long long e0 = i0; e0 < i1; e0 += MAX_TERMS) {
        const int ne = (int)min((long long)MAX_TERMS, i1 - e0);
        if (e0 != i0) __syncthreads();  // the previous terms' ranges are no longer read, nor their adds running
        if (warp == 0) {  // lane l: entries 2 l and 2 l + 1, numbered end to end
            long long first[2];
            int count[2];
            float w = 0.0f;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = 2 * lane + r;
                count[r] = 0;
                if (i < ne) {
                    const long long e = e0 + i;
                    count[r] = tile_range(ent, n_ent, bounds, e, tile, FSPAN, first[r]);
                    t_w[i] = __int_as_float((int)ent[2 * n_ent + e]);
                    w = __fadd_rn(w, t_w[i]);
                }
            }
            if (one_pass) {
                for (int o = 16; o; o >>= 1) w = __fadd_rn(w, __shfl_xor_sync(0xffffffffu, w, o));
                if (lane == 0) s_w_sum = w;
            }
            number_end_to_end(first, count, ne, lane, t_first, t_end);
        }
        __syncthreads();  // the ranges are read, the zeroing is done
        // s_w_sum < 2^e (positive weights: a normal float): the scale is 2^(15 - e)
        const int e = max(((__float_as_int(s_w_sum) >> 23) & 0xFF) - 126, -64);
        scale = __int_as_float((127 + 15 - e) << 23);
        const int total = t_end[ne - 1];
        work += total;
        FLAT_ADDS(SCORE_BOUND, ADD_FIXED)
    }
    if (work == 0) return;
    // The integer sums are at least the terms' sum, and their f32 is exact; the relative margin keeps an f32 rounding
    // of a score up to the threshold on the listed side. SCORE_BOUND is at most 2^-20 w under each term's exact score:
    // the weights' sum bounds that with room. The test only grows with run, so a tile's maximum passes it exactly when
    // some thread's run does.
    const float unit_scale = __int_as_float((254 - ((__float_as_int(scale) >> 23) & 0xFF)) << 23);  // 1 / scale
    const float slack = __fmul_rn(s_w_sum, 0x1p-16f), th = theta[row];
    const long long unit = pair * TPB + tile;
#pragma unroll
    for (int h = 0; h < FSPAN; ++h) {
        const float t_run = __fmul_rn(__uint2float_rn((run >> (16 * h)) & 0xFFFFu), unit_scale);
        const bool pass = __fadd_rn(__fmul_rn(t_run, 1.0f + 0x1p-12f), slack) >= th;
        if (__syncthreads_or(pass) && tid == 0) listed[1 + atomicAdd(listed, 1u)] = (unsigned)(unit + h);
    }
}
"""

UNIT_SIGNATURE = ["ptr", "i64", "ptr", "i64", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i64", "i64", "i64",
                  "i32", "i64", "i32", "ptr", "ptr"]
SIGNATURE = UNIT_SIGNATURE + ["i64", "i64"]  # bm25_tiles: and the unit and skip steps
LISTED_SIGNATURE = UNIT_SIGNATURE + ["ptr"]
FILTER_SIGNATURE = ["ptr", "i64", "ptr", "i64", "ptr", "ptr", "ptr", "ptr", "i64", "i32", "i64", "ptr", "ptr"]

SELECT_SOURCE = r"""
// The plan's tile ranges and the top-k selection around the scorer: the results of gpu_tiles' Triton kernels and
// torch.topk, in one module (a launch from Python through ctypes costs a few microseconds, a Triton one tens).
#define FULL 0xffffffffu

#if SAMPLE_BYTES == 1
typedef unsigned char sample_t;
#else
typedef unsigned short sample_t;
#endif

// samp[i] = the tile (in its doc block) of the arena's posting SAMPLE * i, for i in [first, first + n).
extern "C" __global__ void make_samples(const unsigned* __restrict__ post, sample_t* __restrict__ samp,
                                        long long first, long long n, int tf_bits)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) samp[first + i] = (sample_t)((__ldg(post + SAMPLE * (first + i)) >> tf_bits) / TILE);
}

// The first of the count postings from post[start] (an entry) whose doc offset in its block is >= tile * TILE, as an
// index from start. A binary search of the entry's samples (samp: make_samples') brackets it within SAMPLE postings,
// and one of those postings (one 128-byte line: L1 after its first read) finds it. A binary search of the postings
// alone waited on ~log2(count) reads from DRAM, one after the other (H200 ncu: 60% of plan_single's stalls), where the
// samples, 1/128 of the postings' bytes, mostly sit in L2; eight postings read at once around the guess
// count * tile / TPB instead made plan_single 6-23% slower, by the reads they add.
__device__ __forceinline__ int tile_start(const unsigned* __restrict__ post, const sample_t* __restrict__ samp,
                                          const long long start, const long long count, const int tile,
                                          const int tf_bits)
{
    const long long s0 = (start + SAMPLE - 1) / SAMPLE, s1 = (start + count + SAMPLE - 1) / SAMPLE;  // inside it
    long long lo = s0, hi = s1;
    while (lo < hi) {  // the first sample at or past the tile
        const long long mid = (lo + hi) >> 1;
        if ((int)__ldg(samp + mid) < tile) lo = mid + 1;
        else hi = mid;
    }
    const long long first = lo;
    const unsigned long long target = ((unsigned long long)tile * TILE) << tf_bits;
    lo = first > s0 ? SAMPLE * (first - 1) + 1 : start;  // the sample before is below the tile
    hi = first < s1 ? SAMPLE * first : start + count;  // this one is not
    while (lo < hi) {
        const long long mid = (lo + hi) >> 1;
        if ((unsigned long long)__ldg(post + mid) < target) lo = mid + 1;
        else hi = mid;
    }
    return (int)(lo - start);
}

// bounds[e * TPB + j] = tile_start of entry e and tile j.
extern "C" __global__ void tile_bounds(const long long* __restrict__ ent, long long n_ent,
                                       const unsigned* __restrict__ post, const sample_t* __restrict__ samp,
                                       int* __restrict__ bounds, int tf_bits)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_ent * TPB) return;
    const long long e = i / TPB;
    bounds[i] = tile_start(post, samp, ent[e], ent[n_ent + e], (int)(i % TPB), tf_bits);
}

// A single query's plan, made on the device (the host's plan costs a single query tens of microseconds of its latency),
// with its tile ranges: dense, every doc block a pair and every (block, query term) an entry, e = b * nt + j with the
// terms in ascending id, so a block's entries are in the canonical order; an entry whose term has no posting in the
// block has count 0. The table is the host plan's, its columns `stride` apart whatever the query (entries: start,
// count, weight bits; then the pairs: row, block, i0, i1, shift), and bounds tile_bounds'. The query is read from
// device memory (query_in's copy) and the grid is fixed, so a captured graph replays it for any query. A thread for
// each (entry, tile).
struct Query {
    int n, shift;  // terms (at most QMAX); the flat path's shift (gpu_tiles.flat_shift; 0: the terms in order)
    unsigned term[QMAX];  // ascending
    int wbits[QMAX];  // f32 weights' bits
};

// The query from pinned host memory to the device, one block: a kernel reads it over the bus in one round trip, where a
// copy between the host and a graph's kernels waited ~13 us for the copy engine (H200).
extern "C" __global__ void query_in(const int* __restrict__ host, int* __restrict__ dev)
{
    for (int i = threadIdx.x; i < (int)(sizeof(Query) / 4); i += blockDim.x) dev[i] = host[i];
}

extern "C" __global__ void plan_single(const Query* __restrict__ q, const unsigned* __restrict__ term_ptr,
    int n_shards, const int* __restrict__ blk_shard, const long long* __restrict__ shards,
    const unsigned* __restrict__ blk_id, const unsigned* __restrict__ blk_start, const unsigned* __restrict__ post,
    const sample_t* __restrict__ samp, long long n_blocks, long long stride, long long* __restrict__ table,
    int* __restrict__ bounds, int tf_bits)
{
    const long long nt = q->n, n = n_blocks * nt * TPB;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const long long e = i / TPB, b = e / nt;
        const int tile = (int)(i % TPB), j = (int)(e % nt);
        // shards: [entry base in the arena, posting base, first block, blocks], a row each of n_shards
        const int sh = blk_shard[b];
        const long long t = q->term[j], base = shards[sh];
        long long lo = base + term_ptr[t * n_shards + sh];
        const long long end = base + term_ptr[(t + 1) * n_shards + sh];
        const long long b0 = shards[2 * n_shards + sh];
        if (end - lo == shards[3 * n_shards + sh]) {  // the term is in every block of the shard
            lo += b - b0;
        } else {  // the term's entries are in block order: the first at block b or after
            long long hi = end;
            while (lo < hi) {
                const long long mid = (lo + hi) >> 1;
                if (__ldg(blk_id + mid) < (unsigned)b) lo = mid + 1;
                else hi = mid;
            }
        }
        long long start = 0, count = 0;
        if (lo < end && __ldg(blk_id + lo) == (unsigned)b) {
            const unsigned a = __ldg(blk_start + lo);
            start = shards[n_shards + sh] + a;
            count = __ldg(blk_start + lo + 1) - a;
        }
        if (tile == 0) {
            table[e] = start;
            table[stride + e] = count;
            table[2 * stride + e] = q->wbits[j];
            if (j == 0) {
                long long* pairs = table + 3 * stride;
                pairs[b] = 0;
                pairs[n_blocks + b] = b;
                pairs[2 * n_blocks + b] = b * nt;
                pairs[3 * n_blocks + b] = (b + 1) * nt;
                pairs[4 * n_blocks + b] = q->shift;
            }
        }
        bounds[i] = tile_start(post, samp, start, count, tile, tf_bits);
    }
}

// thr[row] = the k-th largest of the row's tile maxima (0 when k > n_tiles: every matched doc is a candidate), by
// radix select on their bit patterns (non-negative floats order like unsigned integers): 4 passes of 8 bits, each
// counting the values that share the digits found so far. A thread keeps its first KTH_REG values in registers (one
// read for all passes). Zeros are not counted (most tiles of a sample, or below its threshold, are zero: one
// shared-memory counter would take them all): fewer than need nonzero values under the prefix make the answer 0.
// (H200, a single query's 10,368 maxima: 7.3 us; skipping the leading bytes every value shares, found by reductions
// first, took 8.1-9.6, and counts aggregated over a warp by ballots 10.) Also clears the 8-byte count at count (the
// collect kernel's, or the head of the filter's list).
extern "C" __global__ void __launch_bounds__(KTH_THREADS) kth_largest(const float* __restrict__ tile_maxima,
    long long n_tiles, int k, float* __restrict__ thr, unsigned long long* __restrict__ count)
{
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix;
    __shared__ int s_need;
    const int tid = threadIdx.x, lane = tid & 31;
    if (count && tid == 0 && blockIdx.x == 0) count[0] = 0;
    if (k > n_tiles) {
        if (tid == 0) thr[blockIdx.x] = 0.0f;
        return;
    }
    const float* x = tile_maxima + blockIdx.x * n_tiles;
    unsigned v[KTH_REG];
#pragma unroll
    for (int j = 0; j < KTH_REG; ++j) {
        const long long i = tid + (long long)j * KTH_THREADS;
        v[j] = i < n_tiles ? __float_as_uint(x[i]) : 0u;
    }
    unsigned prefix = 0, mask = 0;
    int need = k;  // the k-th largest is the need-th largest of the values under the prefix; 0: it is 0
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += KTH_THREADS) hist[i] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < KTH_REG; ++j)
            if (v[j] && (v[j] & mask) == prefix) atomicAdd(&hist[(v[j] >> shift) & 255u], 1u);
        for (long long i = tid + (long long)KTH_REG * KTH_THREADS; i < n_tiles; i += KTH_THREADS) {
            const unsigned u = __float_as_uint(x[i]);
            if (u && (u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid < 32) {  // lane l holds digits 255 - 8l down to 248 - 8l; counts from the top by a scan over lanes
            unsigned c[8], sum = 0;
            for (int j = 0; j < 8; ++j) {
                c[j] = hist[255 - 8 * lane - j];
                sum += c[j];
            }
            unsigned incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned up = __shfl_up_sync(FULL, incl, o);
                if (lane >= o) incl += up;
            }
            const unsigned hit = __ballot_sync(FULL, incl >= (unsigned)need);
            if (hit == 0) {
                if (lane == 0) s_need = 0;
            } else if (lane == __ffs(hit) - 1) {
                unsigned above = incl - sum;
                int j = 0;
                while (above + c[j] < (unsigned)need) above += c[j++];
                s_need = need - (int)above;
                s_prefix = prefix | ((unsigned)(255 - 8 * lane - j) << shift);
            }
        }
        __syncthreads();
        need = s_need;
        if (need == 0) break;
        prefix = s_prefix;
        mask |= 255u << shift;
    }
    if (tid == 0) thr[blockIdx.x] = need == 0 ? 0.0f : __uint_as_float(prefix);
}

// Append (row * num_docs + doc, score bits) of the docs scoring >= the row's threshold (at least the smallest
// positive score) to found[2:], counting them in found[0] (past cap only counted). Each lane reads one group
// maximum; only the groups reaching the threshold are read, a warp each. Then it clears what it read, the group
// maxima and their tiles' maxima, and the row's running threshold, so they are zero for the next batch.
extern "C" __global__ void __launch_bounds__(COLLECT_THREADS) collect(const float* __restrict__ scores,
    float* __restrict__ maxima, float* __restrict__ tile_maxima, const float* __restrict__ thr, long long num_docs,
    long long n_groups, long long n_tiles, unsigned long long* __restrict__ found, long long cap,
    unsigned* __restrict__ running)
{
    const long long row = blockIdx.y;
    if (blockIdx.x == 0)  // the scorer's running threshold of the row, at rest again
        for (int i = threadIdx.x; i < RUN_WORDS; i += COLLECT_THREADS) running[row * RUN_WORDS + i] = 0u;
    const float t = fmaxf(thr[row], __int_as_float(1));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long g0 = (long long)blockIdx.x * COLLECT_GROUPS, g1 = min(g0 + COLLECT_GROUPS, n_groups);
    float* m = maxima + row * n_groups;
    const float* tm = tile_maxima + row * n_tiles;
    for (long long base = g0 + 32 * warp; base < g1; base += COLLECT_THREADS) {
        const long long g = base + lane;
        // a tile that wrote no group maxima has none to read (most: a row's tiles under the scorer's threshold)
        const float gm = g < g1 && tm[g * 32 / TILE] != 0.0f ? m[g] : 0.0f;
        if (gm != 0.0f) m[g] = 0.0f;
        for (unsigned sel = __ballot_sync(FULL, gm >= t); sel; sel &= sel - 1) {
            const long long doc = (base + __ffs(sel) - 1) * 32 + lane;
            const float s = doc < num_docs ? scores[row * num_docs + doc] : 0.0f;
            const bool ok = doc < num_docs && s >= t;
            const unsigned okm = __ballot_sync(FULL, ok);
            unsigned long long first = 0;
            if (lane == 0 && okm) first = atomicAdd(found, (unsigned long long)__popc(okm));
            const unsigned long long pos = __shfl_sync(FULL, first, 0) + __popc(okm & ((1u << lane) - 1u));
            if (ok && pos < (unsigned long long)cap) {
                found[2 + 2 * pos] = (unsigned long long)(row * num_docs + doc);
                found[3 + 2 * pos] = (unsigned)__float_as_int(s);
            }
        }
    }
    const long long t0 = g0 * 32 / TILE, t1 = min(t0 + COLLECT_GROUPS * 32 / TILE, n_tiles);
    __syncthreads();  // every warp has read the tiles' maxima
    for (long long i = t0 + threadIdx.x; i < t1; i += COLLECT_THREADS)
        if (tile_maxima[row * n_tiles + i] != 0.0f) tile_maxima[row * n_tiles + i] = 0.0f;
}

// A single query's ranking, after collect: when its n = found[0] candidates are all stored and n <= SORT_MAX, the
// first min(n, k, out_cap) of them by their keys (0x7FFFFFFF - score bits) << 32 | doc in ascending order (score
// descending, then doc ascending: FORMAT.md's ranking; positive f32 scores order like their bits) go to pinned host
// memory the host reads when the kernel is done, with no copy to wait for: the docs as int64 from out[2], the scores' f32
// bits from out[2 + out_cap] on, the result's arrays as they are (unpacking keys cost the host ~5 us at k = 1,000);
// out[0] = n in any case. Otherwise the host ranks
// them (or the query is scored again with more room). The keys are distinct (one a doc), so a key's place is the number
// of keys below it: every block loads them all to shared memory and RANK_SPLIT threads count for each of its keys, a
// share each. No barrier between the steps of a sort, and the work spread over SORT_MAX * RANK_SPLIT / RANK_THREADS
// blocks: a one-block merge sort took 16 us for ~1,050 keys on the H200.
extern "C" __global__ void __launch_bounds__(RANK_THREADS) rank_candidates(const unsigned long long* __restrict__ found,
    long long cap, unsigned long long* __restrict__ out, int k, int out_cap)
{
    __shared__ unsigned long long keys[SORT_MAX];
    const unsigned long long count = found[0];
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = count;
    if (count > (unsigned long long)cap || count > SORT_MAX) return;
    const int n = (int)count, per = RANK_THREADS / RANK_SPLIT, first = blockIdx.x * per;
    if (first >= n) return;
    for (int i = threadIdx.x; i < n; i += RANK_THREADS)
        keys[i] = (0x7FFFFFFFull - found[3 + 2 * i]) << 32 | (found[2 + 2 * i] & 0xFFFFFFFFull);
    __syncthreads();
    const int mine = first + threadIdx.x / RANK_SPLIT, part = threadIdx.x % RANK_SPLIT;
    const unsigned long long key = mine < n ? keys[mine] : 0ull;
    int below = 0;
    for (int j = part; j < n; j += RANK_SPLIT) below += keys[j] < key;
    for (int o = 1; o < RANK_SPLIT; o <<= 1) below += __shfl_xor_sync(FULL, below, o);  // the key's RANK_SPLIT lanes
    if (mine < n && part == 0 && below < min(k, out_cap)) {
        out[2 + below] = key & 0xFFFFFFFFull;
        reinterpret_cast<unsigned*>(out + 2 + out_cap)[below] = 0x7FFFFFFFu - (unsigned)(key >> 32);
    }
}
"""


def threads(tile: int) -> int:
    """Threads per block for ``tile``-doc tiles (a power of two >= 32)."""
    return min(THREADS, tile)


def min_blocks(tile: int) -> int:
    """Blocks that fit a multiprocessor's shared memory (~228 KiB on Hopper; the tile's f64 cells, ~2 KiB of other
    arrays and 1 KiB reserved each), as a register budget: more registers would leave fewer blocks resident."""
    return max(1, min(32, 2048 // threads(tile), (228 << 10) // (8 * tile + (3 << 10))))


def filter_span(tpb: int) -> int:
    """Tiles a ``bm25_filter`` block bounds at once (``tpb`` tiles a doc block)."""
    return 2 if tpb % 2 == 0 else 1


def filter_blocks(tile: int, tpb: int) -> int:
    """``min_blocks`` of the filter: 2 bytes a doc of its span."""
    return max(1, min(32, 2048 // threads(tile), (228 << 10) // (2 * filter_span(tpb) * tile + (3 << 10))))


def sample_bytes(tpb: int) -> int:
    """Bytes of a ``make_samples`` sample: a tile of a doc block (``tpb`` of them)."""
    return 1 if tpb <= 256 else 2


def defines(tile: int, tpb: int) -> dict[str, int]:
    """The module's compile-time constants for ``tile``-doc tiles, ``tpb`` of them a doc block."""
    return {"TILE": tile, "TPB": tpb, "THREADS": threads(tile), "MAX_TERMS": MAX_TERMS, "UNROLL": UNROLL,
            "MIN_BLOCKS": min_blocks(tile), "FILTER_BLOCKS": filter_blocks(tile, tpb),
            "FSPAN": filter_span(tpb), "COLLECT_GROUPS": COLLECT_GROUPS,
            "KTH_THREADS": KTH_THREADS, "KTH_REG": KTH_REG, "COLLECT_THREADS": COLLECT_THREADS,
            "SORT_MAX": SORT_MAX, "SAMPLE": SAMPLE, "SAMPLE_BYTES": sample_bytes(tpb), "RANK_THREADS": RANK_THREADS,
            "RANK_SPLIT": RANK_SPLIT, "QMAX": QMAX,
            "RUN_BINS": RUN_BINS, "RUN_SHIFT": RUN_SHIFT, "RUN_BASE": RUN_BASE, "RUN_SCAN": RUN_SCAN,
            "RUN_WORDS": RUN_WORDS}


class TileKernels:
    """The module's kernels for one tile size: ``scorer``, ``filter`` and ``listed`` (``SOURCE``), ``samples``,
    ``bounds``, ``query_in``, ``plan``, ``kth``, ``collect`` and ``rank`` (``SELECT_SOURCE``); launch the first three
    with ``threads(tile)`` threads a block."""

    def __init__(self, tile: int, tpb: int, device: torch.device) -> None:
        module = CudaModule(SOURCE + SELECT_SOURCE, ["--fmad=false"] + [f"-D{k}={v}" for k, v in
                                                                      defines(tile, tpb).items()],
                            device, "bm25_tiles")
        self.scorer = module.kernel("bm25_tiles", SIGNATURE)
        self.filter = module.kernel("bm25_filter", FILTER_SIGNATURE)
        self.listed = module.kernel("bm25_listed", LISTED_SIGNATURE)
        # bm25_listed's grid: the blocks that are resident at once
        self.listed_grid = torch.cuda.get_device_properties(device).multi_processor_count * min_blocks(tile)
        self.bounds = module.kernel("tile_bounds", ["ptr", "i64", "ptr", "ptr", "ptr", "i32"])
        self.samples = module.kernel("make_samples", ["ptr", "ptr", "i64", "i64", "i32"])
        self.kth = module.kernel("kth_largest", ["ptr", "i64", "i32", "ptr", "ptr"])
        self.collect = module.kernel("collect", ["ptr", "ptr", "ptr", "ptr", "i64", "i64", "i64", "ptr", "i64", "ptr"])
        self.rank = module.kernel("rank_candidates", ["ptr", "i64", "ptr", "i32", "i32"])
        self.query_in = module.kernel("query_in", ["ptr", "ptr"])
        self.plan = module.kernel("plan_single", ["ptr", "ptr", "i32", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i64",
                                                  "i64", "ptr", "ptr", "i32"])
