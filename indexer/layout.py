"""Constants of the index layout (``indexer/FORMAT.md``): file names, dtypes, defaults, packing."""
from __future__ import annotations

import numpy as np

FORMAT_NAME = "ragserve-bm25"
FORMAT_VERSION = 1

DEFAULT_BLOCK_SIZE = 1 << 18  # docs per accumulator block: 2 MiB of f64 accumulators, fits URAM
DEFAULT_BANK_BYTES = 512 << 20  # one Alveo U55C HBM pseudo-channel (16 GiB / 32)
ACCUMULATOR_BYTES_PER_DOC = 8  # f64 accumulators
FIELD_SEPARATOR = "\x1f"  # between title and text in store.bin

MANIFEST = "manifest.json"
DENSE_DIR = "dense"  # an index's dense part (passage embeddings, faiss index: ragserve/retrieval/dense.py)
DENSE_BATCHING = "token-count"  # how a dense part's passages were batched (ragserve.retrieval.embedder.Embedder)
NORMS = "norms.u8"
DF = "df.u32"
VOCAB_BYTES, VOCAB_OFFSETS = "vocab.bin", "vocab.u64"
DOCIDS_BYTES, DOCIDS_OFFSETS = "docids.bin", "docids.u64"
STORE_BYTES, STORE_OFFSETS = "store.bin", "store.u64"

# Per-shard arrays (relative to the shard directory).
POSTINGS = "postings.u32"
TERM_PTR = "term_ptr.u32"
BLK_ID = "blk_id.u32"
BLK_START = "blk_start.u32"
BLK_MAXQ = "blk_maxq.f32"
BLK_MAXTF = "blk_maxtf.u32"
BLK_MINNORM = "blk_minnorm.u8"
SHARD_FILES = (POSTINGS, TERM_PTR, BLK_ID, BLK_START, BLK_MAXQ, BLK_MAXTF, BLK_MINNORM)
# Fine bounds (FORMAT.md, "Fine bounds"): an addition for CPU dynamic pruning, not part of a shard's bank image.
DEFAULT_FINE_BLOCK = 128  # postings per fine block, as Lucene's impacts and PISA's block-max lists
FINE_PTR = "fine_ptr.u32"
FINE_MAXQ = "fine_maxq.f32"
FINE_LAST = "fine_last.u32"
FINE_FILES = (FINE_PTR, FINE_MAXQ, FINE_LAST)

DTYPES = {"u8": np.uint8, "u32": np.uint32, "u64": np.uint64, "f32": np.float32}


def dtype_of(filename: str) -> np.dtype:
    """The dtype a layout file's suffix names (``.u32`` -> little-endian uint32)."""
    return np.dtype(DTYPES[filename.rsplit(".", 1)[1]]).newbyteorder("<")


def shard_dirname(i: int) -> str:
    return f"shard_{i:04d}"


def tf_bits_for(max_tf: int) -> int:
    return max(1, int(max_tf).bit_length())


def shard_bytes(postings: int, entries: int, vocab_size: int, docs: int) -> int:
    """Bytes one shard occupies in its HBM bank (FORMAT.md, 'Shard size')."""
    return 4 * postings + 4 * (vocab_size + 1) + 4 * entries + 4 * (entries + 1) + 4 * entries + 4 * entries + entries + docs


def unpack_postings(packed: np.ndarray, tf_bits: int) -> tuple[np.ndarray, np.ndarray]:
    packed = np.asarray(packed, dtype=np.uint32)
    return packed >> np.uint32(tf_bits), packed & np.uint32((1 << tf_bits) - 1)
