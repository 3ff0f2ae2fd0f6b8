// attn_topk: the fused inner-product + reduction + top-k kernel of sparse attention (the seeds' General Setup):
// only the selected units' ids (and, for verification, every unit score) leave the card.
//
// Streaming dataflow, one process per stage:
//   read_keys    -> streams each row's keys (Quest: each page's lo and hi keys) from HBM in 512-bit beats
//   score_keys   -> inner-product engine: per key and head, `dim` f32 products (Quest: max(q lo, q hi)) summed by
//                   a pairwise tree; reduction unit: max over heads, or DSA's sum_h w_h * ReLU(dot) in head order
//   select_units -> max over each unit's keys, then the shared running top-k (topk_select.h) of the middle units
//   write_out    -> every unit score, the top-k ids and scores, counters
//
// Bit-exactness with the CPU reference (ragserve.kernels.cpu.relevancy.inner_product_tree / bound_tree and
// ragserve.attention.ops.CpuOps): the same f32 operations in the same order. The tree adds lane i = lane 2i +
// lane 2i+1 level by level over the lanes padded with zeros to the next power of two of `dim`; maxima are
// canonicalised (+0.0 added) so a -0.0 never depends on which of two equal zeros a max kept. Build with
// -ffp-contract=off under g++: a product followed by an add must not become a fused multiply-add.
#include <hls_stream.h>

#include "attn_topk.h"
#include "topk_select.h"

namespace {

struct Scored {
    float s;
    uint32_t last;  // 1: the row's end
};

inline uint32_t lanes_of(uint32_t dim) {
    uint32_t w = 1;
    while (w < dim) w <<= 1;
    return w;
}

// Pairwise tree over the first `width` lanes (a power of two): the levels above `width` are bypassed.
inline float tree_sum(float buf[ATTN_MAX_DIM], uint32_t width) {
#pragma HLS inline
levels:
    for (uint32_t w = ATTN_MAX_DIM; w > 1; w >>= 1) {
#pragma HLS unroll
        if (w <= width) {
        pairs:
            for (uint32_t i = 0; i < w / 2; ++i) {
#pragma HLS unroll
                buf[i] = buf[2 * i] + buf[2 * i + 1];
            }
        }
    }
    return buf[0];
}

inline float fmax_first(float a, float b) { return (b > a) ? b : a; }

void read_keys(const KeyWord* keys, const KeyWord* keys_hi, uint32_t rows, uint32_t num_keys, uint32_t dim,
               uint32_t mode, hls::stream<KeyWord>& lo_s, hls::stream<KeyWord>& hi_s, hls::stream<uint32_t>& stats) {
    // A key occupies whole beats (the host pads dim to a multiple of 16 lanes with zeros).
    const uint32_t words = (dim + ATTN_WORD_LANES - 1) / ATTN_WORD_LANES;
rows_loop:
    for (uint32_t r = 0; r < rows; ++r) {
        uint32_t nwords = 0;
        const uint64_t base = static_cast<uint64_t>(r) * num_keys * words;
    beats:
        for (uint64_t i = 0; i < static_cast<uint64_t>(num_keys) * words; ++i) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 1048576
            lo_s.write(keys[base + i]);
            if (mode == ATTN_BOUNDS_MAX) hi_s.write(keys_hi[base + i]);
        }
        nwords += num_keys * words * (mode == ATTN_BOUNDS_MAX ? 2 : 1);
        stats.write(nwords);
    }
}

void score_keys(const float* q, const float* w, uint32_t rows, uint32_t heads, uint32_t dim, uint32_t num_keys,
                uint32_t mode, hls::stream<KeyWord>& lo_s, hls::stream<KeyWord>& hi_s, hls::stream<Scored>& out,
                hls::stream<uint32_t>& stats) {
    static float ql[ATTN_MAX_HEADS][ATTN_MAX_DIM];
#pragma HLS array_partition variable = ql type = complete dim = 2
    static float wl[ATTN_MAX_HEADS];
    const uint32_t width = lanes_of(dim);
    const uint32_t words = (dim + ATTN_WORD_LANES - 1) / ATTN_WORD_LANES;
rows_loop:
    for (uint32_t r = 0; r < rows; ++r) {
    load_q:
        for (uint32_t h = 0; h < heads; ++h) {
#pragma HLS loop_tripcount max = 64
            wl[h] = mode == ATTN_DOTS_WRELU ? w[r * heads + h] : 0.0f;
            for (uint32_t d = 0; d < dim; ++d) {
#pragma HLS pipeline II = 1
                ql[h][d] = q[(static_cast<uint64_t>(r) * heads + h) * dim + d];
            }
        }
        uint32_t ndots = 0;
    keys_loop:
        for (uint32_t j = 0; j < num_keys; ++j) {
#pragma HLS loop_tripcount max = 65536
            float lo[ATTN_MAX_DIM], hi[ATTN_MAX_DIM];
#pragma HLS array_partition variable = lo type = complete
#pragma HLS array_partition variable = hi type = complete
        gather:
            for (uint32_t i = 0; i < words; ++i) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 16
                const KeyWord a = lo_s.read();
                KeyWord b = a;
                if (mode == ATTN_BOUNDS_MAX) b = hi_s.read();
                for (uint32_t l = 0; l < ATTN_WORD_LANES; ++l) {
#pragma HLS unroll
                    lo[i * ATTN_WORD_LANES + l] = a.v[l];
                    hi[i * ATTN_WORD_LANES + l] = b.v[l];
                }
            }
            float acc = mode == ATTN_DOTS_WRELU ? 0.0f : -INFINITY;
        heads_loop:
            // One head per cycle through the engine; the reduction runs in head order.
            for (uint32_t h = 0; h < heads; ++h) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 64
                float buf[ATTN_MAX_DIM];
#pragma HLS array_partition variable = buf type = complete
            products:
                for (uint32_t d = 0; d < ATTN_MAX_DIM; ++d) {
#pragma HLS unroll
                    if (d >= dim) {
                        buf[d] = 0.0f;
                    } else if (mode == ATTN_BOUNDS_MAX) {
                        buf[d] = fmax_first(ql[h][d] * lo[d], ql[h][d] * hi[d]);
                    } else {
                        buf[d] = ql[h][d] * lo[d];
                    }
                }
                const float dot = tree_sum(buf, width);
                if (mode == ATTN_DOTS_WRELU) {
                    acc = acc + wl[h] * (dot > 0.0f ? dot : 0.0f);
                } else {
                    acc = fmax_first(acc, dot);
                }
            }
            ndots += heads;
            out.write(Scored{mode == ATTN_DOTS_WRELU ? acc : acc + 0.0f, 0});
        }
        out.write(Scored{0.0f, 1});
        stats.write(ndots);
    }
}

void select_units(uint32_t rows, uint32_t num_keys, uint32_t unit, uint32_t mid_start, uint32_t mid_end, uint32_t k,
                  hls::stream<Scored>& in, hls::stream<float>& unit_scores, hls::stream<uint32_t>& count,
                  hls::stream<Scored>& best_s, hls::stream<uint32_t>& best_i, hls::stream<uint32_t>& stats) {
    float top_s[ATTN_MAX_K];
    uint32_t top_i[ATTN_MAX_K];
#pragma HLS array_partition variable = top_s type = complete
#pragma HLS array_partition variable = top_i type = complete
rows_loop:
    for (uint32_t r = 0; r < rows; ++r) {
        topk_reset<ATTN_MAX_K>(top_s, top_i);
        uint32_t n = 0, inserts = 0, units = 0, cands = 0, in_unit = 0;
        float m = -INFINITY;
    keys_loop:
        while (true) {
#pragma HLS pipeline II = 1
            const Scored x = in.read();
            if (!x.last) {
                m = fmax_first(m, x.s);
                ++in_unit;
            }
            // A unit ends after `unit` keys, or at the row's end with the keys it holds.
            if ((x.last && in_unit > 0) || in_unit == unit) {
                const float s = m + 0.0f;
                unit_scores.write(s);
                if (units >= mid_start && units < mid_end) {
                    ++cands;
                    inserts += topk_offer<ATTN_MAX_K>(top_s, top_i, k, n, s, units);
                }
                ++units;
                in_unit = 0;
                m = -INFINITY;
            }
            if (x.last) break;
        }
        count.write(n);
    emit:
        for (uint32_t j = 0; j < n; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 2048
            best_s.write(Scored{top_s[j], 0});
            best_i.write(top_i[j]);
        }
        stats.write(units);
        stats.write(cands);
        stats.write(inserts);
    }
}

void write_out(uint32_t rows, uint32_t num_units, uint32_t k, hls::stream<float>& unit_scores,
               hls::stream<uint32_t>& count, hls::stream<Scored>& best_s, hls::stream<uint32_t>& best_i,
               hls::stream<uint32_t>& read_stats, hls::stream<uint32_t>& score_stats,
               hls::stream<uint32_t>& select_stats, float* out_scores, uint32_t* out_ids, float* out_top,
               uint32_t* out_counts, uint32_t* out_stats) {
rows_loop:
    for (uint32_t r = 0; r < rows; ++r) {
    scores:
        for (uint32_t u = 0; u < num_units; ++u) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 65536
            out_scores[static_cast<uint64_t>(r) * num_units + u] = unit_scores.read();
        }
        const uint32_t n = count.read();
    results:
        for (uint32_t j = 0; j < n; ++j) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 2048
            out_top[r * k + j] = best_s.read().s;
            out_ids[r * k + j] = best_i.read();
        }
        out_counts[r] = n;
        uint32_t* st = out_stats + r * ATTN_NUM_STATS;
        st[AST_KEY_WORDS] = read_stats.read();
        st[AST_DOTS] = score_stats.read();
        st[AST_UNITS] = select_stats.read();
        st[AST_CANDIDATES] = select_stats.read();
        st[AST_INSERTS] = select_stats.read();
        st[AST_RESULTS] = n;
    }
}

}  // namespace

extern "C" void attn_topk(const float* q, const float* w, const KeyWord* keys, const KeyWord* keys_hi,
                          float* out_scores, uint32_t* out_ids, float* out_top, uint32_t* out_counts,
                          uint32_t* out_stats, uint32_t rows, uint32_t heads, uint32_t dim, uint32_t num_keys,
                          uint32_t unit, uint32_t mode, uint32_t mid_start, uint32_t mid_end, uint32_t k) {
#pragma HLS INTERFACE m_axi port = keys offset = slave bundle = gmem0 max_read_burst_length = 64 num_read_outstanding = 32
#pragma HLS INTERFACE m_axi port = keys_hi offset = slave bundle = gmem1 max_read_burst_length = 64 num_read_outstanding = 32
#pragma HLS INTERFACE m_axi port = q offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = w offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = out_scores offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = out_ids offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = out_top offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = out_counts offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = out_stats offset = slave bundle = gmem3
#pragma HLS INTERFACE s_axilite port = return
#pragma HLS dataflow
    hls::stream<KeyWord> lo_s("lo"), hi_s("hi");
    hls::stream<Scored> scored("scored"), best_s("best_s");
    hls::stream<float> unit_scores("unit_scores");
    hls::stream<uint32_t> count("count"), best_i("best_i");
    hls::stream<uint32_t> read_stats("read_stats"), score_stats("score_stats"), select_stats("select_stats");
#pragma HLS stream variable = lo_s depth = 16
#pragma HLS stream variable = hi_s depth = 16
#pragma HLS stream variable = scored depth = 256
#pragma HLS stream variable = unit_scores depth = 256
#pragma HLS stream variable = best_s depth = 2048
#pragma HLS stream variable = best_i depth = 2048
    const uint32_t num_units = (num_keys + unit - 1) / unit;
    read_keys(keys, keys_hi, rows, num_keys, dim, mode, lo_s, hi_s, read_stats);
    score_keys(q, w, rows, heads, dim, num_keys, mode, lo_s, hi_s, scored, score_stats);
    select_units(rows, num_keys, unit, mid_start, mid_end, k, scored, unit_scores, count, best_s, best_i,
                 select_stats);
    write_out(rows, num_units, k, unit_scores, count, best_s, best_i, read_stats, score_stats, select_stats,
              out_scores, out_ids, out_top, out_counts, out_stats);
}
