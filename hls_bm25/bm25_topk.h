// Interface of the bm25_topk kernel (bm25_topk.cpp), shared by the kernel, its testbench and the host.
// The host driver (ragserve/kernels/fpga/backend.py) mirrors these constants; keep them in sync.
#ifndef RAGSERVE_BM25_TOPK_H
#define RAGSERVE_BM25_TOPK_H

#include <stdint.h>

// Largest doc block (2^18 docs: 2 MiB of f64 accumulators in URAM), query and result sizes of one CU.
#define BM25_MAX_BLOCK_BITS 18
#define BM25_MAX_BLOCK (1u << BM25_MAX_BLOCK_BITS)
#define BM25_MIN_BLOCK_BITS 6  // a block's norms start on a 64-byte word
#define BM25_MAX_TERMS 1024
#define BM25_MAX_K 1024
#define BM25_CACHE_SIZE 256

// One 512-bit HBM beat: 16 packed postings or 64 norm bytes.
#define BM25_POSTINGS_PER_WORD 16
#define BM25_NORMS_PER_WORD 64

// Lanes: a CU scores and accumulates BM25_LANES postings a cycle, lane j owning the docs with docid % BM25_LANES == j
// of the current block (their norms, f64 accumulators and touched list). The reader hands postings to the lanes in
// chunks of up to BM25_CHUNK_BEATS beats of one block entry; within a chunk each lane takes one of its postings a
// cycle, so a chunk takes as many cycles as its most loaded lane (the conflict rounds).
#define BM25_LANES 16
#define BM25_LANE_BITS 4
#define BM25_CHUNK_BEATS 32
// Cycles the lanes wait between two terms of a block, so a doc's next term reads its updated f64 sum (the depth of
// the accumulator's read-add-write; within one term the docids are distinct and no wait is needed).
#define BM25_ACC_GAP 12

struct PostWord {
    uint32_t p[BM25_POSTINGS_PER_WORD];
};

struct NormWord {
    uint8_t b[BM25_NORMS_PER_WORD];
};

// Per-query loop-iteration counters, written to out_stats[query * BM25_NUM_STATS + index].
// scripts/model_fpga.py predicts every one of them from posting counts (tests compare the two).
enum Bm25Stat {
    ST_TERMS = 0,         // query terms read (2 query words each)
    ST_TABLE_READS,       // term setup reads: term_ptr[t], term_ptr[t+1], and blk_id/blk_start of the first entry
    ST_BLOCK_LOOP,        // blocks of the shard walked by the planner
    ST_SCAN,              // term-scan iterations (blocks x terms, on chip)
    ST_BLOCKS,            // blocks with at least one entry (norms loaded, accumulators flushed)
    ST_NORM_WORDS,        // 512-bit norm words read
    ST_ENTRIES,           // block entries streamed
    ST_ENTRY_READS,       // table reads per entry: blk_start[e+1], and blk_id[e+1] when the term has another
    ST_POSTING_WORDS,     // 512-bit posting words read (one a cycle)
    ST_POSTINGS,          // postings handed to the lanes
    ST_CHUNKS,            // posting chunks (<= BM25_CHUNK_BEATS beats of one entry)
    ST_NORM_FLUSH,        // norm-load / flush rows: per block, max(its norm words, the previous block's), + the last
    ST_ROUNDS,            // lane rounds: per chunk, the postings of its most loaded lane
    ST_LANE_STALLS,       // cycles the lanes wait between the terms of a block (BM25_ACC_GAP each)
    ST_SCORED,            // postings scored and accumulated (over all lanes)
    ST_CANDIDATES,        // docs with at least one term, summed over blocks
    ST_CAND_ROWS,         // flush rows (64 docs) with at least one candidate, offered to the top-k
    ST_INSERTS,           // candidates past the lane filter, one insert cycle each (data dependent; not modelled)
    ST_RESULTS,           // results written
    BM25_NUM_STATS
};

#ifdef __cplusplus
extern "C" {
#endif

// One compute unit: the top-k of each of num_queries queries over one shard (one HBM bank).
// Query q's terms are q_terms[q_off[q] .. q_off[q+1]), ascending term id, weights w = boost * idf (f32).
// Results: out_docids/out_scores[q * k + j] for j < out_counts[q], best first (score desc, docid asc).
// The host guarantees 1 <= k <= BM25_MAX_K, at most BM25_MAX_TERMS terms per query, and block_bits in
// [BM25_MIN_BLOCK_BITS, BM25_MAX_BLOCK_BITS].
void bm25_topk(const PostWord* postings, const NormWord* norms, const uint32_t* term_ptr,
               const uint32_t* blk_id, const uint32_t* blk_start, const float* cache, const uint32_t* q_off,
               const uint32_t* q_terms, const float* q_weights, uint32_t* out_docids, float* out_scores,
               uint32_t* out_counts, uint32_t* out_stats, uint32_t num_queries, uint32_t k, uint32_t block_start,
               uint32_t block_end, uint32_t doc_start, uint32_t doc_end, uint32_t block_bits, uint32_t tf_bits);

#ifdef __cplusplus
}
#endif

#endif
