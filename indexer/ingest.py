"""The ingest stage of a build (main process): analysed chunks -> docids, provisional term ids and runs on disk.

Docids are assigned in input order. Each chunk's worker-local term ids are mapped to provisional global ones
(first-seen order), stored text streams to disk and postings are buffered, flushed as a run whenever the buffer
budget fills or a doc block ends (so a run never spans blocks). ``indexer/packing.py`` turns the runs into shards.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
from numba import njit
from tqdm import tqdm

from indexer import layout as L
from indexer.options import BuildOptions


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


class Ingest:
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
        self.runs: list[Run] = []
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
        self.runs.append(Run(self._buf_block, path, self._buf_first_doc, n_docs, self._buf_postings))
        self._buf, self._buf_postings = [], 0

    def finish_streams(self) -> None:
        self._flush()
        for fh in (self.store, self.store_off, self.ids, self.ids_off):
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()


@dataclass
class Run:
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


def ingest(chunks: Iterable[tuple], tmp: Path, opts: BuildOptions, read_stats=None) -> Ingest:
    """Ingest analysed chunks (in input order) into ``tmp``, with a progress bar; the streams are closed after."""
    ing = Ingest(tmp, opts)
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
    return ing
