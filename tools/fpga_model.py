"""Performance model of the ``bm25_topk`` kernel (``hls_bm25/bm25_topk.cpp``). Every figure it gives is MODELLED.

Two halves:
- ``predict_counts``: what the kernel does for each query on each shard (loop trip counts, words read, the lanes'
  conflict rounds), computed from the index's block tables and posting lists alone, without running the kernel.
  The C simulation exports the same counters (``out_stats``); tests assert both agree exactly, so the model
  describes the code as written.
- ``kernel_cycles`` / ``launch_seconds``: cycles per dataflow stage from those counts, with the initiation
  intervals and burst widths of the source and the latencies of ``KernelParams`` (assumptions, listed there),
  and the time of a launch: one CU per shard running in parallel, several queries per launch.
  ``bank_utilisation``: the share of each CU's pseudo-channel bandwidth its reads and writes use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from indexer.reader import IndexReader
from ragserve.kernels.fpga.backend import ACC_GAP, CACHE_SIZE, CHUNK_BEATS, LANES, NUM_STATS, STAT_NAMES
from indexer.bm25 import QueryTerms

S = {name: i for i, name in enumerate(STAT_NAMES)}
POSTINGS_PER_WORD = 16
NORMS_PER_WORD = 64
# Counters the model predicts exactly; "inserts" depends on the order scores arrive in (``predict_counts`` fills in
# its expected value for candidates in random order).
PREDICTED = tuple(n for n in STAT_NAMES if n != "inserts")


@dataclass(frozen=True)
class KernelParams:
    """Assumptions of the timing model (not synthesis results: no Vitis tools here)."""

    clock_hz: float = 300e6  # target kernel clock (--hls.clock in the Makefile)
    bank_bytes_per_s: float = 460e9 / 32  # one U55C HBM2 pseudo-channel: 460 GB/s over 32
    word_bytes: int = 64  # 512-bit m_axi beat
    mem_latency: int = 48  # cycles for a dependent HBM read (about 160 ns at 300 MHz)
    depth_read: int = 4  # posting-beat loop pipeline depth after the first beat
    depth_score: int = 40  # f32 mul + add + div + sub, norm and cache lookups
    depth_acc: int = 12  # f64 add and URAM read/write
    depth_flush: int = 4
    depth_topk: int = 4
    loop_overhead: int = 3  # cycles to enter/leave a non-pipelined loop iteration (block walk)
    launch_overhead_s: float = 20e-6  # XRT run start, query upload and result read-back per launch (assumed)

    @property
    def words_per_cycle(self) -> float:
        """512-bit beats a bank delivers per kernel cycle (< 1: a wide burst is bank-bound at 300 MHz)."""
        return min(1.0, self.bank_bytes_per_s / self.clock_hz / self.word_bytes)


def _entry_postings(sh, ent: np.ndarray, s0: np.ndarray, s1: np.ndarray):
    """Every posting of the given entries: (entry number, position in the entry's postings, posting word)."""
    n = s1 - s0
    total = int(n.sum())
    which = np.repeat(np.arange(ent.size), n)
    first = np.concatenate([[0], np.cumsum(n)[:-1]])
    pos = np.arange(total, dtype=np.int64) - first[which]
    return which, pos, np.asarray(sh.postings, dtype=np.uint32)[s0[which] + pos].astype(np.int64)


def _shard_counts(index: IndexReader, sh, q: QueryTerms, k: int, block_bits: int) -> np.ndarray:
    c = np.zeros(NUM_STATS, dtype=np.int64)
    t_ids = q.term_ids.astype(np.int64)
    nterms = t_ids.size
    nblocks = sh.block_end - sh.block_start
    c[S["terms"]] = nterms
    c[S["block_loop"]] = nblocks
    c[S["scan"]] = nblocks * nterms
    if nterms == 0:
        return c
    e0 = np.asarray(sh.term_ptr[t_ids], dtype=np.int64)
    e1 = np.asarray(sh.term_ptr[t_ids + 1], dtype=np.int64)
    n_ent = e1 - e0
    c[S["table_reads"]] = 2 * nterms + 2 * int(np.count_nonzero(n_ent))
    if not n_ent.any():
        return c
    ent = np.concatenate([np.arange(a, b) for a, b in zip(e0, e1) if b > a])
    s0 = np.asarray(sh.blk_start[ent], dtype=np.int64)
    s1 = np.asarray(sh.blk_start[ent + 1], dtype=np.int64)
    blk = np.asarray(sh.blk_id[ent], dtype=np.int64)
    blocks = np.unique(blk)
    first_doc = blocks << block_bits
    block_docs = np.minimum(sh.doc_end - first_doc, 1 << block_bits)
    c[S["blocks"]] = blocks.size
    c[S["norm_words"]] = int(((block_docs + NORMS_PER_WORD - 1) // NORMS_PER_WORD).sum())
    c[S["entries"]] = ent.size
    c[S["entry_reads"]] = ent.size + int((n_ent[n_ent > 0] - 1).sum())
    full = s1 > s0
    words = np.where(full, (s1 - 1) // POSTINGS_PER_WORD - s0 // POSTINGS_PER_WORD + 1, 0)
    c[S["posting_words"]] = int(words.sum())
    chunks = -(-words // CHUNK_BEATS)
    c[S["chunks"]] = int(chunks.sum())
    npost = int((s1 - s0).sum())
    c[S["postings"]] = c[S["scored"]] = npost
    # A block's terms after its first wait for the accumulators (entries with postings only).
    per_block = np.bincount(np.searchsorted(blocks, blk[full]), minlength=blocks.size)
    c[S["lane_stalls"]] = ACC_GAP * int(np.maximum(per_block - 1, 0).sum())
    which, pos, p = _entry_postings(sh, ent, s0, s1)
    local = p >> index.tf_bits
    # Rounds: per chunk (CHUNK_BEATS beats of one entry, counted from the entry's first beat), its busiest lane.
    chunk_first = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    beat = (s0[which] + pos) // POSTINGS_PER_WORD - s0[which] // POSTINGS_PER_WORD
    chunk = chunk_first[which] + beat // CHUNK_BEATS
    lane_load = np.bincount(chunk * LANES + (local & (LANES - 1)), minlength=int(chunks.sum()) * LANES)
    c[S["rounds"]] = int(lane_load.reshape(-1, LANES).max(axis=1).sum())
    # Docs with at least one query term, marked in the shard's doc range (a sort-free distinct count: np.unique
    # of a 21M-doc index's postings took seconds a query); the flush offers the 64-doc rows holding one.
    span = (sh.block_end - sh.block_start) << block_bits
    seen = np.zeros(span, dtype=np.bool_)
    seen[(blk[which] << block_bits) - sh.doc_start + local] = True
    ncand = int(np.count_nonzero(seen))
    c[S["candidates"]] = ncand
    c[S["cand_rows"]] = int(np.count_nonzero(seen.reshape(-1, NORMS_PER_WORD).any(axis=1)))
    # A block's norms load while the previous visited block is flushed (as many rows as it had norm words).
    nw = (block_docs + NORMS_PER_WORD - 1) // NORMS_PER_WORD
    c[S["norm_flush"]] = int(np.maximum(nw, np.concatenate([[0], nw[:-1]])).sum() + nw[-1])
    c[S["inserts"]] = round(expected_inserts(ncand, k))
    c[S["results"]] = min(k, ncand)
    return c


def predict_counts(index: IndexReader, queries: list[QueryTerms], k: int) -> np.ndarray:
    """Kernel counters per query and shard, ``[n_queries, n_shards, NUM_STATS]``; ``inserts`` is an expectation."""
    block_bits = index.block_size.bit_length() - 1
    out = np.zeros((len(queries), len(index.shards), NUM_STATS), dtype=np.int64)
    for j, sh in enumerate(index.shards):
        for i, q in enumerate(queries):
            out[i, j] = _shard_counts(index, sh, q, k, block_bits)
    return out


def stage_cycles(counts: np.ndarray, p: KernelParams = KernelParams()) -> dict[str, np.ndarray]:
    """Cycles of each dataflow process for the given counters (any leading shape, last axis NUM_STATS)."""
    c = {name: counts[..., i].astype(np.float64) for i, name in enumerate(STAT_NAMES)}
    L = p.mem_latency
    bank_bound = 1.0 / p.words_per_cycle
    active = (c["terms"] > 0).astype(np.float64)
    planner = (active * (L + 2 * L)  # q_off, then the dependent term_ptr -> blk_id/blk_start reads
               + 4 * c["terms"]  # term setup: 4 table reads per term on one port, II=4
               + p.loop_overhead * c["block_loop"] + c["scan"]  # block walk, on-chip term scan at II=1
               + c["blocks"] * L + 2 * c["entries"])  # per visited block a pipelined entry loop at II=2
    # Per visited block: the norm burst and the posting-beat loop each wait one latency for their first beat,
    # then read one beat a cycle as far as the bank delivers; the loop's last iteration takes the end command.
    reader = (c["blocks"] * (2 * L + p.depth_read + 1 + p.loop_overhead)
              + (c["norm_words"] + c["posting_words"]) * bank_bound)
    lanes = (c["norm_flush"] + c["rounds"] + c["lane_stalls"]  # norm load / flush rows, then a round a cycle
             + c["blocks"] * (p.depth_score + p.depth_acc + 1 + p.loop_overhead) + active * p.depth_flush)
    topk = c["cand_rows"] + c["inserts"] + active * p.depth_topk + c["results"]
    writer = c["results"] + NUM_STATS
    return {"planner": planner, "reader": reader, "lanes": lanes, "topk": topk, "writer": writer}


def kernel_cycles(counts: np.ndarray, p: KernelParams = KernelParams()) -> tuple[np.ndarray, np.ndarray]:
    """(estimate, serial bound) per query and shard. The processes run concurrently, decoupled by FIFOs, so the
    estimate is the slowest process plus the pipeline fill; the bound assumes no overlap at all."""
    st = stage_cycles(counts, p)
    fill = p.depth_read + p.depth_score + p.depth_acc + p.depth_flush + p.depth_topk
    estimate = np.maximum.reduce(list(st.values())) + fill
    serial = sum(st.values())
    return estimate, serial


def launch_seconds(per_query_cycles: np.ndarray, batch: int, p: KernelParams = KernelParams()) -> np.ndarray:
    """Seconds of each launch: queries ``[n, n_shards]`` in launches of ``batch``; all CUs (one per shard) run at
    once, so a launch lasts as long as its slowest CU, plus the fixed launch overhead and the cache load."""
    n = per_query_cycles.shape[0]
    out = []
    for first in range(0, n, batch):
        cu = per_query_cycles[first:first + batch].sum(axis=0) + CACHE_SIZE
        out.append(p.launch_overhead_s + float(cu.max()) / p.clock_hz)
    return np.asarray(out)


def hbm_bytes(counts: np.ndarray, k: int, p: KernelParams = KernelParams()) -> np.ndarray:
    """Bytes each query moves through its shard's bank (reads and the result write-back)."""
    c = {name: counts[..., i].astype(np.float64) for i, name in enumerate(STAT_NAMES)}
    words = (c["posting_words"] + c["norm_words"]) * p.word_bytes
    narrow = 4 * (c["table_reads"] + c["entry_reads"] + 2 * c["terms"] + 2)
    return words + narrow + 8 * c["results"] + 4 * NUM_STATS


def bank_utilisation(counts: np.ndarray, k: int, p: KernelParams = KernelParams()) -> np.ndarray:
    """Per shard (= CU = pseudo-channel): the bytes its queries move over the time its CU runs them, as a share
    of the channel's bandwidth (``counts`` is ``[n_queries, n_shards, NUM_STATS]``)."""
    est, _ = kernel_cycles(counts, p)
    seconds = est.sum(axis=0) / p.clock_hz
    return hbm_bytes(counts, k, p).sum(axis=0) / np.maximum(seconds, 1e-12) / p.bank_bytes_per_s


# ---- statistics of a corpus too large to index here ----------------------------------------------------------------
# Lane loads of a chunk when a term's postings are spread uniformly over the docids (each doc holds the term with
# probability p, independently): the gaps between its docids are geometric, the lane is docid % LANES.

_ROUND_P = np.geomspace(1e-6, 1.0, 61)
_ROUND_M = POSTINGS_PER_WORD * CHUNK_BEATS


def _rounds_table(trials: int = 96, seed: int = 0) -> np.ndarray:
    """[len(_ROUND_P), _ROUND_M + 1]: the expected postings of the busiest lane among the first m of a chunk."""
    rng = np.random.default_rng(seed)
    out = np.zeros((_ROUND_P.size, _ROUND_M + 1))
    for i, pr in enumerate(_ROUND_P):
        gaps = rng.geometric(pr, size=(trials, _ROUND_M))
        lane = (rng.integers(0, LANES, size=(trials, 1)) + np.cumsum(gaps, axis=1)) % LANES
        loads = np.cumsum(lane[..., None] == np.arange(LANES), axis=1)  # [trials, m, lanes]
        out[i, 1:] = loads.max(axis=2).mean(axis=0)
    return out


_TABLE: list[np.ndarray] = []


def expected_rounds(p: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Expected lane rounds of a chunk of ``m`` postings (m <= one chunk, fractional allowed) of a term of
    document frequency ``p`` (per doc)."""
    if not _TABLE:
        _TABLE.append(_rounds_table())
    t = _TABLE[0]
    lp = np.interp(np.log(np.clip(p, _ROUND_P[0], 1.0)), np.log(_ROUND_P), np.arange(_ROUND_P.size))
    m = np.clip(m, 0.0, _ROUND_M)
    i0 = np.minimum(np.floor(lp).astype(int), _ROUND_P.size - 2)
    m0 = np.minimum(np.floor(m).astype(int), _ROUND_M - 1)
    fp, fm = lp - i0, m - m0
    row = lambda i: t[i, m0] * (1 - fm) + t[i, m0 + 1] * fm  # noqa: E731
    return row(i0) * (1 - fp) + row(i0 + 1) * fp


# ---- attn_topk (hls_bm25/attn_topk.cpp): sparse attention's inner product + reduction + top-k --------------------
# Counters of the kernel as written (the C simulation reports them; tests compare), cycles of that design, and a
# scaled design's time per decode step: keys resident in BRAM/URAM or streamed from HBM (the seeds' Figure 7).
# Every time here is MODELLED.

ATTN_STATS = ("key_words", "dots", "units", "candidates", "inserts", "results")
ATTN_PREDICTED = tuple(n for n in ATTN_STATS if n != "inserts")
ATTN_WORD_LANES = 16


def attn_counts(mode: str, rows: int, heads: int, dim: int, num_keys: int, unit: int, mid_start: int,
                mid_end: int, k: int) -> np.ndarray:
    """The kernel's counters for one launch, ``[rows, len(ATTN_STATS)]``; ``inserts`` (order dependent) is 0."""
    words = -(-dim // ATTN_WORD_LANES) * num_keys * (2 if mode == "bounds_max" else 1)
    cands = mid_end - mid_start if k > 0 else 0
    row = [words, num_keys * heads, -(-num_keys // unit), cands, 0, min(k, cands)]
    return np.tile(np.asarray(row, dtype=np.int64), (rows, 1))


def expected_inserts(candidates: float, k: float) -> float:
    """Insertions into a running top-k of candidates in random order: sum_i min(1, k / i) = k (1 + H_n - H_k)
    (scores in token order are not random: a recency trend raises it, a decaying one lowers it)."""
    if candidates <= k:
        return float(candidates)
    return k * (1.0 + math.log(candidates / k))


def attn_kernel_cycles(counts: np.ndarray, heads: int, dim: int, p: KernelParams = KernelParams()) -> float:
    """Cycles of one launch of the kernel as written: one engine of ``dim`` lanes (one head per cycle), the
    key words of each key gathered before its heads run, one candidate per cycle into the top-k."""
    c = {name: counts[..., i].astype(np.float64) for i, name in enumerate(ATTN_STATS)}
    words_per_key = -(-dim // ATTN_WORD_LANES)
    keys = c["dots"] / heads
    reader = c["key_words"] / p.words_per_cycle
    scorer = keys * (words_per_key + heads) + 2 * math.ceil(math.log2(max(dim, 2))) + 8
    select = keys + c["results"] + p.depth_topk
    writer = c["units"] + c["results"] + len(ATTN_STATS)
    return float(np.maximum.reduce([reader, scorer, select, writer]).sum() + p.mem_latency)


@dataclass(frozen=True)
class AttnDesign:
    """A scaled attn_topk on a U55C, for one decode step (assumptions, not synthesis results)."""

    clock_hz: float = 300e6
    dsp: int = 9024  # the U55C's DSP48E2 slices
    dsp_share: float = 0.8  # of them given to the inner-product engines
    macs_per_dsp: tuple = ((1, 2.0), (2, 0.5), (4, 0.25))  # per cycle, by key bytes: int8/fp8 packed, bf16, f32
    hbm_bytes_per_s: float = 460e9  # all 32 pseudo-channels
    hbm_bytes: float = 16e9  # the card's HBM2 capacity
    onchip_bytes: float = 40e6  # BRAM + URAM that can hold keys
    onchip_bytes_per_s: float = 21.8e12
    filter_lanes: int = 16  # candidates compared with the running k-th score per cycle, before the insert network
    launch_s: float = 10e-6  # start, query upload and the indices' read-back over PCIe

    def macs_per_s(self, key_bytes: int) -> float:
        return self.dsp * self.dsp_share * dict(self.macs_per_dsp)[key_bytes] * self.clock_hz


@dataclass(frozen=True)
class StepShape:
    """One decode step's shapes (the H200 benchmark's: 32 query heads, 8 KV heads, head dim 128, bf16 keys;
    DSA as DeepSeek-V3.2: 64 index heads x 128, fp8 index keys, 2048 tokens)."""

    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    key_bytes: int = 2
    index_heads: int = 64
    index_dim: int = 128
    index_bytes: int = 1
    dsa_k: int = 2048
    page: int = 16
    block: int = 64
    budget: int = 2048


def attn_step_model(method: str, context: int, batch: int = 1, s: StepShape = StepShape(),
                    d: AttnDesign = AttnDesign()) -> dict:
    """MODELLED memory-processing time (relevancy + retrieval on the FPGA) of one decode step of one layer."""
    n = context
    if method == "dsa":
        rows, units, dim, kb = 1, n, s.index_dim, s.index_bytes
        scanned, macs, k = n * s.index_dim * kb, n * s.index_heads * s.index_dim, s.dsa_k
    elif method in ("quest", "lserve", "seer-topk"):
        unit = s.block if method == "seer-topk" else s.page
        rows, dim, kb = s.kv_heads, s.head_dim, s.key_bytes
        units = -(-n // unit)
        keys = units * (2 if method == "quest" else 1) if method != "lserve" else n
        scanned = rows * keys * dim * kb
        macs = rows * (keys if method != "quest" else units * 2) * (s.q_heads // s.kv_heads) * dim
        k = max(1, s.budget // unit)
    else:
        raise ValueError(f"no FPGA model for {method!r}")
    scanned, macs, units = scanned * batch, macs * batch, units * rows * batch
    resident = scanned <= d.onchip_bytes
    bw = d.onchip_bytes_per_s if resident else d.hbm_bytes_per_s
    t_read = scanned / bw
    t_compute = macs / d.macs_per_s(kb)
    per_row = units / (rows * batch)
    t_select = (units / d.filter_lanes + rows * batch * expected_inserts(per_row, k)) / d.clock_hz
    t = max(t_read, t_compute, t_select) + d.launch_s
    return {"method": method, "context": n, "batch": batch, "bytes": scanned, "resident": resident,
            "fits": scanned <= d.hbm_bytes,
            "read_s": t_read, "compute_s": t_compute, "select_s": t_select, "seconds": t,
            "bound": max(("read", t_read), ("compute", t_compute), ("select", t_select), key=lambda x: x[1])[0]}
