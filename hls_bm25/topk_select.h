// The running top-k stage shared by the bm25_topk and attn_topk kernels: a sorted list of (score, id) pairs in
// registers, ranked by score descending then id ascending (the order of indexer/FORMAT.md and of
// ragserve.kernels.*.selection.topk_rows). Each candidate is compared with every slot at once; its rank is the
// number of kept entries better than it, the entries from that rank down shift by one slot and it takes the
// freed one, so a candidate costs one cycle whatever its rank (II=1 in the caller's pipelined loop).
//
// Empty slots hold the sentinel (-inf, 0xFFFFFFFF), which every candidate with a smaller id beats: BM25 scores
// are >= 0 and attention scores may be any finite value (or -inf for a masked token, still ranked by id).
#ifndef RAGSERVE_TOPK_SELECT_H
#define RAGSERVE_TOPK_SELECT_H

#include <math.h>
#include <stdint.h>

inline bool topk_better(float sa, uint32_t ia, float sb, uint32_t ib) {
    return (sa > sb) | ((sa == sb) & (ia < ib));
}

template <uint32_t MAX_K>
void topk_reset(float top_s[MAX_K], uint32_t top_i[MAX_K]) {
#pragma HLS inline
reset:
    for (uint32_t j = 0; j < MAX_K; ++j) {
#pragma HLS unroll
        top_s[j] = -INFINITY;
        top_i[j] = 0xFFFFFFFFu;
    }
}

// Offer (s, id) to the list of the best k (1 <= k <= MAX_K) of which n are filled; true when it entered.
template <uint32_t MAX_K>
bool topk_offer(float top_s[MAX_K], uint32_t top_i[MAX_K], uint32_t k, uint32_t& n, float s, uint32_t id) {
#pragma HLS inline
    if (!topk_better(s, id, top_s[k - 1], top_i[k - 1])) return false;
    if (n < k) ++n;
    // Rank = number of kept entries better than the candidate (parallel compares, adder tree).
    uint32_t rank = 0;
rank_of:
    for (uint32_t j = 0; j < MAX_K; ++j) {
#pragma HLS unroll
        rank += (j < k) & topk_better(top_s[j], top_i[j], s, id);
    }
shift:
    for (uint32_t j = MAX_K - 1; j > 0; --j) {
#pragma HLS unroll
        const bool move = (j < k) & (j > rank);
        const float above_s = top_s[j - 1], own_s = top_s[j];
        const uint32_t above_i = top_i[j - 1], own_i = top_i[j];
        top_s[j] = move ? above_s : own_s;
        top_i[j] = move ? above_i : own_i;
    }
    top_s[rank] = s;
    top_i[rank] = id;
    return true;
}

// Priority encoder: the lowest set bit of a non-zero mask.
inline uint32_t lowest_lane(uint64_t mask) {
#pragma HLS inline
    uint32_t l = 0;
lowest:
    for (int b = 63; b >= 0; --b) {
#pragma HLS unroll
        if ((mask >> b) & 1u) l = static_cast<uint32_t>(b);
    }
    return l;
}

// A row of LANES candidates a cycle (bit l of valid marks lane l's as real): all are compared with the current
// k-th entry at once, and only those that beat it go to the one-a-cycle insert above, so a row none of whose
// candidates can enter costs one cycle. A candidate past the filter may still fail against a k-th raised by an
// earlier lane of its row (topk_offer rechecks). Returns the candidates past the filter (the insert cycles spent).
template <uint32_t MAX_K, uint32_t LANES>
uint32_t topk_offer_row(float top_s[MAX_K], uint32_t top_i[MAX_K], uint32_t k, uint32_t& n, const float s[LANES],
                        const uint32_t id[LANES], uint64_t valid) {
#pragma HLS inline
    static_assert(LANES <= 64, "one bit a lane in a 64-bit mask");
    const float kth_s = top_s[k - 1];
    const uint32_t kth_i = top_i[k - 1];
    uint64_t pass = 0;
filter:
    for (uint32_t l = 0; l < LANES; ++l) {
#pragma HLS unroll
        pass |= static_cast<uint64_t>(((valid >> l) & 1u) && topk_better(s[l], id[l], kth_s, kth_i)) << l;
    }
    uint32_t offered = 0;
insert:
    while (pass != 0) {
#pragma HLS pipeline II = 1
#pragma HLS loop_tripcount max = 64
        const uint32_t l = lowest_lane(pass);
        pass &= pass - 1;
        ++offered;
        topk_offer<MAX_K>(top_s, top_i, k, n, s[l], id[l]);
    }
    return offered;
}

#endif
