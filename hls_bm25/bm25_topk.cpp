// bm25_topk: exact Lucene BM25 top-k over one shard of a ragserve index (indexer/FORMAT.md), one HBM bank per CU.
//
// Streaming dataflow, one process per stage, connected by hls::stream FIFOs:
//   plan_entries -> table walker: per query term its block entries (term_ptr, blk_id, blk_start), merged block by
//                   block in term order; one (first posting, end, weight) command per entry
//   read_shard   -> bursts each visited block's norms, then one 512-bit posting beat a cycle over all the block's
//                   entries; the beat's 16 postings go straight to their lanes (lane = docid % 16) through a 16 x 16
//                   grid of FIFOs (slot s -> lane j), so no two postings of a beat ever compete for a FIFO
//   lanes        -> 16 lanes, each with its own banks of the block's norms and f64 accumulators: a lane scores and
//                   accumulates one posting a cycle; a chunk of <= 32 beats takes as many cycles as its most
//                   loaded lane (the conflict rounds). A block is flushed 64 docs a cycle while the next block's
//                   norms are loaded; rows with a candidate go on
//   select_topk  -> running sorted top-k (score desc, docid asc): a row of 64 candidates a cycle is filtered
//                   against the current k-th, the few that pass are inserted one a cycle (topk_select.h, shared
//                   with attn_topk.cpp)
//   write_out    -> top-k, counts and per-query loop counters to HBM
//
// Bit-exactness with the CPU backend: the host computes w = boost * idf (f32) and cache[256] (f32) with
// indexer/bm25.py; each posting's score is w - w / (1 + tf * cache[norm]) in f32, summed in f64 in ascending
// term id (a doc lives in one lane, and a lane takes a block's entries in the query's term order), and rounded to
// f32 once. Build with -ffp-contract=off under g++: 1 + tf * cache must not become a fused multiply-add.
#include <hls_stream.h>

#include "bm25_topk.h"
#include "topk_select.h"

namespace {

constexpr uint32_t SLOTS = BM25_POSTINGS_PER_WORD;
constexpr uint32_t LANES = BM25_LANES;
constexpr uint32_t LANE_DOCS = BM25_MAX_BLOCK / LANES;
constexpr uint32_t NORMS_PER_LANE = BM25_NORMS_PER_WORD / LANES;  // a norm word's bytes for each lane
static_assert(LANES == (1u << BM25_LANE_BITS), "lane = docid % LANES");
static_assert(BM25_NORMS_PER_WORD % LANES == 0, "a norm word feeds every lane alike");

enum Op : uint32_t { OP_QUERY, OP_BLOCK, OP_ENTRY, OP_END_BLOCK, OP_END_QUERY };

// Control token: OP_BLOCK(a = block number, b = docs in the block), OP_ENTRY(a = first posting, b = end, w).
struct Cmd {
    uint32_t op;
    uint32_t a;
    uint32_t b;
    float w;
};

// One chunk of an entry: how many postings each slot sent to each lane, the term weight; `first` marks an entry's
// first chunk, `end` the end of the block's chunks.
struct ChunkHdr {
    uint8_t cnt[SLOTS][LANES];
    float w;
    bool first;
    bool end;
};

// A flush row: 64 consecutive docs of a block (one norm word's), doc l a candidate where bit l of valid is set.
struct CandRow {
    uint32_t doc[BM25_NORMS_PER_WORD];
    float s[BM25_NORMS_PER_WORD];
    uint64_t valid;
    bool last;  // end of the query's candidates
};

struct Cand {
    uint32_t doc;
    float score;
};

void plan_entries(const uint32_t* term_ptr, const uint32_t* blk_id, const uint32_t* blk_start, const uint32_t* q_off,
                  const uint32_t* q_terms, const float* q_weights, uint32_t num_queries, uint32_t block_start,
                  uint32_t block_end, uint32_t doc_end, uint32_t block_bits, hls::stream<Cmd>& cmd,
                  hls::stream<uint32_t>& stats) {
    // Per query term: next entry, end of its entries, that entry's block and first posting, weight.
    uint32_t cur[BM25_MAX_TERMS], end[BM25_MAX_TERMS], nxt[BM25_MAX_TERMS], start[BM25_MAX_TERMS];
    float wt[BM25_MAX_TERMS];
    uint32_t hit[BM25_MAX_TERMS];
queries:
    for (uint32_t q = 0; q < num_queries; ++q) {
        const uint32_t q0 = q_off[q];
        const uint32_t nterms = q_off[q + 1] - q0;
        uint32_t table_reads = 0, scan = 0, blocks = 0, entries = 0, entry_reads = 0;
        cmd.write(Cmd{OP_QUERY, q, 0, 0.0f});
    term_setup:
        for (uint32_t i = 0; i < nterms; ++i) {
#pragma HLS pipeline II = 4
#pragma HLS loop_tripcount max = 64
            const uint32_t t = q_terms[q0 + i];
            wt[i] = q_weights[q0 + i];
            const uint32_t e0 = term_ptr[t], e1 = term_ptr[t + 1];
            table_reads += 2;
            cur[i] = e0;
            end[i] = e1;
            if (e0 < e1) {
                nxt[i] = blk_id[e0];
                start[i] = blk_start[e0];
                table_reads += 2;
            }
        }
    blocks_loop:
        for (uint32_t blk = block_start; blk < block_end; ++blk) {
            // Terms with an entry in this block, in query (ascending term id) order: the f64 summation order.
            uint32_t nhit = 0;
        term_scan:
            for (uint32_t i = 0; i < nterms; ++i) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 64
                if (cur[i] < end[i] && nxt[i] == blk) hit[nhit++] = i;
            }
            scan += nterms;
            if (nhit == 0) continue;
            ++blocks;
            const uint32_t first_doc = blk << block_bits;
            const uint32_t block_docs = (doc_end - first_doc < (1u << block_bits)) ? doc_end - first_doc
                                                                                   : (1u << block_bits);
            cmd.write(Cmd{OP_BLOCK, blk, block_docs, 0.0f});
        entry_loop:
            // Each hit is a different term, so its table reads are independent of the other iterations': the
            // loop pipelines (two reads on one port), and the reader streams the entries' postings meanwhile.
            for (uint32_t h = 0; h < nhit; ++h) {
#pragma HLS pipeline II = 2
#pragma HLS dependence variable = cur inter false
#pragma HLS dependence variable = start inter false
#pragma HLS dependence variable = nxt inter false
#pragma HLS loop_tripcount max = 64
                const uint32_t i = hit[h];
                const uint32_t e = cur[i];
                const uint32_t s0 = start[i];
                const uint32_t s1 = blk_start[e + 1];
                ++entry_reads;
                cmd.write(Cmd{OP_ENTRY, s0, s1, wt[i]});
                ++entries;
                cur[i] = e + 1;
                start[i] = s1;
                if (e + 1 < end[i]) {
                    nxt[i] = blk_id[e + 1];
                    ++entry_reads;
                }
            }
            cmd.write(Cmd{OP_END_BLOCK, 0, 0, 0.0f});
        }
        cmd.write(Cmd{OP_END_QUERY, q, 0, 0.0f});
        stats.write(nterms);
        stats.write(table_reads);
        stats.write(block_end - block_start);
        stats.write(scan);
        stats.write(blocks);
        stats.write(entries);
        stats.write(entry_reads);
    }
}

void read_shard(const PostWord* postings, const NormWord* norms, uint32_t num_queries, uint32_t doc_start,
                uint32_t block_bits, uint32_t tf_bits, hls::stream<Cmd>& cmd, hls::stream<Cmd>& lcmd,
                hls::stream<NormWord>& nrm, hls::stream<uint32_t> xbar[SLOTS][LANES], hls::stream<ChunkHdr>& chdr,
                hls::stream<uint32_t>& stats) {
queries:
    for (uint32_t q = 0; q < num_queries; ++q) {
        uint32_t norm_words = 0, post_words = 0, npost = 0, chunks = 0;
        lcmd.write(cmd.read());  // OP_QUERY
    blocks:
        while (true) {
            const Cmd blk = cmd.read();
            lcmd.write(blk);
            if (blk.op == OP_END_QUERY) break;
            const uint32_t first_doc = blk.a << block_bits;
            const uint32_t nwords = (blk.b + BM25_NORMS_PER_WORD - 1) / BM25_NORMS_PER_WORD;
            const uint32_t word0 = (first_doc - doc_start) / BM25_NORMS_PER_WORD;
        norm_burst:
            for (uint32_t j = 0; j < nwords; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 4096
                nrm.write(norms[word0 + j]);
            }
            norm_words += nwords;
            // One beat a cycle over all the block's entries (the next entry's command is taken in the cycle its
            // first beat is read), cut into chunks of <= BM25_CHUNK_BEATS beats of one entry.
            uint8_t cnt[SLOTS][LANES];  // the open chunk's postings per slot and lane
#pragma HLS array_partition variable = cnt type = complete dim = 0
        clear_first:
            for (uint32_t s = 0; s < SLOTS; ++s)
                for (uint32_t j = 0; j < LANES; ++j) cnt[s][j] = 0;
            uint32_t g = 0, s1 = 0, beats = 0;
            float w = 0.0f;
            bool first = false;
        post_beats:
            while (true) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 16384
                if (g >= s1) {
                    const Cmd e = cmd.read();
                    if (e.op == OP_END_BLOCK) break;
                    g = e.a;
                    s1 = e.b;
                    w = e.w;
                    first = true;
                    if (g >= s1) continue;
                }
                const PostWord word = postings[g / SLOTS];
                ++post_words;
                const uint32_t base = g - g % SLOTS;
            dispatch:
                for (uint32_t s = 0; s < SLOTS; ++s) {
#pragma HLS unroll
                    if (base + s >= g && base + s < s1) {
                        const uint32_t p = word.p[s];
                        const uint32_t j = (p >> tf_bits) & (LANES - 1);
                        xbar[s][j].write(p);
                        ++cnt[s][j];
                    }
                }
                const uint32_t next = base + SLOTS;
                npost += (next < s1 ? next : s1) - g;
                g = next;
                if (++beats == BM25_CHUNK_BEATS || g >= s1) {
                    ChunkHdr h;
                copy:
                    for (uint32_t s = 0; s < SLOTS; ++s)
                        for (uint32_t j = 0; j < LANES; ++j) {
                            h.cnt[s][j] = cnt[s][j];
                            cnt[s][j] = 0;
                        }
                    h.w = w;
                    h.first = first;
                    h.end = false;
                    chdr.write(h);
                    ++chunks;
                    first = false;
                    beats = 0;
                }
            }
            ChunkHdr end_of_block{};
            end_of_block.end = true;
            chdr.write(end_of_block);
            lcmd.write(Cmd{OP_END_BLOCK, 0, 0, 0.0f});
        }
        stats.write(norm_words);
        stats.write(post_words);
        stats.write(npost);
        stats.write(chunks);
    }
}

void lanes(const float* cache, uint32_t num_queries, uint32_t block_bits, uint32_t tf_bits, hls::stream<Cmd>& lcmd,
           hls::stream<NormWord>& nrm, hls::stream<uint32_t> xbar[SLOTS][LANES], hls::stream<ChunkHdr>& chdr,
           hls::stream<CandRow>& rows, hls::stream<uint32_t>& stats) {
    // Lane j holds the docs d of the block with d % LANES == j at address d / LANES, in NORMS_PER_LANE banks
    // (address % NORMS_PER_LANE), so a 64-doc row is written or read in one cycle. Static: the memories outlive
    // a launch; every flush clears the seen bits it set, so they are all clear at the start of each block.
    static double acc[LANES][LANE_DOCS];
#pragma HLS array_partition variable = acc type = complete dim = 1
#pragma HLS array_partition variable = acc type = cyclic factor = 4 dim = 2
#pragma HLS bind_storage variable = acc type = ram_2p impl = uram
    static bool seen[LANES][LANE_DOCS];
#pragma HLS array_partition variable = seen type = complete dim = 1
#pragma HLS array_partition variable = seen type = cyclic factor = 4 dim = 2
    uint8_t nbuf[LANES][LANE_DOCS];  // the block's norms, each lane's own banks
#pragma HLS array_partition variable = nbuf type = complete dim = 1
#pragma HLS array_partition variable = nbuf type = cyclic factor = 4 dim = 2
#pragma HLS bind_storage variable = nbuf type = ram_2p impl = bram
    float cache_l[LANES][BM25_CACHE_SIZE];  // one copy a lane: 16 lookups a cycle
#pragma HLS array_partition variable = cache_l type = complete dim = 1
    const uint32_t tf_mask = (1u << tf_bits) - 1;
load_cache:
    for (uint32_t i = 0; i < BM25_CACHE_SIZE; ++i) {
#pragma HLS pipeline II = 1
        const float c = cache[i];
        for (uint32_t j = 0; j < LANES; ++j) {
#pragma HLS unroll
            cache_l[j][i] = c;
        }
    }
queries:
    for (uint32_t q = 0; q < num_queries; ++q) {
        uint32_t norm_flush = 0, rounds = 0, stalls = 0, nscored = 0, ncand = 0, nrows = 0;
        uint32_t prev_doc = 0, prev_rows = 0;  // the block waiting for its flush
        lcmd.read();  // OP_QUERY
    blocks:
        while (true) {
            const Cmd blk = lcmd.read();
            const bool last = blk.op == OP_END_QUERY;
            const uint32_t first_doc = last ? 0 : blk.a << block_bits;
            const uint32_t nwords = last ? 0 : (blk.b + BM25_NORMS_PER_WORD - 1) / BM25_NORMS_PER_WORD;
            const uint32_t n_iter = nwords > prev_rows ? nwords : prev_rows;
        norm_flush_rows:
            // Row i: norm word i of this block (64 consecutive docs, 4 for each lane) goes in while row i of the
            // previous block, its docs 64 i .. 64 i + 63, is flushed: the docs with a term become a candidate row.
            for (uint32_t i = 0; i < n_iter; ++i) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 4096
                if (i < nwords) {
                    const NormWord x = nrm.read();
                    for (uint32_t l = 0; l < BM25_NORMS_PER_WORD; ++l) {
#pragma HLS unroll
                        nbuf[l % LANES][i * NORMS_PER_LANE + l / LANES] = x.b[l];
                    }
                }
                if (i < prev_rows) {
                    CandRow row;
                    row.valid = 0;
                    row.last = false;
                    uint32_t nvalid = 0;
                    for (uint32_t l = 0; l < BM25_NORMS_PER_WORD; ++l) {
#pragma HLS unroll
                        const uint32_t j = l % LANES, a = i * NORMS_PER_LANE + l / LANES;
                        row.doc[l] = prev_doc + i * BM25_NORMS_PER_WORD + l;
                        row.s[l] = static_cast<float>(acc[j][a]);
                        row.valid |= static_cast<uint64_t>(seen[j][a]) << l;
                        nvalid += seen[j][a];
                        seen[j][a] = false;
                    }
                    if (nvalid != 0) {
                        rows.write(row);
                        ++nrows;
                    }
                    ncand += nvalid;
                }
            }
            norm_flush += n_iter;
            if (last) break;
            uint8_t left[SLOTS][LANES];  // postings each slot still holds for each lane in this chunk
#pragma HLS array_partition variable = left type = complete dim = 0
            uint32_t load[LANES];
#pragma HLS array_partition variable = load type = complete
        init:
            for (uint32_t j = 0; j < LANES; ++j) {
#pragma HLS unroll
                load[j] = 0;
            }
            uint32_t r = 0, rmax = 0, gap = 0;
            float w = 0.0f;
            bool any_chunk = false;
        lane_rounds:
            // One iteration a cycle: every lane with a posting left in the chunk scores and accumulates one.
            // Within one term the docids are distinct (no read-after-write on acc); before a block's next term
            // the lanes wait BM25_ACC_GAP cycles for the last sums to be written.
            while (true) {
#pragma HLS pipeline II = 1
#pragma HLS dependence variable = acc inter false
#pragma HLS dependence variable = seen inter false
#pragma HLS loop_tripcount max = 16384
                if (r == rmax && gap == 0) {
                    const ChunkHdr h = chdr.read();
                    if (h.end) break;
                    rmax = 0;
                    for (uint32_t j = 0; j < LANES; ++j) {
#pragma HLS unroll
                        uint32_t n = 0;
                        for (uint32_t s = 0; s < SLOTS; ++s) {
#pragma HLS unroll
                            left[s][j] = h.cnt[s][j];
                            n += h.cnt[s][j];
                        }
                        load[j] = n;
                        rmax = n > rmax ? n : rmax;
                    }
                    r = 0;
                    w = h.w;
                    if (h.first && any_chunk) gap = BM25_ACC_GAP;
                    any_chunk = true;
                }
                if (gap > 0) {
                    --gap;
                    ++stalls;
                    continue;
                }
            lane:
                for (uint32_t j = 0; j < LANES; ++j) {
#pragma HLS unroll
                    if (r < load[j]) {
                        // This lane's next posting: from the lowest slot that still holds one for it.
                        uint32_t mask = 0;
                        for (uint32_t s = 0; s < SLOTS; ++s) {
#pragma HLS unroll
                            mask |= static_cast<uint32_t>(left[s][j] != 0) << s;
                        }
                        const uint32_t s = lowest_lane(mask);
                        --left[s][j];
                        const uint32_t p = xbar[s][j].read();
                        const uint32_t a = (p >> tf_bits) >> BM25_LANE_BITS;
                        const float qf = static_cast<float>(p & tf_mask) * cache_l[j][nbuf[j][a]];
                        const float sc = w - w / (1.0f + qf);
                        if (seen[j][a]) {
                            acc[j][a] += static_cast<double>(sc);
                        } else {
                            seen[j][a] = true;
                            acc[j][a] = static_cast<double>(sc);
                        }
                        ++nscored;
                    }
                }
                ++r;
                ++rounds;
            }
            lcmd.read();  // OP_END_BLOCK
            prev_doc = first_doc;
            prev_rows = nwords;
        }
        CandRow end_row;
        end_row.valid = 0;
        end_row.last = true;
        rows.write(end_row);
        stats.write(norm_flush);
        stats.write(rounds);
        stats.write(stalls);
        stats.write(nscored);
        stats.write(ncand);
        stats.write(nrows);
    }
}

void select_topk(uint32_t num_queries, uint32_t k, hls::stream<CandRow>& rows, hls::stream<uint32_t>& count,
                 hls::stream<Cand>& best, hls::stream<uint32_t>& stats) {
    // The shared running top-k (topk_select.h): a row of LANES candidates a cycle through the k-th filter, one
    // insert cycle for each that passes. Every real score (>= 0) beats the empty slots' sentinel.
    float top_s[BM25_MAX_K];
    uint32_t top_d[BM25_MAX_K];
#pragma HLS array_partition variable = top_s type = complete
#pragma HLS array_partition variable = top_d type = complete
queries:
    for (uint32_t q = 0; q < num_queries; ++q) {
        topk_reset<BM25_MAX_K>(top_s, top_d);
        uint32_t n = 0, inserts = 0;
    candidates:
        while (true) {
#pragma HLS pipeline II = 1
            const CandRow row = rows.read();
            if (row.last) break;
            inserts += topk_offer_row<BM25_MAX_K, BM25_NORMS_PER_WORD>(top_s, top_d, k, n, row.s, row.doc, row.valid);
        }
        count.write(n);
    emit:
        for (uint32_t j = 0; j < n; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 1024
            best.write(Cand{top_d[j], top_s[j]});
        }
        stats.write(inserts);
    }
}

void write_out(uint32_t num_queries, uint32_t k, hls::stream<uint32_t>& count, hls::stream<Cand>& best,
               hls::stream<uint32_t>& plan_stats, hls::stream<uint32_t>& read_stats,
               hls::stream<uint32_t>& lane_stats, hls::stream<uint32_t>& topk_stats, uint32_t* out_docids,
               float* out_scores, uint32_t* out_counts, uint32_t* out_stats) {
queries:
    for (uint32_t q = 0; q < num_queries; ++q) {
        const uint32_t n = count.read();
    results:
        for (uint32_t j = 0; j < n; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 1024
            const Cand c = best.read();
            out_docids[q * k + j] = c.doc;
            out_scores[q * k + j] = c.score;
        }
        out_counts[q] = n;
        uint32_t* st = out_stats + q * BM25_NUM_STATS;
        st[ST_TERMS] = plan_stats.read();
        st[ST_TABLE_READS] = plan_stats.read();
        st[ST_BLOCK_LOOP] = plan_stats.read();
        st[ST_SCAN] = plan_stats.read();
        st[ST_BLOCKS] = plan_stats.read();
        st[ST_ENTRIES] = plan_stats.read();
        st[ST_ENTRY_READS] = plan_stats.read();
        st[ST_NORM_WORDS] = read_stats.read();
        st[ST_POSTING_WORDS] = read_stats.read();
        st[ST_POSTINGS] = read_stats.read();
        st[ST_CHUNKS] = read_stats.read();
        st[ST_NORM_FLUSH] = lane_stats.read();
        st[ST_ROUNDS] = lane_stats.read();
        st[ST_LANE_STALLS] = lane_stats.read();
        st[ST_SCORED] = lane_stats.read();
        st[ST_CANDIDATES] = lane_stats.read();
        st[ST_CAND_ROWS] = lane_stats.read();
        st[ST_INSERTS] = topk_stats.read();
        st[ST_RESULTS] = n;
    }
}

}  // namespace

extern "C" void bm25_topk(const PostWord* postings, const NormWord* norms, const uint32_t* term_ptr,
                          const uint32_t* blk_id, const uint32_t* blk_start, const float* cache,
                          const uint32_t* q_off, const uint32_t* q_terms, const float* q_weights,
                          uint32_t* out_docids, float* out_scores, uint32_t* out_counts, uint32_t* out_stats,
                          uint32_t num_queries, uint32_t k, uint32_t block_start, uint32_t block_end,
                          uint32_t doc_start, uint32_t doc_end, uint32_t block_bits, uint32_t tf_bits) {
// Wide bursts from the shard's bank; every bundle of one CU is bound to that CU's HBM bank at link time.
#pragma HLS INTERFACE m_axi port = postings offset = slave bundle = gmem0 max_read_burst_length = 64 num_read_outstanding = 32
#pragma HLS INTERFACE m_axi port = norms offset = slave bundle = gmem1 max_read_burst_length = 64 num_read_outstanding = 16
#pragma HLS INTERFACE m_axi port = term_ptr offset = slave bundle = gmem2 num_read_outstanding = 16
#pragma HLS INTERFACE m_axi port = blk_id offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = blk_start offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = cache offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = q_off offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = q_terms offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = q_weights offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = out_docids offset = slave bundle = gmem4
#pragma HLS INTERFACE m_axi port = out_scores offset = slave bundle = gmem4
#pragma HLS INTERFACE m_axi port = out_counts offset = slave bundle = gmem4
#pragma HLS INTERFACE m_axi port = out_stats offset = slave bundle = gmem4
#pragma HLS INTERFACE s_axilite port = return
#pragma HLS dataflow
    hls::stream<Cmd> cmd("cmd");
    hls::stream<Cmd> lcmd("lcmd");
    hls::stream<NormWord> nrm("nrm");
    hls::stream<uint32_t> xbar[SLOTS][LANES];
    hls::stream<ChunkHdr> chdr("chdr");
    hls::stream<CandRow> rows("rows");
    hls::stream<uint32_t> count("count");
    hls::stream<Cand> best("best");
    hls::stream<uint32_t> plan_stats("plan_stats"), read_stats("read_stats");
    hls::stream<uint32_t> lane_stats("lane_stats"), topk_stats("topk_stats");
#pragma HLS array_partition variable = xbar type = complete dim = 0
#pragma HLS stream variable = cmd depth = 256
#pragma HLS stream variable = lcmd depth = 16
#pragma HLS stream variable = nrm depth = 64
// A slot's FIFO to a lane holds two chunks' worth, so the reader runs a chunk ahead of a lagging lane.
#pragma HLS stream variable = xbar depth = 64
#pragma HLS stream variable = chdr depth = 4
#pragma HLS stream variable = rows depth = 64
#pragma HLS stream variable = best depth = 1024
#pragma HLS stream variable = plan_stats depth = 64
#pragma HLS stream variable = read_stats depth = 64
#pragma HLS stream variable = lane_stats depth = 64
#pragma HLS stream variable = topk_stats depth = 16

    plan_entries(term_ptr, blk_id, blk_start, q_off, q_terms, q_weights, num_queries, block_start, block_end, doc_end,
                 block_bits, cmd, plan_stats);
    read_shard(postings, norms, num_queries, doc_start, block_bits, tf_bits, cmd, lcmd, nrm, xbar, chdr,
               read_stats);
    lanes(cache, num_queries, block_bits, tf_bits, lcmd, nrm, xbar, chdr, rows, lane_stats);
    select_topk(num_queries, k, rows, count, best, topk_stats);
    write_out(num_queries, k, count, best, plan_stats, read_stats, lane_stats, topk_stats, out_docids, out_scores,
              out_counts, out_stats);
}
