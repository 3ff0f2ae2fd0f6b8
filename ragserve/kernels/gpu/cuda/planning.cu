// Planning on the GPU: the tile plan's per-tile posting ranges (binary searches of samples of the postings, then of
// SAMPLE postings; the samples are made once the postings are on the device), and a single query's whole plan with
// them (plan_single: no host planning on its latency path). gpu/planning.py plans on the host what these do not.
//
// Compiled with relevancy.cu and selection.cu as one program (cuda/rtc.py, cuda/kernels.py); -D defines used here:
// TILE, TPB, SAMPLE, SAMPLE_BYTES (1 or 2: bytes a sample) and QMAX (terms of a query planned on the device).
#if !defined(TILE) || !defined(TPB) || !defined(SAMPLE) || !defined(SAMPLE_BYTES) || !defined(QMAX)
#error "compile with the loader's -D defines (ragserve/kernels/gpu/cuda/kernels.py: defines())"
#endif

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
    int n, shift;  // terms (at most QMAX); the flat path's shift (planning.flat_shift; 0: the terms in order)
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
