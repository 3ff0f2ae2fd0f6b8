// bm25_topk: exact Lucene BM25 top-k over one shard of a ragserve index (indexer/FORMAT.md), one HBM bank per CU.
//
// Streaming dataflow, one process per stage, connected by hls::stream FIFOs:
//   read_shard  -> posting reader: walks the shard's doc blocks, merges the query terms' block entries, bursts
//                  each visited block's norms and each entry's postings from HBM over 512-bit m_axi ports
//   score       -> BM25 term score per posting, f32, with the norm looked up in an on-chip copy of the block's norms
//   accumulate  -> f64 accumulator of block_size docs in URAM, II=1; flushes the block's touched docs as f32 scores
//   select_topk -> running sorted top-k (score desc, docid asc) in registers, one candidate per cycle
//                  (topk_select.h, shared with attn_topk.cpp)
//   write_out   -> top-k, counts and per-query loop counters to HBM
//
// Bit-exactness with the CPU backend: the host computes w = boost * idf (f32) and cache[256] (f32) with
// ragserve/bm25.py; each posting's score is w - w / (1 + tf * cache[norm]) in f32, summed in f64 in ascending
// term id (the reader emits a block's entries in the query's term order), and rounded to f32 once.
// Build with -ffp-contract=off under g++: 1 + tf * cache must not become a fused multiply-add.
#include <hls_stream.h>

#include "bm25_topk.h"
#include "topk_select.h"

namespace {

enum Op : uint32_t { OP_QUERY, OP_BLOCK, OP_ENTRY, OP_END_BLOCK, OP_END_QUERY };

// Control token: OP_BLOCK(a = block number, b = docs in the block), OP_ENTRY(a = postings, w = term weight).
struct Cmd {
    uint32_t op;
    uint32_t a;
    uint32_t b;
    float w;
};

struct Scored {
    uint32_t doc;  // docid within the block
    float s;       // term score
};

struct Cand {
    uint32_t doc;  // global docid
    float score;
    uint32_t last;  // 1: end of the query's candidates
};

void read_shard(const PostWord* postings, const NormWord* norms, const uint32_t* term_ptr, const uint32_t* blk_id,
                const uint32_t* blk_start, const uint32_t* q_off, const uint32_t* q_terms, const float* q_weights,
                uint32_t num_queries, uint32_t block_start, uint32_t block_end, uint32_t doc_start,
                uint32_t doc_end, uint32_t block_bits, hls::stream<Cmd>& cmd, hls::stream<NormWord>& nrm,
                hls::stream<uint32_t>& post, hls::stream<uint32_t>& stats) {
    // Per query term: next entry, end of its entries, that entry's block and first posting, weight.
    uint32_t cur[BM25_MAX_TERMS], end[BM25_MAX_TERMS], nxt[BM25_MAX_TERMS], start[BM25_MAX_TERMS];
    float wt[BM25_MAX_TERMS];
    uint32_t hit[BM25_MAX_TERMS];
queries:
    for (uint32_t q = 0; q < num_queries; ++q) {
        const uint32_t q0 = q_off[q];
        const uint32_t nterms = q_off[q + 1] - q0;
        uint32_t table_reads = 0, scan = 0, blocks = 0, norm_words = 0, entries = 0, entry_reads = 0;
        uint32_t post_words = 0, npost = 0;
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
            const uint32_t nwords = (block_docs + BM25_NORMS_PER_WORD - 1) / BM25_NORMS_PER_WORD;
            const uint32_t word0 = (first_doc - doc_start) / BM25_NORMS_PER_WORD;
            cmd.write(Cmd{OP_BLOCK, blk, block_docs, 0.0f});
        norm_burst:
            for (uint32_t j = 0; j < nwords; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 4096
                nrm.write(norms[word0 + j]);
            }
            norm_words += nwords;
        entry_loop:
            for (uint32_t h = 0; h < nhit; ++h) {
#pragma HLS loop_tripcount max = 64
                const uint32_t i = hit[h];
                const uint32_t e = cur[i];
                const uint32_t s0 = start[i];
                const uint32_t s1 = blk_start[e + 1];
                ++entry_reads;
                cmd.write(Cmd{OP_ENTRY, s1 - s0, 0, wt[i]});
                PostWord word;
            posting_burst:
                // Width conversion: one 512-bit beat feeds 16 cycles of the II=1 scorer.
                for (uint32_t g = s0; g < s1; ++g) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 4096
                    if (g == s0 || g % BM25_POSTINGS_PER_WORD == 0) {
                        word = postings[g / BM25_POSTINGS_PER_WORD];
                        ++post_words;
                    }
                    post.write(word.p[g % BM25_POSTINGS_PER_WORD]);
                }
                npost += s1 - s0;
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
        stats.write(norm_words);
        stats.write(entries);
        stats.write(entry_reads);
        stats.write(post_words);
        stats.write(npost);
    }
}

void score(const float* cache, uint32_t num_queries, uint32_t tf_bits, hls::stream<Cmd>& cmd,
           hls::stream<NormWord>& nrm, hls::stream<uint32_t>& post, hls::stream<Cmd>& acmd,
           hls::stream<Scored>& scored, hls::stream<uint32_t>& stats) {
    float cache_l[BM25_CACHE_SIZE];
    uint8_t nbuf[BM25_MAX_BLOCK];  // the current block's norms
#pragma HLS array_partition variable = nbuf type = cyclic factor = 64
#pragma HLS bind_storage variable = nbuf type = ram_2p impl = bram
    const uint32_t tf_mask = (1u << tf_bits) - 1;
load_cache:
    for (uint32_t i = 0; i < BM25_CACHE_SIZE; ++i) {
#pragma HLS pipeline II = 1
        cache_l[i] = cache[i];
    }
queries:
    for (uint32_t q = 0; q < num_queries; ++q) {
        uint32_t nscored = 0;
        acmd.write(cmd.read());  // OP_QUERY
    blocks:
        while (true) {
            const Cmd blk = cmd.read();
            if (blk.op == OP_END_QUERY) break;
            const uint32_t nwords = (blk.b + BM25_NORMS_PER_WORD - 1) / BM25_NORMS_PER_WORD;
        load_norms:
            for (uint32_t j = 0; j < nwords; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 4096
                const NormWord x = nrm.read();
                for (uint32_t l = 0; l < BM25_NORMS_PER_WORD; ++l) {
#pragma HLS unroll
                    nbuf[j * BM25_NORMS_PER_WORD + l] = x.b[l];
                }
            }
            acmd.write(blk);
        entries:
            while (true) {
                const Cmd ent = cmd.read();
                acmd.write(ent);
                if (ent.op == OP_END_BLOCK) break;
                const float w = ent.w;
            score_postings:
                for (uint32_t i = 0; i < ent.a; ++i) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 4096
                    const uint32_t p = post.read();
                    const uint32_t d = p >> tf_bits;
                    const float qf = static_cast<float>(p & tf_mask) * cache_l[nbuf[d]];
                    scored.write(Scored{d, w - w / (1.0f + qf)});
                }
                nscored += ent.a;
            }
        }
        acmd.write(Cmd{OP_END_QUERY, q, 0, 0.0f});
        stats.write(nscored);
    }
}

void accumulate(uint32_t num_queries, uint32_t block_bits, hls::stream<Cmd>& acmd, hls::stream<Scored>& scored,
                hls::stream<Cand>& cand, hls::stream<uint32_t>& stats) {
    // Static: the memories outlive a launch. Every flush clears the seen bits it set, so they are all clear
    // at the start of each block, as initialised.
    static double acc[BM25_MAX_BLOCK];
#pragma HLS bind_storage variable = acc type = ram_2p impl = uram
    static bool seen[BM25_MAX_BLOCK];
    static uint32_t touched[BM25_MAX_BLOCK];
#pragma HLS bind_storage variable = touched type = ram_2p impl = uram
queries:
    for (uint32_t q = 0; q < num_queries; ++q) {
        uint32_t nacc = 0, ncand = 0;
        acmd.read();  // OP_QUERY
    blocks:
        while (true) {
            const Cmd blk = acmd.read();
            if (blk.op == OP_END_QUERY) break;
            const uint32_t first_doc = blk.a << block_bits;
            uint32_t ntouched = 0;
        entries:
            while (true) {
                const Cmd ent = acmd.read();
                if (ent.op == OP_END_BLOCK) break;
            acc_postings:
                // Within one entry (one term) the docids are distinct, so no read-after-write hazard on acc:
                // II=1. The pipeline drains between entries, so a doc's next term sees the updated sum.
                for (uint32_t i = 0; i < ent.a; ++i) {
#pragma HLS pipeline II = 1
#pragma HLS dependence variable = acc inter false
#pragma HLS dependence variable = seen inter false
#pragma HLS loop_tripcount max = 4096
                    const Scored x = scored.read();
                    if (seen[x.doc]) {
                        acc[x.doc] += static_cast<double>(x.s);
                    } else {
                        seen[x.doc] = true;
                        acc[x.doc] = static_cast<double>(x.s);
                        touched[ntouched++] = x.doc;
                    }
                }
                nacc += ent.a;
            }
        flush:
            for (uint32_t j = 0; j < ntouched; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 4096
                const uint32_t d = touched[j];
                cand.write(Cand{first_doc + d, static_cast<float>(acc[d]), 0});
                seen[d] = false;
            }
            ncand += ntouched;
        }
        cand.write(Cand{0, 0.0f, 1});
        stats.write(nacc);
        stats.write(ncand);
    }
}

void select_topk(uint32_t num_queries, uint32_t k, hls::stream<Cand>& cand, hls::stream<uint32_t>& count,
                 hls::stream<Cand>& best, hls::stream<uint32_t>& stats) {
    // The shared running top-k (topk_select.h): one candidate per cycle whatever its rank. Every real score
    // (>= 0) beats the empty slots' sentinel.
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
            const Cand c = cand.read();
            if (c.last) break;
            inserts += topk_offer<BM25_MAX_K>(top_s, top_d, k, n, c.score, c.doc);
        }
        count.write(n);
    emit:
        for (uint32_t j = 0; j < n; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 1024
            best.write(Cand{top_d[j], top_s[j], 0});
        }
        stats.write(inserts);
    }
}

void write_out(uint32_t num_queries, uint32_t k, hls::stream<uint32_t>& count, hls::stream<Cand>& best,
               hls::stream<uint32_t>& read_stats, hls::stream<uint32_t>& score_stats,
               hls::stream<uint32_t>& acc_stats, hls::stream<uint32_t>& topk_stats, uint32_t* out_docids,
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
    reader_counters:
        for (uint32_t s = ST_TERMS; s <= ST_POSTINGS; ++s) st[s] = read_stats.read();
        st[ST_SCORED] = score_stats.read();
        st[ST_ACCUMULATED] = acc_stats.read();
        st[ST_CANDIDATES] = acc_stats.read();
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
    hls::stream<NormWord> nrm("nrm");
    hls::stream<uint32_t> post("post");
    hls::stream<Cmd> acmd("acmd");
    hls::stream<Scored> scored("scored");
    hls::stream<Cand> cand("cand");
    hls::stream<uint32_t> count("count");
    hls::stream<Cand> best("best");
    hls::stream<uint32_t> read_stats("read_stats"), score_stats("score_stats");
    hls::stream<uint32_t> acc_stats("acc_stats"), topk_stats("topk_stats");
#pragma HLS stream variable = cmd depth = 64
#pragma HLS stream variable = nrm depth = 64
#pragma HLS stream variable = post depth = 1024
#pragma HLS stream variable = acmd depth = 64
#pragma HLS stream variable = scored depth = 1024
#pragma HLS stream variable = cand depth = 256
#pragma HLS stream variable = best depth = 1024
#pragma HLS stream variable = read_stats depth = 64
#pragma HLS stream variable = score_stats depth = 16
#pragma HLS stream variable = acc_stats depth = 16
#pragma HLS stream variable = topk_stats depth = 16

    read_shard(postings, norms, term_ptr, blk_id, blk_start, q_off, q_terms, q_weights, num_queries, block_start,
               block_end, doc_start, doc_end, block_bits, cmd, nrm, post, read_stats);
    score(cache, num_queries, tf_bits, cmd, nrm, post, acmd, scored, score_stats);
    accumulate(num_queries, block_bits, acmd, scored, cand, acc_stats);
    select_topk(num_queries, k, cand, count, best, topk_stats);
    write_out(num_queries, k, count, best, read_stats, score_stats, acc_stats, topk_stats, out_docids, out_scores,
              out_counts, out_stats);
}
