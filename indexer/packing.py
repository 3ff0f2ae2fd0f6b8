"""The layout stage of a build: the ingested runs -> the files of ``indexer/FORMAT.md``.

Term ids are re-assigned in sorted-term order (the vocabulary), doc blocks are grouped into shards that each fit
one bank, and each shard's runs are counting-sorted into its packed postings and block tables. Files are hashed
for the manifest while the layout goes on (``indexer.files.Checksums``).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from numba import njit
from tqdm import tqdm

from indexer import layout as L
from indexer.analyzer import Analyzer
from indexer.bm25 import avgdl_f32, norm_cache
from indexer.bounds import fine_bounds
from indexer.files import Checksums
from indexer.ingest import Ingest, Run
from indexer.norms import LENGTH_TABLE, encode_lengths
from indexer.options import BuildError, BuildOptions


def _effective_block_size(requested: int, max_tf: int) -> tuple[int, int]:
    tf_bits = L.tf_bits_for(max_tf)
    block_bits = 32 - tf_bits
    return min(requested, 1 << block_bits), tf_bits


@dataclass
class ShardJob:
    """One shard to write: its directory, its runs (files the writer must see) and its block entries."""

    index: int
    dir: Path
    runs: list[Run]
    entries: int


@dataclass
class ShardInputs:
    """What the writing of every shard shares: final term ids, norms, the norm cache and the packing."""

    remap: np.ndarray
    norms: np.ndarray
    cache: np.ndarray
    log2_bs: int
    tf_bits: int
    fine_block: int = L.DEFAULT_FINE_BLOCK


def write_shard_job(job: ShardJob, inputs: ShardInputs) -> tuple[int, int, int, dict[str, str]]:
    """Write one shard's files wherever this runs (a ``shard_writer`` calls it); (postings, block entries, fine
    blocks, SHA-256 of each file by its name in the shard directory)."""
    job.dir.mkdir()
    with Checksums(job.dir) as sums, ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(Run.load, job.runs))
        P, E, F = write_shard(job.dir, parts, inputs.remap, job.entries, inputs.log2_bs, inputs.tf_bits,
                              inputs.norms, inputs.cache, pool, sums, inputs.fine_block)
        return int(P), int(E), int(F), {name: meta["sha256"] for name, meta in sums.files().items()}


def write_layout(ing: Ingest, tmp: Path, opts: BuildOptions, analyzer: Analyzer, source: dict, t_start: float,
                 shard_writer: Callable[[list[ShardJob], ShardInputs], Iterable[tuple]] | None = None) -> dict:
    n = ing.num_docs
    block_size, tf_bits = _effective_block_size(opts.block_size, ing.max_tf)
    if block_size != opts.block_size:
        raise BuildError(f"max term frequency {ing.max_tf} needs {tf_bits} bits; doc blocks must be at most "
                         f"{block_size} docs (pass --block-size {block_size})")
    with Checksums(tmp) as sums, ThreadPoolExecutor(2) as pool:
        for name in (L.STORE_BYTES, L.STORE_OFFSETS, L.DOCIDS_BYTES, L.DOCIDS_OFFSETS):
            sums.add(tmp / name)
        lengths = ing.lengths.view
        norms = encode_lengths(lengths)
        sums.write(tmp / L.NORMS, norms)
        doc_count = int((lengths > 0).sum())
        avgdl = avgdl_f32(ing.sum_total_tf, doc_count)
        cache = norm_cache(opts.k1, opts.b, avgdl)
        num_blocks = (n + block_size - 1) // block_size
        bp = ing.block_postings + [0] * (num_blocks - len(ing.block_postings))
        be = ing.block_entries + [0] * (num_blocks - len(ing.block_entries))
        shards = _plan_shards(bp, be, len(ing.vocab), n, block_size, opts.bank_bytes)
        jobs = [ShardJob(si, tmp / L.shard_dirname(si), [run for run in ing.runs if b0 <= run.block < b1],
                         sum(be[b0:b1])) for si, (b0, b1) in enumerate(shards)]
        # The next shard's runs are read by the pool (file reads release the GIL) while this thread works.
        loads = [[pool.submit(run.load) for run in job.runs] for job in jobs[:1] if shard_writer is None]
        remap = _write_vocab(ing, sums)
        V = remap.size

        log2_bs = block_size.bit_length() - 1
        if shard_writer is not None:
            written = iter(shard_writer(jobs, ShardInputs(remap, norms, cache, log2_bs, tf_bits, opts.fine_block)))
        shard_meta = []
        for job, (b0, b1) in zip(tqdm(jobs, desc="writing shards", disable=not opts.progress), shards):
            d = job.dir
            if shard_writer is not None:
                P, E, F, hashes = next(written)
                for name, sha in hashes.items():
                    sums.record(d / name, sha)
            else:
                d.mkdir()
                parts = [f.result() for f in loads.pop()]
                if job.index + 1 < len(jobs):
                    loads.append([pool.submit(run.load) for run in jobs[job.index + 1].runs])
                P, E, F = write_shard(d, parts, remap, job.entries, log2_bs, tf_bits, norms, cache, pool, sums,
                                      opts.fine_block)
                del parts
            doc_start, doc_end = b0 * block_size, min(b1 * block_size, n)
            shard_meta.append({"dir": d.name, "doc_start": doc_start, "doc_end": doc_end, "block_start": b0,
                               "block_end": b1, "postings": int(P), "entries": int(E), "fine_blocks": int(F),
                               "bytes": L.shard_bytes(P, E, V, doc_end - doc_start)})
        shutil.rmtree(tmp / "_runs")
        files = sums.files()
    manifest = {
        "format": L.FORMAT_NAME,
        "version": L.FORMAT_VERSION,
        "analyzer": analyzer.config_dict(),
        "bm25": {"k1": opts.k1, "b": opts.b},
        "stats": {"num_docs": n, "doc_count": doc_count, "sum_total_tf": int(ing.sum_total_tf),
                  "avgdl": float(avgdl), "vocab_size": V, "num_postings": int(sum(bp)), "max_tf": int(ing.max_tf),
                  "empty_docs": int(n - doc_count)},
        "layout": {"block_size": block_size, "block_bits": 32 - tf_bits, "tf_bits": tf_bits,
                   "bank_bytes": opts.bank_bytes, "accumulator_bytes": block_size * L.ACCUMULATOR_BYTES_PER_DOC,
                   "num_blocks": num_blocks, "num_shards": len(shard_meta), "fine_block": opts.fine_block,
                   "length_table": [int(x) for x in LENGTH_TABLE]},
        "shards": shard_meta,
        "files": files,
        "source": source,
        "build_seconds": round(time.time() - t_start, 3),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "builder": f"ragserve {_builder_version()}",
    }
    with open(tmp / L.MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return manifest


def _write_vocab(ing: Ingest, sums: Checksums) -> np.ndarray:
    """Write vocab.bin/.u64 and df.u32; returns the final term id of each provisional one. Final term ids are
    ranks in sorted order (code point order == UTF-8 byte order)."""
    terms = list(ing.vocab)
    order = sorted(range(len(terms)), key=terms.__getitem__)
    V = len(terms)
    remap = np.empty(V, dtype=np.int64)
    remap[np.asarray(order, dtype=np.int64)] = np.arange(V, dtype=np.int64)
    # Encoded in one go with a newline after each term (no term holds one: UAX#29 breaks words at newlines),
    # which then gives the offsets and is dropped.
    lines = np.frombuffer("\n".join([terms[i] for i in order] + [""]).encode("utf-8"), dtype=np.uint8)
    newline = lines == ord("\n")
    ends = np.flatnonzero(newline)
    if ends.size != V:
        raise BuildError("a term holds a newline")
    voff = np.zeros(V + 1, dtype=np.uint64)
    voff[1:] = ends - np.arange(V)
    sums.write(sums.root / L.VOCAB_BYTES, lines[~newline])
    sums.write(sums.root / L.VOCAB_OFFSETS, voff)
    df = np.zeros(V, dtype=np.uint32)
    df[remap] = ing.term_stats.view[:, 0]
    sums.write(sums.root / L.DF, df)
    return remap


def _plan_shards(bp: list[int], be: list[int], V: int, n: int, block_size: int, bank_bytes: int) -> list[tuple[int, int]]:
    """Shards as (first block, end block): consecutive blocks, greedily, while the shard fits one bank."""
    shards: list[tuple[int, int]] = []
    cur_start, cur_p, cur_e = 0, 0, 0
    for blk in range(len(bp)):
        docs_in = min((blk + 1) * block_size, n) - cur_start * block_size
        size = L.shard_bytes(cur_p + bp[blk], cur_e + be[blk], V, docs_in)
        if blk > cur_start and size > bank_bytes:
            shards.append((cur_start, blk))
            cur_start, cur_p, cur_e = blk, 0, 0
        one = L.shard_bytes(bp[blk], be[blk], V, min((blk + 1) * block_size, n) - blk * block_size)
        if one > bank_bytes:
            raise BuildError(f"doc block {blk} alone needs {one} bytes, more than a bank ({bank_bytes}); "
                             f"use a smaller --block-size or a larger --bank-bytes")
        cur_p += bp[blk]
        cur_e += be[blk]
    shards.append((cur_start, len(bp)))
    return shards


def write_shard(d: Path, parts: list[tuple], remap: np.ndarray, n_entries: int, log2_bs: int, tf_bits: int,
                norms: np.ndarray, cache: np.ndarray, pool: ThreadPoolExecutor, sums: Checksums,
                fine_block: int = L.DEFAULT_FINE_BLOCK) -> tuple[int, int, int]:
    """Write a shard's arrays (FORMAT.md) into ``d`` from its runs in docid order (``Run.load``: provisional term
    ids, tfs, postings per document, first docid); returns (postings, block entries, fine blocks).

    The postings are ordered by (final term id, docid) with a counting sort by term: it is stable, so each term's
    postings keep the runs' docid order, and it costs two passes instead of a sort. Both passes run on two
    threads, each on half of the postings (the scatter with its own cursors, so they write disjoint places)."""
    V = remap.size
    halves = _halves(parts)
    counts = list(pool.map(lambda half: _term_counts(half, remap), halves))
    starts = np.cumsum(counts[0] + counts[1])  # postings of final term t: starts[t] .. starts[t + 1] - 1
    packed = np.empty(starts[V], dtype=np.uint32)
    docs = np.empty(starts[V], dtype=np.uint32)
    cursors = (starts[:V].copy(), starts[:V] + counts[0][1:])

    def scatter(half: list[tuple], cursor: np.ndarray) -> None:
        for tids, tfs, uniq, first_doc in half:
            _scatter(tids, tfs, uniq, first_doc, remap, cursor, log2_bs, tf_bits, packed, docs)

    list(pool.map(scatter, halves, cursors))
    arrays = _block_entries(starts, packed, docs, n_entries, log2_bs, tf_bits, norms, cache)
    for name, a in zip(L.SHARD_FILES, (packed, *arrays)):
        sums.write(d / name, a)
    fine = fine_bounds(packed, arrays[1], arrays[2], norms, cache, tf_bits, 1 << log2_bs, fine_block)
    for name, a in zip(L.FINE_FILES, fine):
        sums.write(d / name, a)
    return packed.size, n_entries, fine[1].size


def _halves(parts: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """Runs cut at a document boundary into two lists with about half of the postings each, in docid order."""
    half = sum(tids.size for tids, _, _, _ in parts) // 2
    first: list[tuple] = []
    second: list[tuple] = []
    seen = 0
    for tids, tfs, uniq, first_doc in parts:
        need = half - seen
        if need <= 0:
            second.append((tids, tfs, uniq, first_doc))
        elif need >= tids.size:
            first.append((tids, tfs, uniq, first_doc))
        else:
            k = int(np.searchsorted(np.cumsum(uniq), need)) + 1  # the first k documents hold >= need postings
            c = int(uniq[:k].sum())
            first.append((tids[:c], tfs[:c], uniq[:k], first_doc))
            second.append((tids[c:], tfs[c:], uniq[k:], first_doc + k))
        seen += tids.size
    return first, second


def _term_counts(parts: list[tuple], remap: np.ndarray) -> np.ndarray:
    """Postings per final term, shifted by one (counts[t + 1]) for an exclusive prefix sum."""
    counts = np.zeros(remap.size + 1, dtype=np.int64)
    for tids, _, _, _ in parts:
        _count_terms(tids, remap, counts)
    return counts


@njit(cache=True, nogil=True)
def _count_terms(tids, remap, counts):
    for t in tids:
        counts[remap[t] + 1] += 1


@njit(cache=True, nogil=True)
def _scatter(tids, tfs, uniq, first_doc, remap, cursor, log2_bs, tf_bits, packed, out_docs):
    """Place each posting at its final term's cursor: packed (docid in block << tf_bits | tf) and docid."""
    in_block = (1 << log2_bs) - 1
    k = 0
    for i in range(uniq.size):
        doc = first_doc + i
        for _ in range(uniq[i]):
            t = remap[tids[k]]
            p = cursor[t]
            cursor[t] = p + 1
            packed[p] = ((doc & in_block) << tf_bits) | tfs[k]
            out_docs[p] = doc
            k += 1


@njit(cache=True, nogil=True)
def _block_entries(starts, packed, docs, n_entries, log2_bs, tf_bits, norms, cache):
    """The block tables of postings ordered by (term, docid): term_ptr, blk_id, blk_start, blk_maxq, blk_maxtf,
    blk_minnorm, as FORMAT.md defines them (q = f32(tf) * cache[norm], in f32)."""
    V = starts.size - 1
    term_ptr = np.empty(V + 1, dtype=np.uint32)
    blk_id = np.empty(n_entries, dtype=np.uint32)
    blk_start = np.empty(n_entries + 1, dtype=np.uint32)
    maxq = np.empty(n_entries, dtype=np.float32)
    maxtf = np.empty(n_entries, dtype=np.uint32)
    minnorm = np.empty(n_entries, dtype=np.uint8)
    tf_mask = (1 << tf_bits) - 1
    e = 0
    for t in range(V):
        term_ptr[t] = e
        block = -1
        for p in range(starts[t], starts[t + 1]):
            doc = docs[p]
            tf = packed[p] & tf_mask
            norm = norms[doc]
            q = np.float32(tf) * cache[norm]
            if doc >> log2_bs != block:
                block = doc >> log2_bs
                blk_id[e] = block
                blk_start[e] = p
                maxq[e], maxtf[e], minnorm[e] = q, tf, norm
                e += 1
            else:
                maxq[e - 1] = max(maxq[e - 1], q)
                maxtf[e - 1] = max(maxtf[e - 1], tf)
                minnorm[e - 1] = min(minnorm[e - 1], norm)
    assert e == n_entries
    term_ptr[V] = e
    blk_start[e] = starts[V]
    return term_ptr, blk_id, blk_start, maxq, maxtf, minnorm


def _builder_version() -> str:
    """The installed distribution's version (the indexer does not import the ragserve package above it)."""
    try:
        return version("ragserve")
    except PackageNotFoundError:
        return "unknown"
