"""The tile scoring kernel of ``gpu_tiles`` in CUDA C: the same inputs, outputs and summation order, with the
tile's f64 accumulator in shared memory.

Triton has no shared memory that threads index freely, so its kernel keeps the tile in a per-program scratch in
global memory (L1/L2): every posting's read-modify-write, the read-out and the zeroing go through the cache
hierarchy, and the per-term scalars are pulled out of vectors by reductions. Here one thread block scores one
(query, tile) unit: the terms' ranges go to shared memory with one round trip, each term's postings are added
by all threads at once (its docs are distinct, so no two threads touch one cell), a block barrier separates
the terms (ascending term id: the canonical sum of ``indexer/FORMAT.md``), and the read-out is one warp per
group of 32 docs. Arithmetic: every f32 operation rounded as written (``--fmad=false``, ``__f*_rn``).
"""
from __future__ import annotations

import torch

from ragserve.backends.cuda_rtc import CudaKernel

THREADS = 128  # threads per block: a tile's term has ~0-1,000 postings
MAX_TERMS = 64  # entries whose ranges sit in shared memory at once

SOURCE = r"""
#define NG (TILE / 32)
extern "C" __global__ void __launch_bounds__(THREADS)
bm25_tiles(const long long* __restrict__ ent, long long n_ent, const long long* __restrict__ pairs,
           long long n_pairs, const unsigned* __restrict__ post, const unsigned char* __restrict__ norms,
           const float* __restrict__ cache, const int* __restrict__ bounds, float* __restrict__ maxima,
           float* __restrict__ tile_maxima, float* __restrict__ scores, long long num_docs, long long n_groups,
           long long n_tiles, int tf_bits, long long block_size, int k_tile)
{
    __shared__ double acc[TILE];
    __shared__ float g_max[NG];
    __shared__ long long t_first[MAX_TERMS];
    __shared__ int t_count[MAX_TERMS];
    __shared__ float t_w[MAX_TERMS];
    __shared__ float warp_max[THREADS / 32];
    const int tid = threadIdx.x;
    const long long pair = blockIdx.x / TPB;
    const int tile = (int)(blockIdx.x % TPB);
    const long long row = pairs[pair], blk = pairs[n_pairs + pair];
    const long long i0 = pairs[2 * n_pairs + pair], i1 = pairs[3 * n_pairs + pair];
    const long long d0 = blk * block_size + (long long)tile * TILE;
    if (d0 >= num_docs) return;
    const unsigned tf_mask = (1u << tf_bits) - 1u;
    const int toff = tile * TILE;
    for (int i = tid; i < TILE; i += THREADS) acc[i] = 0.0;
    long long work = 0;  // the same in every thread: read from shared memory
    for (long long e0 = i0; e0 < i1; e0 += MAX_TERMS) {
        const int ne = (int)min((long long)MAX_TERMS, i1 - e0);
        __syncthreads();  // the previous terms' ranges are no longer read
        if (tid < ne) {
            const long long e = e0 + tid;
            const int lo = bounds[e * TPB + tile];
            const int hi = tile + 1 < TPB ? bounds[e * TPB + tile + 1] : (int)ent[n_ent + e];
            t_first[tid] = ent[e] + lo;
            t_count[tid] = hi - lo;
            t_w[tid] = __int_as_float((int)ent[2 * n_ent + e]);
        }
        __syncthreads();
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
                const float s = __fsub_rn(w, __fdiv_rn(w, __fadd_rn(1.0f, q)));
                acc[off] = __dadd_rn(acc[off], (double)s);
            }
            __syncthreads();  // the next term may add to the same cells from other threads
        }
    }
    if (work == 0) return;
    const int lane = tid & 31, warp = tid >> 5;
    float tile_max = 0.0f;
    for (int g = warp; g < NG; g += THREADS / 32) {
        float m = (float)acc[g * 32 + lane];
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) g_max[g] = m;
        tile_max = fmaxf(tile_max, m);
    }
    if (lane == 0) warp_max[warp] = tile_max;
    __syncthreads();
    for (int i = 0; i < THREADS / 32; ++i) tile_max = fmaxf(tile_max, warp_max[i]);
    // Only the tile's k best docs can be in the top-k: the groups below the k-th largest group maximum (k
    // other docs of the tile score more than any of theirs) are not written, and their maxima read 0.
    float keep_from = 0.0f;
    if (k_tile > 0) {
        float cand = 0.0f;
        if (tid < NG) {
            const float mine = g_max[tid];
            int above = 0;
            for (int i = 0; i < NG; ++i) above += g_max[i] >= mine;
            if (above >= k_tile) cand = mine;
        }
        for (int o = 16; o; o >>= 1) cand = fmaxf(cand, __shfl_xor_sync(0xffffffffu, cand, o));
        __syncthreads();  // every thread has read the tile maxima in warp_max before it is reused
        if (lane == 0) warp_max[warp] = cand;
        __syncthreads();
        for (int i = 0; i < THREADS / 32; ++i) keep_from = fmaxf(keep_from, warp_max[i]);
    }
    for (int g = warp; g < NG; g += THREADS / 32) {
        const float m = g_max[g];
        const bool keep = m > 0.0f && m >= keep_from;
        const long long gi = d0 / 32 + g, doc = d0 + g * 32 + lane;
        if (lane == 0 && gi < n_groups) maxima[row * n_groups + gi] = keep ? m : 0.0f;
        if (keep && doc < num_docs) scores[row * num_docs + doc] = (float)acc[g * 32 + lane];
    }
    if (tid == 0) tile_maxima[row * n_tiles + d0 / TILE] = tile_max;
}
"""

SIGNATURE = ["ptr", "i64", "ptr", "i64", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i64", "i64", "i64",
             "i32", "i64", "i32"]


def build(tile: int, tpb: int, device: torch.device) -> CudaKernel:
    """The kernel for ``tile``-doc tiles, ``tpb`` tiles per doc block (groups of 32 docs)."""
    defines = {"TILE": tile, "TPB": tpb, "THREADS": THREADS, "MAX_TERMS": MAX_TERMS}
    return CudaKernel(SOURCE, "bm25_tiles", SIGNATURE,
                      ["--fmad=false"] + [f"-D{k}={v}" for k, v in defines.items()], device)
