// Interface of the attn_topk kernel (attn_topk.cpp): the sparse-attention memory pipeline's relevancy and
// retrieval on the FPGA, shared by the kernel, its testbench and the host (ragserve/kernels/fpga/attention.py
// mirrors these constants; keep them in sync).
#ifndef RAGSERVE_ATTN_TOPK_H
#define RAGSERVE_ATTN_TOPK_H

#include <stdint.h>

#define ATTN_MAX_DIM 256    // lanes of the inner-product engine (head dim, or index dim)
#define ATTN_MAX_HEADS 128  // query (or index) heads of one selection row
#define ATTN_MAX_K 2048     // top-k list: DSA's 2048 tokens
#define ATTN_MAX_UNIT 1024  // keys per unit (a page, a block)
#define ATTN_WORD_LANES 16  // f32 lanes of one 512-bit HBM beat

// One 512-bit HBM beat: 16 f32 lanes of a key.
struct KeyWord {
    float v[ATTN_WORD_LANES];
};

// The reduction unit's modes (ragserve/attention/ops.py names them the same).
enum AttnMode {
    ATTN_DOTS_MAX = 0,    // key score = max over heads of q_h . k; unit score = max over the unit's keys
    ATTN_DOTS_WRELU = 1,  // key score = sum over heads, in head order, of w_h * ReLU(q_h . k) (DSA's indexer)
    ATTN_BOUNDS_MAX = 2,  // key = a page's (lo, hi) pair; score = max over heads of sum_d max(q_d lo_d, q_d hi_d)
};

// Per-row loop counters, written to out_stats[row * ATTN_NUM_STATS + index]; tools/fpga_model.py predicts them.
enum AttnStat {
    AST_KEY_WORDS = 0,  // 512-bit key words streamed (lo and hi words both count in bounds mode)
    AST_DOTS,           // (key, head) inner products
    AST_UNITS,          // units reduced
    AST_CANDIDATES,     // units offered to the top-k (the middle range)
    AST_INSERTS,        // candidates that entered the running top-k (data dependent; not modelled)
    AST_RESULTS,        // results written
    ATTN_NUM_STATS
};

#ifdef __cplusplus
extern "C" {
#endif

// One compute unit: for each of `rows` selection rows (a sequence's KV group), score its keys against the row's
// `heads` queries, reduce per key and per unit of `unit` keys, and keep the top k of units [mid_start, mid_end)
// (score desc, unit asc). Row r's queries are q[(r * heads + h) * dim + d], weights w[r * heads + h] (WRELU),
// keys keys[(r * num_keys + j) * dim_p + d] with dim padded with zeros to dim_p, a multiple of ATTN_WORD_LANES, in
// 512-bit words (BOUNDS: lo in keys, hi in keys_hi, one key = one page, unit = 1).
// Results: out_scores[r * num_units + u] every unit score; out_ids / out_top[r * k + j], j < out_counts[r].
// The host guarantees 1 <= dim <= ATTN_MAX_DIM, 1 <= heads <= ATTN_MAX_HEADS, 1 <= unit <= ATTN_MAX_UNIT,
// 1 <= k <= ATTN_MAX_K and mid_start <= mid_end <= num_units = ceil(num_keys / unit).
void attn_topk(const float* q, const float* w, const KeyWord* keys, const KeyWord* keys_hi, float* out_scores,
               uint32_t* out_ids, float* out_top, uint32_t* out_counts, uint32_t* out_stats, uint32_t rows,
               uint32_t heads, uint32_t dim, uint32_t num_keys, uint32_t unit, uint32_t mode, uint32_t mid_start,
               uint32_t mid_end, uint32_t k);

#ifdef __cplusplus
}
#endif

#endif
