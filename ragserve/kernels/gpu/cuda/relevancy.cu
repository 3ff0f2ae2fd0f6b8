// BM25 relevancy on the GPU: one thread block scores one (query, tile) unit of the tile plan (gpu/planning.py) into
// the tile's f64 accumulator in shared memory, with the summation order and the scores of indexer/FORMAT.md, and keeps
// only the group maxima and the scores that can reach the top-k (gpu/relevancy.py drives it).
//
// Compiled by NVRTC at first use (cuda/rtc.py), with relevancy.cu, planning.cu and selection.cu as one program, options
// --fmad=false and the -D defines of cuda/kernels.py's defines(): TILE (docs a tile), TPB (tiles a doc block),
// THREADS, MAX_TERMS, UNROLL, MIN_BLOCKS, FILTER_BLOCKS, FSPAN and the running threshold's RUN_BINS, RUN_SHIFT,
// RUN_BASE, RUN_SCAN, RUN_WORDS.
//
// Triton has no shared memory that threads index freely, so its kernel (triton/relevancy.py) keeps the tile in a
// per-program scratch in global memory (L1/L2): every posting's read-modify-write, the read-out and the zeroing go
// through the cache hierarchy. Here the terms' ranges go to shared memory with one round trip, each term's postings are
// added by all threads at once (its docs are distinct, so no two threads touch one cell), a block barrier separates
// the terms (ascending term id: the canonical sum of indexer/FORMAT.md). Arithmetic: every f32 operation rounded as
// written (--fmad=false, __f*_rn).
//
// Queries whose f64 sums are exact in any order (bm25.sum_is_exact: nearly all) take a flat path instead: the tile's
// postings of all terms are numbered end to end, each thread takes every THREADS-th one, UNROLL at a time with their
// loads in flight together, and adds it with shared-memory atomics to the doc's 64-bit fixed-point sum (the plan's
// flat_shift per pair: every score an integer there, so the sums are exact, and their f32 roundings are the f64
// sums'). No barrier separates the terms, so a tile costs a few memory round trips instead of a few per term.
//
// Blocks a multiprocessor holds are bounded by the tile's shared memory, so the register budget is set from that
// limit (MIN_BLOCKS; one H200 run, 21M docs, a batch of 64 NQ queries: 5.33 ms with 40 registers and 12 blocks a
// multiprocessor, 5.79 ms with 56 and 9, 6.14 ms with 64 and 8). With the blocks resident, the kernel is bound by
// instruction issue (Nsight Compute: 77% of issue slots busy, DRAM 15%), so the read-out is kept lean: each thread
// compares the f32 scores of its own run of cells, and every warp finds the tile's cut itself, with no second barrier.
//
// Under a row's threshold (theta, from a sample of the units: see gpu/relevancy.py; or the running threshold, which
// the launch raises from its own tiles' maxima as they finish: run_scan) a tile whose maximum, or a bound above it,
// tracked from the sums the adds store, falls below it returns before the read-out, and groups below it are not
// written: at k > 32, where the tile's own cut keeps every matched group, that was most of the read-out. bm25_filter
// lists the units that may reach the threshold by the same adds as an upper bound (a 2-ulp division and 16-bit
// fixed-point sums, two a word, by the integer atomics Hopper has in shared memory while a float's is a
// compare-and-swap loop; a margin for the rest; two tiles a block, 16 blocks a multiprocessor instead of 12), and
// bm25_listed scores the listed ones exactly.
#if !defined(TILE) || !defined(TPB) || !defined(THREADS) || !defined(RUN_WORDS)
#error "compile with the loader's -D defines (ragserve/kernels/gpu/cuda/kernels.py: defines())"
#endif
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
// The flat path's sums (exact in any order): s * 2^shift is an integer (``planning.flat_shift``), added to the doc's
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
    // the flat path's fixed-point shift (planning.flat_shift; 0: the terms in order, f64 sums), kept in shared memory
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
