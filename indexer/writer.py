"""Layout writer: documents -> the sharded, block-partitioned BM25 index of ``indexer/FORMAT.md``.

Pipeline: the main process reads documents and sends chunks of them to worker processes (both cores by
default), which tokenize (``indexer/fasttok.py``), count postings and encode the stored records. The main process
maps the workers' term ids to provisional global ones, streams stored text to disk and buffers postings, flushing
runs to disk whenever the buffer budget fills or a doc block ends (so a run never spans blocks). After the input
is read, term ids are re-assigned in sorted-term order and each shard's runs are counting-sorted into its arrays.
Everything is written under a temporary directory that is renamed into place only when complete.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from numba import njit
from tqdm import tqdm

from indexer import layout as L
from indexer.analyzer import Analyzer, AnalyzerConfig
from indexer.bounds import fine_bounds
from indexer.fasttok import TokenTable
from indexer.files import sha256_file, write_dir_atomically
from indexer.norms import LENGTH_TABLE, encode_lengths

CHUNK_DOCS = 1000  # documents per analysis task: large enough to amortise inter-process transfer


class BuildError(ValueError):
    """The build cannot proceed (bad parameters, output exists, no documents)."""


@dataclass
class BuildOptions:
    block_size: int = L.DEFAULT_BLOCK_SIZE
    bank_bytes: int = L.DEFAULT_BANK_BYTES
    k1: float = 0.9
    b: float = 0.4
    workers: int = 0  # 0: one per core
    run_postings: int = 32_000_000  # postings buffered in memory before a run is flushed (~300 MB)
    fine_block: int = L.DEFAULT_FINE_BLOCK  # postings per fine block (the CPU's block-max bounds)
    overwrite: bool = False
    progress: bool = True
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)


# ---------------------------------------------------------------------------------------------
# Analysis (runs in worker processes)

class _ChunkAnalyser:
    """Analysis state of one worker process: its own term ids, so only terms new to it cross to the main process.

    Documents go through ``fasttok`` (numba tokenizer, one hash lookup per token) when the analyzer lower-cases
    and their characters allow it, else through the analyzer's tokenizer with a dict from token to term id. Either
    way the Python chain runs once per distinct token.
    """

    def __init__(self, cfg: dict) -> None:
        self.analyzer = Analyzer.from_config(cfg)
        self.table = TokenTable(self.analyzer.config.max_token_length) if self.analyzer.config.lowercase else None
        self.ids: dict[str, int] = {}  # token -> worker-local term id, or -1 (tokens of the analyzer's tokenizer)
        self.term_ids: dict[str, int] = {}  # term -> worker-local term id
        self.terms: list[str] = []
        self.sent = 0  # terms already reported to the main process
        self._slots = np.zeros(0, dtype=np.int32)  # scratch of chunk_postings, one entry per term

    def _term_id(self, term: str) -> int:
        if not term:
            return -1
        tid = self.term_ids.get(term)
        if tid is None:
            tid = self.term_ids[term] = len(self.terms)
            self.terms.append(term)
        return tid

    def _new_token(self, tok: str) -> int:
        return self._term_id(self.analyzer.term(tok, cache=False))  # the token table is the cache

    def _token_id(self, tok: str) -> int:
        tid = self.ids.get(tok)
        if tid is None:
            tid = self._term_id(self.analyzer.term(tok))
            if len(self.ids) < 4_000_000:
                self.ids[tok] = tid
        return tid

    def _full_path_ids(self, text: str) -> np.ndarray:
        return np.fromiter(map(self._token_id, self.analyzer.tokens(text)), dtype=np.int32)

    def _doc_ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Term ids of the tokens of all documents (-1: dropped) and the number of tokens of each document."""
        if self.table is None:
            docs = [self._full_path_ids(t) for t in texts]
            return np.concatenate(docs) if docs else np.zeros(0, np.int32), np.array([d.size for d in docs])
        buf = "".join(texts).encode("utf-8", "surrogatepass")
        ids, ends, rejected = self.table.ids(buf, np.fromiter(map(len, texts), np.int64, len(texts)),
                                             self._new_token, self._token_id)
        counts = np.diff(ends, prepend=0)
        if not rejected.any():
            return ids, counts
        # Documents outside the fast path have no ids in `ids`: splice theirs in at their place.
        parts, prev = [], 0
        for d in np.flatnonzero(rejected):
            full = self._full_path_ids(texts[d])
            parts += [ids[prev:ends[d]], full]
            counts[d] = full.size
            prev = ends[d]
        parts.append(ids[prev:])
        return np.concatenate(parts), counts

    def chunk(self, batch: tuple[list[str], list[str], list[str]], self_contained: bool = False) -> tuple:
        """A chunk of documents (ids, titles, texts): (worker id, terms new since the last chunk, postings grouped
        by document as worker-local term id and tf, distinct terms per doc, length per doc, stored records).

        ``self_contained``: the worker id is None and the terms are those of this chunk alone, numbered from 0,
        so the result means the same whichever worker made it and in whatever order results arrive (an
        executor that may retry or reorder tasks, e.g. Ray, needs this)."""
        ids, titles, texts = batch
        term_ids, counts = self._doc_ids([_indexed_text(title, text) for title, text in zip(titles, texts)])
        if self._slots.size < len(self.terms):
            self._slots = np.zeros(2 * len(self.terms), dtype=np.int32)
        local, tfs, uniq, lengths = chunk_postings(term_ids, counts, self._slots)
        stored = _stored_records(ids, titles, texts)
        if self_contained:
            used = np.unique(local)
            terms = self.terms
            return (None, [terms[t] for t in used.tolist()], np.searchsorted(used, local).astype(np.int32), tfs,
                    uniq, lengths, stored)
        new = self.terms[self.sent:]
        self.sent = len(self.terms)
        return os.getpid(), new, local, tfs, uniq, lengths, stored


def _stored_records(ids: list[str], titles: list[str], texts: list[str]) -> tuple[bytes, np.ndarray, bytes, np.ndarray]:
    """store.bin and docids.bin bytes of a chunk, with each record's size (FORMAT.md: title \x1f text)."""
    sep = L.FIELD_SEPARATOR
    recs = [(t.replace(sep, " ") + sep + x.replace(sep, " ")).encode("utf-8", "replace") for t, x in zip(titles, texts)]
    enc_ids = [i.encode("utf-8", "replace") for i in ids]
    return (b"".join(recs), np.fromiter(map(len, recs), dtype=np.uint64, count=len(recs)),
            b"".join(enc_ids), np.fromiter(map(len, enc_ids), dtype=np.uint64, count=len(enc_ids)))


@njit(cache=True, nogil=True)
def chunk_postings(ids, counts, slots):
    """Postings of documents given as term ids (-1: dropped token) and token counts: (term and tf per posting,
    postings and length per document).

    ``slots`` (one entry per term, any content) remembers where each term was last counted; an entry is trusted
    only if it points at a posting of that term in the current document, so it is never reset."""
    n_docs = counts.size
    terms = np.empty(ids.size, dtype=np.int32)
    tfs = np.empty(ids.size, dtype=np.uint32)
    uniq = np.zeros(n_docs, dtype=np.int32)
    lengths = np.zeros(n_docs, dtype=np.int64)
    postings = 0
    k = 0
    for d in range(n_docs):
        first = postings
        for _ in range(counts[d]):
            t = ids[k]
            k += 1
            if t < 0:
                continue
            lengths[d] += 1
            j = slots[t]
            if first <= j < postings and terms[j] == t:
                tfs[j] += 1
            else:
                slots[t] = postings
                terms[postings] = t
                tfs[postings] = 1
                postings += 1
        uniq[d] = postings - first
    return terms[:postings], tfs[:postings], uniq, lengths


# The analysis state of a pool worker process (set by its initializer; a pool task can only reach it as a global).
# Never set in the main process: an in-process build keeps its own ``_ChunkAnalyser`` (two builds may run at once
# in two threads, e.g. a live index's refresh and merge).
_pool_worker: _ChunkAnalyser | None = None


def _init_pool_worker(cfg: dict) -> None:
    global _pool_worker
    # Ctrl-C reaches the whole process group. Only the main process acts on it (it stops the pool and removes
    # the partial index): a worker interrupted inside the pool's queues can leave the pool waiting forever.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _pool_worker = _ChunkAnalyser(cfg)


def _analyse_chunk(batch: tuple[list[str], list[str], list[str]]) -> tuple:
    assert _pool_worker is not None
    return _pool_worker.chunk(batch)


class ChunkAnalyser:
    """Analysis of document chunks for another executor (e.g. Ray workers): each result is self-contained
    (``_ChunkAnalyser.chunk``), for ``build_index_from_analysed``. Chunk boundaries do not change the index."""

    def __init__(self, analyzer_config: dict) -> None:
        self._analyser = _ChunkAnalyser(analyzer_config)

    def __call__(self, ids: list[str], titles: list[str], texts: list[str]) -> tuple:
        return self._analyser.chunk((ids, titles, texts), self_contained=True)


def _indexed_text(title: str, text: str) -> str:
    # BEIR/Anserini convention: title and text form one field, joined by a space.
    return f"{title} {text}" if title else text


# ---------------------------------------------------------------------------------------------
# Ingestion state (main process)

class _Growable:
    """An append-only numpy array (of rows of ``shape``) that doubles its capacity."""

    def __init__(self, dtype, shape: tuple[int, ...] = (), capacity: int = 1 << 16) -> None:
        self.a = np.zeros((capacity, *shape), dtype=dtype)
        self.n = 0

    def ensure(self, n: int) -> None:
        if n > len(self.a):
            new = np.zeros((max(n, 2 * len(self.a)), *self.a.shape[1:]), dtype=self.a.dtype)
            new[: self.n] = self.a[: self.n]
            self.a = new

    def extend(self, values: np.ndarray) -> None:
        self.ensure(self.n + len(values))
        self.a[self.n: self.n + len(values)] = values
        self.n += len(values)

    @property
    def view(self) -> np.ndarray:
        return self.a[: self.n]


class _Ingest:
    def __init__(self, tmp: Path, opts: BuildOptions) -> None:
        self.tmp = tmp
        self.opts = opts
        self.vocab: dict[str, int] = {}
        self._worker_maps: dict[int, _Growable] = {}
        # Per provisional term: document frequency, and the last doc block it was seen in (to count block
        # entries); side by side, so a posting touches one cache line.
        self.term_stats = _Growable(np.int64, (2,))
        self.lengths = _Growable(np.int64)
        self.block_postings: list[int] = []
        self.block_entries: list[int] = []
        self.max_tf = 0
        self.num_docs = 0
        self.sum_total_tf = 0
        self.runs: list[_Run] = []
        # The run being buffered, all from one doc block: (provisional term ids, tfs, postings per doc) per chunk.
        self._buf: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._buf_postings = 0
        self._buf_block = 0
        self._buf_first_doc = 0
        (tmp / "_runs").mkdir()
        self.store = open(tmp / L.STORE_BYTES, "wb")
        self.store_off = open(tmp / L.STORE_OFFSETS, "wb")
        self.ids = open(tmp / L.DOCIDS_BYTES, "wb")
        self.ids_off = open(tmp / L.DOCIDS_OFFSETS, "wb")
        self._store_pos = 0
        self._ids_pos = 0
        self.store_off.write(np.uint64(0).tobytes())
        self.ids_off.write(np.uint64(0).tobytes())

    def _write_stored(self, store: bytes, store_sizes: np.ndarray, ids: bytes, id_sizes: np.ndarray) -> None:
        for blob, sizes, fh, offh, attr in ((store, store_sizes, self.store, self.store_off, "_store_pos"),
                                            (ids, id_sizes, self.ids, self.ids_off, "_ids_pos")):
            offs = getattr(self, attr) + np.cumsum(sizes, dtype=np.uint64)
            fh.write(blob)
            offh.write(offs.astype("<u8").tobytes())
            setattr(self, attr, int(offs[-1]) if len(offs) else getattr(self, attr))

    def _global_ids(self, wid: int | None, new_terms: list[str]) -> np.ndarray:
        """Worker-local term id -> provisional global id (first-seen order), extended with the worker's new terms
        (``wid`` None: a self-contained chunk, whose map is not kept)."""
        vocab = self.vocab
        if wid is None:
            ids = np.array([vocab.setdefault(t, len(vocab)) for t in new_terms], dtype=np.int64)
        else:
            wmap = self._worker_maps.get(wid)
            if wmap is None:
                wmap = self._worker_maps[wid] = _Growable(np.int64)
            if new_terms:
                wmap.extend(np.array([vocab.setdefault(t, len(vocab)) for t in new_terms], dtype=np.int64))
            ids = wmap.a
        V = len(vocab)
        self.term_stats.ensure(V)
        self.term_stats.a[self.term_stats.n:V] = (0, -1)
        self.term_stats.n = V
        return ids

    def add_chunk(self, result: tuple) -> None:
        wid, new_terms, local, tfs, uniq, lengths, stored = result
        self._write_stored(*stored)
        wmap = self._global_ids(wid, new_terms)
        n = uniq.size
        self.sum_total_tf += int(lengths.sum())
        self.lengths.extend(lengths)
        # Split the chunk at doc block boundaries so runs and block statistics stay per block.
        bs = self.opts.block_size
        first = self.num_docs
        doc_pos = np.concatenate(([0], np.cumsum(uniq)))
        d = 0
        while d < n:
            block = (first + d) // bs
            end = min((block + 1) * bs - first, n)
            p0, p1 = doc_pos[d], doc_pos[end]
            self._add_block_part(block, local[p0:p1], tfs[p0:p1], uniq[d:end], first + d, wmap)
            d = end
        self.num_docs += n

    def _add_block_part(self, block: int, local: np.ndarray, tfs: np.ndarray, uniq: np.ndarray, first_doc: int,
                        wmap: np.ndarray) -> None:
        if block != self._buf_block:
            self._flush()
            self._buf_block = block
        if not self._buf:
            self._buf_first_doc = first_doc
        while len(self.block_postings) <= block:
            self.block_postings.append(0)
            self.block_entries.append(0)
        tids, new_entries = _map_postings(local, wmap, block, self.term_stats.a)
        self.block_postings[block] += local.size
        self.block_entries[block] += new_entries
        if tfs.size:
            self.max_tf = max(self.max_tf, int(tfs.max()))
        self._buf.append((tids, tfs, uniq))
        self._buf_postings += local.size
        if self._buf_postings >= self.opts.run_postings:
            self._flush()

    def _flush(self) -> None:
        if not self._buf:
            return
        path = self.tmp / "_runs" / f"run_{len(self.runs):06d}.u32"
        with open(path, "wb") as f:
            for col in range(3):
                for part in self._buf:
                    f.write(part[col].astype(np.uint32, copy=False).tobytes())
        n_docs = sum(part[2].size for part in self._buf)
        self.runs.append(_Run(self._buf_block, path, self._buf_first_doc, n_docs, self._buf_postings))
        self._buf, self._buf_postings = [], 0

    def finish_streams(self) -> None:
        self._flush()
        for fh in (self.store, self.store_off, self.ids, self.ids_off):
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()


@dataclass
class _Run:
    """A run file: u32 provisional term ids and tfs of its postings, then the number of postings of each of its
    documents (docids first_doc, first_doc + 1, ...), all in one doc block. FORMAT.md bounds ids by 2^32."""

    block: int
    path: Path
    first_doc: int
    docs: int
    postings: int

    def load(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        a = np.fromfile(self.path, dtype=np.uint32)
        return a[:self.postings], a[self.postings:2 * self.postings], a[2 * self.postings:], self.first_doc


@njit(cache=True, nogil=True)
def _map_postings(local, wmap, block, term_stats):
    """Provisional term ids (u32) of postings given in worker-local ids; counts each term's df and, through the
    last block it was seen in, the (term, block) entries new to ``block`` (returned)."""
    tids = np.empty(local.size, dtype=np.uint32)
    new_entries = 0
    for k in range(local.size):
        t = wmap[local[k]]
        tids[k] = t
        term_stats[t, 0] += 1
        if term_stats[t, 1] != block:
            term_stats[t, 1] = block
            new_entries += 1
    return tids, new_entries


# ---------------------------------------------------------------------------------------------
# Building

class _Progress:
    """Indexing progress: in input bytes when the reader knows the total (so the bar has an ETA), else in docs."""

    def __init__(self, enabled: bool, read_stats) -> None:
        self.stats = read_stats if read_stats is not None and getattr(read_stats, "bytes_total", 0) else None
        self.n_docs = 0
        if self.stats is not None:
            self.bar = tqdm(desc="indexing", total=self.stats.bytes_total, unit="B", unit_scale=True,
                            disable=not enabled, mininterval=0.5)
        else:
            self.bar = tqdm(desc="indexing", unit=" docs", disable=not enabled, mininterval=0.5)

    def docs(self, n: int) -> None:
        self.n_docs += n
        if self.stats is None:
            self.bar.update(n)
        else:
            self.bar.update(self.stats.bytes_read - self.bar.n)
            self.bar.set_postfix_str(f"{self.n_docs:,} docs", refresh=False)

    def close(self) -> None:
        self.bar.close()

    def discard(self) -> None:
        """Erase the bar: an error message follows, which must start on a clean line with no bar after it."""
        self.bar.leave = False
        self.bar.close()


def _iter_batches(docs: Iterable, size: int) -> Iterator[list]:
    batch = []
    for d in docs:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _effective_block_size(requested: int, max_tf: int) -> tuple[int, int]:
    tf_bits = L.tf_bits_for(max_tf)
    block_bits = 32 - tf_bits
    return min(requested, 1 << block_bits), tf_bits


def build_index_from_documents(documents: Iterable, out_dir: str | Path, options: BuildOptions | None = None,
                               source: dict | None = None, read_stats=None) -> dict:
    """Index an iterable of objects with ``id``, ``title``, ``text`` into ``out_dir``; returns the manifest.

    ``read_stats`` (an ``indexer.readers.ReadStats``), when given, drives the progress bar in input bytes.
    """
    opts = options or BuildOptions()
    analyzer = Analyzer(opts.analyzer)
    return _build_into(out_dir, opts, lambda tmp: _build(
        _analyse_local(documents, analyzer, opts.workers or os.cpu_count() or 1), tmp, opts, analyzer,
        source or {}, read_stats))


def build_index_from_analysed(chunks: Iterable[tuple], out_dir: str | Path, options: BuildOptions | None = None,
                              source: dict | None = None,
                              shard_writer: Callable[[list[ShardJob], ShardInputs], Iterable[tuple]] | None = None
                              ) -> dict:
    """Index chunks analysed elsewhere (``ChunkAnalyser`` results, in input order: chunk boundaries do not
    matter) into ``out_dir``; returns the manifest. ``shard_writer`` runs ``write_shard_job`` for every job,
    anywhere that sees the same files, and yields its results in job order (default: here, one shard at a
    time). ``source`` may be filled in until ``chunks`` is exhausted. The files are those of
    ``build_index_from_documents`` over the same documents and options."""
    opts = options or BuildOptions()
    analyzer = Analyzer(opts.analyzer)
    return _build_into(out_dir, opts, lambda tmp: _build(chunks, tmp, opts, analyzer, source if source is not None
                                                         else {}, None, shard_writer))


def _build_into(out_dir: str | Path, opts: BuildOptions, build: Callable[[Path], dict]) -> dict:
    """Run ``build`` on a temporary directory next to ``out_dir`` and rename it into place when complete."""
    bs = opts.block_size
    if bs <= 0 or bs & (bs - 1):
        raise BuildError(f"block size must be a power of two, got {bs}")
    if opts.fine_block < 1:
        raise BuildError(f"fine block size must be at least 1 posting, got {opts.fine_block}")
    out = Path(out_dir)
    if out.exists() and not opts.overwrite:
        raise BuildError(f"{out} already exists (pass --overwrite to replace it)")
    return write_dir_atomically(out, build)


def _analyse_local(documents: Iterable, analyzer: Analyzer, workers: int) -> Iterator[tuple]:
    """Analysed chunks of ``documents`` in input order, from ``workers`` processes (or this one)."""

    def prepared() -> Iterator[tuple[list[str], list[str], list[str]]]:
        for batch in _iter_batches(documents, CHUNK_DOCS):
            yield [str(d.id) for d in batch], [d.title or "" for d in batch], [d.text or "" for d in batch]

    if workers > 1:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        # ProcessPoolExecutor, not multiprocessing.Pool: Pool's worker-handler thread spins while a large result
        # waits in the pipe (it polls the result pipe), which cost the main process seconds of CPU.
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_pool_worker,
                                 initargs=(analyzer.config_dict(),)) as pool:
            # Up to `window` chunks in flight, results taken in order: this thread reads ahead while the pool's
            # threads move chunks and results, and memory stays bounded.
            window = 2 * workers + 2
            pending: deque[Future] = deque()
            try:
                for batch in prepared():
                    pending.append(pool.submit(_analyse_chunk, batch))
                    if len(pending) >= window:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                pool.shutdown(cancel_futures=True)
    else:
        worker = _ChunkAnalyser(analyzer.config_dict())  # this build's own: nothing shared with another thread's
        for batch in prepared():
            yield worker.chunk(batch)


def _build(chunks: Iterable[tuple], tmp: Path, opts: BuildOptions, analyzer: Analyzer, source: dict, read_stats=None,
           shard_writer=None) -> dict:
    t_start = time.time()
    ing = _Ingest(tmp, opts)
    bar = _Progress(opts.progress, read_stats)
    it = iter(chunks)
    try:
        for res in it:
            ing.add_chunk(res)
            bar.docs(res[4].size)
    except BaseException:
        bar.discard()  # erase the bar before the caller prints the error
        raise
    finally:
        close = getattr(it, "close", None)  # stops a local pool at once on an error or Ctrl-C
        if close is not None:
            close()
    bar.close()
    ing.finish_streams()
    if ing.num_docs == 0:
        raise BuildError("no documents were read from the input")
    return _write_layout(ing, tmp, opts, analyzer, source, t_start, shard_writer)


@dataclass
class ShardJob:
    """One shard to write: its directory, its runs (files the writer must see) and its block entries."""

    index: int
    dir: Path
    runs: list[_Run]
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
    with _Checksums(job.dir) as sums, ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(_Run.load, job.runs))
        P, E, F = _write_shard(job.dir, parts, inputs.remap, job.entries, inputs.log2_bs, inputs.tf_bits,
                               inputs.norms, inputs.cache, pool, sums, inputs.fine_block)
        return int(P), int(E), int(F), {name: meta["sha256"] for name, meta in sums.files().items()}


def _write_layout(ing: _Ingest, tmp: Path, opts: BuildOptions, analyzer: Analyzer, source: dict, t_start: float,
                  shard_writer: Callable[[list[ShardJob], ShardInputs], Iterable[tuple]] | None = None) -> dict:
    from indexer.bm25 import avgdl_f32, norm_cache

    n = ing.num_docs
    block_size, tf_bits = _effective_block_size(opts.block_size, ing.max_tf)
    if block_size != opts.block_size:
        raise BuildError(f"max term frequency {ing.max_tf} needs {tf_bits} bits; doc blocks must be at most "
                         f"{block_size} docs (pass --block-size {block_size})")
    with _Checksums(tmp) as sums, ThreadPoolExecutor(2) as pool:
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
                P, E, F = _write_shard(d, parts, remap, job.entries, log2_bs, tf_bits, norms, cache, pool, sums,
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


class _Checksums:
    """Size and SHA-256 of the index files for the manifest. Files handed to ``add`` or ``write`` are hashed by a
    background thread (hashlib and file reads release the GIL) while the layout goes on."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pool = ThreadPoolExecutor(1)
        self._sums: dict[Path, Future] = {}

    def __enter__(self) -> "_Checksums":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(cancel_futures=True)

    def add(self, path: Path) -> None:
        self._sums[path] = self._pool.submit(sha256_file, path)

    def record(self, path: Path, sha256: str) -> None:
        """A file written and hashed elsewhere (``write_shard_job``)."""
        done: Future = Future()
        done.set_result(sha256)
        self._sums[path] = done

    def write(self, path: Path, a: np.ndarray) -> None:
        """Write ``a`` as a raw little-endian array file and hash it, both in the background (``a`` must not
        change afterwards)."""
        self._sums[path] = self._pool.submit(_write_and_hash, path, a)

    def files(self) -> dict[str, dict]:
        """The manifest's ``files``: every file under the root, in path order."""
        sums = {path: f.result() for path, f in self._sums.items()}  # every background write is done
        files = {}
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                sha = sums[p] if p in sums else sha256_file(p)
                files[str(p.relative_to(self.root))] = {"bytes": p.stat().st_size, "sha256": sha}
        return files


def _write_vocab(ing: _Ingest, sums: _Checksums) -> np.ndarray:
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


def _write_shard(d: Path, parts: list[tuple], remap: np.ndarray, n_entries: int, log2_bs: int, tf_bits: int,
                 norms: np.ndarray, cache: np.ndarray, pool: ThreadPoolExecutor, sums: _Checksums,
                 fine_block: int = L.DEFAULT_FINE_BLOCK) -> tuple[int, int, int]:
    """Write a shard's arrays (FORMAT.md) into ``d`` from its runs in docid order (``_Run.load``: provisional term
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


def _write_and_hash(path: Path, a: np.ndarray) -> str:
    a.astype(a.dtype.newbyteorder("<"), copy=False).tofile(path)
    return sha256_file(path)


def _builder_version() -> str:
    """The installed distribution's version (the indexer does not import the ragserve package above it)."""
    try:
        return version("ragserve")
    except PackageNotFoundError:
        return "unknown"


def build_index(inputs: list[str | Path], out_dir: str | Path, options: BuildOptions | None = None,
                fmt: str = "auto", on_error: str = "skip", passage_words: int = 100) -> dict:
    """Read corpus files with ``indexer.readers`` and index them; returns the manifest."""
    from indexer.readers import ReadStats, iter_documents

    stats = ReadStats()
    docs = iter_documents([str(p) for p in inputs], fmt=fmt, on_error=on_error, stats=stats,
                          passage_words=passage_words)

    # The manifest is written after the input is exhausted, so the reader's counts are final by then.
    source: dict = {"inputs": [str(p) for p in inputs], "format": fmt}

    def counted() -> Iterator:
        yield from docs
        source.update(read_counts(stats))

    return build_index_from_documents(counted(), out_dir, options, source, read_stats=stats)


def read_counts(stats) -> dict:
    """The reader's final counts (an ``indexer.readers.ReadStats``) as the manifest's ``source`` records them."""
    return dict(records=stats.records, documents=stats.documents, skipped=stats.skipped, filtered=stats.filtered,
                invalid_utf8=stats.invalid_utf8, error_count=stats.error_count, truncated=list(stats.truncated),
                errors=[f"{e.file}:{e.line}: {e.message}" for e in stats.errors[:100]])
