"""Host side of the ``bm25_topk`` FPGA kernel (``hls_bm25/``), shared by the ``fpga`` (``xrt/``: pyxrt) and
``fpga-sim`` (``csim/``: the kernel's C simulation as a shared library) backends: shard images, query packing,
batching and the merge of the per-shard top-k lists.

One compute unit serves one shard, whose arrays live in that CU's HBM bank. The kernel returns each shard's
exact top-k (score desc, docid asc); the exact global top-k is the best k of their union.
"""
from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np

from indexer.reader import IndexReader
from indexer import bm25
from indexer.bm25 import QueryTerms
from ragserve.kernels.contract import Backend, StageTimes, SearchError, TopK

# Mirrors hls_bm25/bm25_topk.h.
MAX_K = 1024
MAX_TERMS = 1024
MIN_BLOCK_BITS = 6
MAX_BLOCK_BITS = 18
CACHE_SIZE = 256
WORD_BYTES = 64  # one 512-bit HBM beat
LANES = 16  # postings scored a cycle by a CU; lane = docid % LANES
CHUNK_BEATS = 32  # posting beats of one entry handed to the lanes at once
ACC_GAP = 12  # cycles the lanes wait between two terms of a block
STAT_NAMES = ("terms", "table_reads", "block_loop", "scan", "blocks", "norm_words", "entries", "entry_reads",
              "posting_words", "postings", "chunks", "norm_flush", "rounds", "lane_stalls", "scored", "candidates",
              "cand_rows", "inserts", "results")
NUM_STATS = len(STAT_NAMES)
DEFAULT_BATCH = 32


class FpgaUnavailableError(SearchError):
    """The FPGA backend cannot run here (no XRT, no xclbin, no card, or an index the kernel cannot take)."""


def aligned_padded(data: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A 64-byte-aligned copy of ``data`` zero-padded to whole 512-bit words, as placed in an HBM bank."""
    data = np.asarray(data, dtype=dtype)
    nbytes = max(WORD_BYTES, -(-data.nbytes // WORD_BYTES) * WORD_BYTES)
    raw = np.zeros(nbytes + WORD_BYTES, dtype=np.uint8)
    shift = (-raw.ctypes.data) % WORD_BYTES
    out = raw[shift:shift + nbytes].view(dtype)
    out[:data.size] = data
    return out


@dataclass
class ShardImage:
    """One shard's arrays as the kernel reads them from its bank, plus its scalar arguments."""

    index: int
    doc_start: int
    doc_end: int
    block_start: int
    block_end: int
    postings: np.ndarray  # u32, padded to whole words
    norms: np.ndarray  # u8, the shard's slice of norms.u8, padded to whole words
    term_ptr: np.ndarray  # u32
    blk_id: np.ndarray  # u32
    blk_start: np.ndarray  # u32

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The bank-resident arguments in kernel argument order."""
        return self.postings, self.norms, self.term_ptr, self.blk_id, self.blk_start


def block_bits_of(index: IndexReader) -> int:
    bs = index.block_size
    bits = bs.bit_length() - 1
    if bs != 1 << bits:
        raise FpgaUnavailableError(f"block_size {bs} is not a power of two")
    if not MIN_BLOCK_BITS <= bits <= MAX_BLOCK_BITS:
        raise FpgaUnavailableError(f"the FPGA kernel takes doc blocks of {1 << MIN_BLOCK_BITS} to {1 << MAX_BLOCK_BITS} "
                                   f"docs; this index has block_size {bs} (rebuild it with another --block-size)")
    return bits


def shard_images(index: IndexReader) -> list[ShardImage]:
    bits = block_bits_of(index)
    norms = np.asarray(index.norms)
    out = []
    for sh in index.shards:
        if sh.doc_start != sh.block_start << bits:
            raise FpgaUnavailableError(f"shard {sh.index} does not start on a doc block boundary")
        out.append(ShardImage(
            index=sh.index, doc_start=sh.doc_start, doc_end=sh.doc_end, block_start=sh.block_start,
            block_end=sh.block_end,
            postings=aligned_padded(sh.postings, np.uint32),
            norms=aligned_padded(norms[sh.doc_start:sh.doc_end], np.uint8),
            term_ptr=aligned_padded(sh.term_ptr, np.uint32),
            blk_id=aligned_padded(sh.blk_id, np.uint32),
            blk_start=aligned_padded(sh.blk_start, np.uint32)))
    return out


@dataclass
class QueryBatch:
    """The query buffers of one launch (the same for every CU)."""

    cache: np.ndarray  # f32[256]
    q_off: np.ndarray  # u32[n + 1]
    q_terms: np.ndarray  # u32, ascending within each query
    q_weights: np.ndarray  # f32
    k: int

    @property
    def num_queries(self) -> int:
        return int(self.q_off.size - 1)


def pack_batch(queries: list[QueryTerms], cache: np.ndarray, k: int) -> QueryBatch:
    sizes = [len(q) for q in queries]
    if any(s > MAX_TERMS for s in sizes):
        raise SearchError(f"a query has {max(sizes)} distinct terms; the FPGA kernel takes at most {MAX_TERMS}")
    for q in queries:
        if q.term_ids.size > 1 and not np.all(np.diff(q.term_ids.astype(np.int64)) > 0):
            raise SearchError("query terms must be distinct and ascending by term id (the summation order)")
    q_off = np.zeros(len(queries) + 1, dtype=np.uint32)
    q_off[1:] = np.cumsum(sizes)
    # One spare element keeps every buffer non-empty (a launch of term-less queries still has valid pointers).
    terms = np.concatenate([q.term_ids.astype(np.uint32) for q in queries] + [np.zeros(1, np.uint32)])
    weights = np.concatenate([q.weights.astype(np.float32) for q in queries] + [np.zeros(1, np.float32)])
    return QueryBatch(cache=np.ascontiguousarray(cache, dtype=np.float32), q_off=q_off, q_terms=terms,
                      q_weights=weights, k=int(k))


@dataclass
class LaunchResult:
    """What one CU wrote back for one launch."""

    docids: np.ndarray  # u32[n, k]
    scores: np.ndarray  # f32[n, k]
    counts: np.ndarray  # u32[n]
    stats: np.ndarray  # u32[n, NUM_STATS]

    @classmethod
    def empty(cls, n: int, k: int) -> "LaunchResult":
        return cls(docids=np.zeros((n, k), np.uint32), scores=np.zeros((n, k), np.float32),
                   counts=np.zeros(n, np.uint32), stats=np.zeros((n, NUM_STATS), np.uint32))


def merge_shards(results: list[LaunchResult], k: int) -> list[TopK]:
    """The best k of the per-shard top-k lists of each query (score desc, docid asc).

    Each hit becomes one u64 sort key, (~score bits) << 32 | docid: the bits of a non-negative f32 order like its
    value, so ascending keys are descending scores with ties on the smaller docid. Empty slots get the largest key.
    """
    keys = []
    for r in results:
        bits = (np.uint64(0xFFFFFFFF) - r.scores.view(np.uint32).astype(np.uint64)) << np.uint64(32)
        key = bits | r.docids.astype(np.uint64)
        key[np.arange(k)[None, :] >= r.counts[:, None]] = np.uint64(0xFFFFFFFFFFFFFFFF)
        keys.append(key)
    top = np.sort(np.concatenate(keys, axis=1), axis=1)[:, :k]
    found = np.minimum(sum(r.counts.astype(np.int64) for r in results), k)
    out = []
    for q, n in enumerate(found.tolist()):
        key = top[q, :n]
        scores = (np.uint64(0xFFFFFFFF) - (key >> np.uint64(32))).astype(np.uint32).view(np.float32)
        out.append(TopK(docids=(key & np.uint64(0xFFFFFFFF)).astype(np.int64), scores=scores))
    return out


class FpgaHostBackend(Backend):
    """Batches queries, launches one kernel run per shard for each batch and merges: ``launch`` is the device."""

    max_k = MAX_K  # the kernel's on-chip top-k (hls_bm25/bm25_topk.h)

    def __init__(self, index: IndexReader, batch_size: int = DEFAULT_BATCH, **options) -> None:
        super().__init__(index)
        if unknown := set(options) - self.accepted_options():
            raise SearchError(f"unknown option(s) for backend {self.name}: {', '.join(sorted(unknown))}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise SearchError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self.block_bits = block_bits_of(index)
        self.tf_bits = index.tf_bits
        self.shards = shard_images(index)
        self.last_stats: np.ndarray = np.zeros((0, len(self.shards), NUM_STATS), np.uint32)

    @classmethod
    def accepted_options(cls) -> set[str]:
        return set()

    @abstractmethod
    def launch(self, batch: QueryBatch) -> list[LaunchResult]:
        """Run the batch on every shard's CU; one result per shard, in shard order."""

    def scalar_args(self, batch: QueryBatch, shard: ShardImage) -> tuple[int, ...]:
        """The kernel's scalar arguments after the buffers, in argument order."""
        return (batch.num_queries, batch.k, shard.block_start, shard.block_end, shard.doc_start, shard.doc_end,
                self.block_bits, self.tf_bits)

    def search_terms(self, queries: list[QueryTerms], k: int, k1: float, b: float,
                     times: StageTimes | None = None, avgdl: float | None = None) -> list[TopK]:
        if not 1 <= k <= MAX_K:
            raise SearchError(f"the FPGA kernel returns at most k={MAX_K} hits per launch, got k={k}")
        cache = bm25.norm_cache(k1, b, self.index.avgdl if avgdl is None else avgdl)
        out: list[TopK] = []
        stats = []
        t_launch = t_merge = 0.0
        for first in range(0, len(queries), self.batch_size):
            batch = pack_batch(queries[first:first + self.batch_size], cache, k)
            t0 = time.perf_counter()
            results = self.launch(batch)
            t1 = time.perf_counter()
            out.extend(merge_shards(results, k))
            t_merge += time.perf_counter() - t1
            t_launch += t1 - t0
            stats.append(np.stack([r.stats for r in results], axis=1))
        self.last_stats = np.concatenate(stats) if stats else np.zeros((0, len(self.shards), NUM_STATS), np.uint32)
        if times is not None:
            times.relevancy += t_launch
            times.retrieval += t_merge
        return out

    def describe(self) -> dict:
        return {"backend": self.name, "shards": len(self.shards), "batch_size": self.batch_size,
                "block_size": 1 << self.block_bits}
