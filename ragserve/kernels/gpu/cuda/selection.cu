// Selection on the GPU, after the relevancy kernels: the k-th largest tile maximum (radix select), the collect kernel,
// which also clears the maxima it read, and a single query's ranking of its candidates. The results of the Triton
// collect kernel and torch.topk (gpu/selection.py), in the scorer's module: a launch from Python through ctypes costs
// a few microseconds, a Triton one tens.
//
// Compiled with relevancy.cu and planning.cu as one program (cuda/rtc.py, cuda/kernels.py); -D defines used here:
// TILE, KTH_THREADS, KTH_REG, COLLECT_GROUPS, COLLECT_THREADS, SORT_MAX, RANK_THREADS, RANK_SPLIT, RUN_WORDS.
#if !defined(TILE) || !defined(KTH_THREADS) || !defined(SORT_MAX) || !defined(RUN_WORDS)
#error "compile with the loader's -D defines (ragserve/kernels/gpu/cuda/kernels.py: defines())"
#endif
#define FULL 0xffffffffu

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
