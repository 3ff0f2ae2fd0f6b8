"""Reference reader of the index layout: memory-maps every array named in ``FORMAT.md``."""
from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from indexer import layout as L
from indexer.analyzer import Analyzer
from indexer.files import sha256_file


class InvalidIndexError(Exception):
    """Raised for a directory that is not a complete, valid index."""


def _map(path: Path) -> np.ndarray:
    dt = L.dtype_of(path.name)
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dt)
    return np.memmap(path, dtype=dt, mode="r")


@dataclass
class Shard:
    index: int
    doc_start: int
    doc_end: int
    block_start: int
    block_end: int
    postings: np.ndarray
    term_ptr: np.ndarray
    blk_id: np.ndarray
    blk_start: np.ndarray
    blk_maxq: np.ndarray
    blk_maxtf: np.ndarray
    blk_minnorm: np.ndarray
    # Fine bounds (FORMAT.md): None for an index written without them (a backend may derive them).
    fine_ptr: np.ndarray | None = None
    fine_maxq: np.ndarray | None = None
    fine_last: np.ndarray | None = None


class IndexReader:
    """Read-only view of one index directory."""

    def __init__(self, path: str | Path, verify: bool = False) -> None:
        self.path = Path(path)
        mpath = self.path / L.MANIFEST
        if self.path.is_file():
            raise InvalidIndexError(f"{self.path} is a file, not an index directory (ragserve index --out DIR "
                                    "makes one)")
        if not self.path.is_dir():
            raise InvalidIndexError(f"{self.path}: no such index directory")
        if not mpath.is_file() and (self.path / "live" / "commit.json").is_file():
            raise InvalidIndexError(f"{self.path} is a live index (ragserve add/delete made it one): it is searched "
                                    "through ragserve.retrieval.live (ragserve search and serve open it so)")
        if not mpath.is_file():
            raise InvalidIndexError(f"{self.path}: not an index (no {L.MANIFEST}; an interrupted build leaves none)")
        try:
            self.manifest = json.loads(mpath.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InvalidIndexError(f"{mpath}: unreadable manifest: {e}") from e
        if self.manifest.get("format") != L.FORMAT_NAME:
            raise InvalidIndexError(f"{mpath}: not a ragserve index (format {self.manifest.get('format')!r})")
        if self.manifest.get("version") != L.FORMAT_VERSION:
            raise InvalidIndexError(f"{mpath}: layout version {self.manifest.get('version')} is not supported "
                              f"(this ragserve reads version {L.FORMAT_VERSION}); rebuild the index")
        for name, meta in self.manifest["files"].items():
            f = self.path / name
            if not f.is_file() or f.stat().st_size != meta["bytes"]:
                raise InvalidIndexError(f"{self.path}: file {name} is missing or truncated; rebuild the index")
        if verify:
            self.verify()
        st = self.manifest["stats"]
        lay = self.manifest["layout"]
        self.num_docs: int = st["num_docs"]
        self.doc_count: int = st["doc_count"]
        self.vocab_size: int = st["vocab_size"]
        self.avgdl = np.float32(st["avgdl"])
        self.block_size: int = lay["block_size"]
        self.tf_bits: int = lay["tf_bits"]
        self.fine_block: int | None = lay.get("fine_block")  # absent: an index without fine bounds
        self.k1: float = self.manifest["bm25"]["k1"]
        self.b: float = self.manifest["bm25"]["b"]
        self.analyzer = Analyzer.from_config(self.manifest["analyzer"])
        # Plain ndarray views of the maps: indexing an np.memmap runs Python code in numpy for every lookup.
        self.norms = np.asarray(_map(self.path / L.NORMS))
        self.df = np.asarray(_map(self.path / L.DF))
        self._docids = (self.path / L.DOCIDS_BYTES, _map(self.path / L.DOCIDS_OFFSETS))
        self._store = (self.path / L.STORE_BYTES, _map(self.path / L.STORE_OFFSETS))
        self.shards = [self._open_shard(i, s) for i, s in enumerate(self.manifest["shards"])]

    def _open_shard(self, i: int, s: dict) -> Shard:
        d = self.path / s["dir"]
        arrays = {name.split(".")[0]: _map(d / name) for name in L.SHARD_FILES}
        if self.fine_block:
            arrays.update({name.split(".")[0]: _map(d / name) for name in L.FINE_FILES})
        return Shard(index=i, doc_start=s["doc_start"], doc_end=s["doc_end"], block_start=s["block_start"],
                     block_end=s["block_end"], **arrays)

    def verify(self) -> None:
        """Recompute every file's SHA-256 against the manifest."""
        for name, meta in self.manifest["files"].items():
            if sha256_file(self.path / name) != meta["sha256"]:
                raise InvalidIndexError(f"{self.path}: checksum mismatch in {name}; the index is corrupt")

    # -- vocabulary -------------------------------------------------------------------------
    @cached_property
    def term_ids(self) -> dict[str, int]:
        """term -> id. Built on first use (a dict is the fastest lookup from Python)."""
        offsets = np.fromfile(self.path / L.VOCAB_OFFSETS, dtype="<u8")
        blob = (self.path / L.VOCAB_BYTES).read_bytes()
        terms = blob.decode("utf-8")
        if len(terms) == len(blob):  # pure ASCII: byte offsets are character offsets
            o = offsets.tolist()
            return {terms[o[i]:o[i + 1]]: i for i in range(len(o) - 1)}
        o = offsets.tolist()
        return {blob[o[i]:o[i + 1]].decode("utf-8"): i for i in range(len(o) - 1)}

    def term(self, term_id: int) -> str:
        offsets = _map(self.path / L.VOCAB_OFFSETS)
        with open(self.path / L.VOCAB_BYTES, "rb") as f:
            f.seek(int(offsets[term_id]))
            return f.read(int(offsets[term_id + 1] - offsets[term_id])).decode("utf-8")

    # -- documents ----------------------------------------------------------------------------
    # Offsets as memoryviews of native uint64 (an item is a Python int: no numpy call, whose machinery costs
    # microseconds once a scoring pass has flushed the caches), blobs as ``mmap`` objects (a slice is ``bytes`` at
    # once; a numpy slice and ``tobytes`` cost 3x that).
    @cached_property
    def _docids_blob(self) -> mmap.mmap | bytes:
        return _map_blob(self._docids[0])

    @cached_property
    def _docids_offsets(self) -> memoryview:
        return _offsets(self._docids[1])

    @cached_property
    def _docids_offsets_array(self) -> np.ndarray:
        return np.asarray(self._docids[1])

    @cached_property
    def _docids_blob_array(self) -> np.ndarray:
        return np.frombuffer(self._docids_blob, dtype=np.uint8)

    @cached_property
    def _store_blob(self) -> mmap.mmap | bytes:
        return _map_blob(self._store[0])

    @cached_property
    def _store_offsets(self) -> memoryview:
        return _offsets(self._store[1])

    def external_id(self, docid: int) -> str:
        off = self._docids_offsets
        return self._docids_blob[off[docid]:off[docid + 1]].decode("utf-8")

    def external_ids(self, docids: np.ndarray | list[int]) -> list[str]:
        """The external ids of many internal docids.

        From 32 ids, numpy gathers the offsets and touches the blob's lines first: its loop has every (random) read
        in flight at once, where the Python loop waits for each in turn (1,000 random ids of 1M: 420 -> 155 us).
        Fewer ids are read without numpy, whose calls cost more than they save there."""
        blob = self._docids_blob
        if len(docids) < 32:
            off = self._docids_offsets
            ids = docids.tolist() if isinstance(docids, np.ndarray) else docids
            return [blob[off[d]:off[d + 1]].decode("utf-8") for d in ids]
        d = np.asarray(docids, dtype=np.int64)
        off = self._docids_offsets_array
        starts, ends = off[d], off[d + 1]
        if len(blob):
            self._docids_blob_array.take(starts, mode="clip")
        return [blob[a:b].decode("utf-8") for a, b in zip(starts.tolist(), ends.tolist())]

    def document(self, docid: int) -> tuple[str, str]:
        """(title, text) of an internal docid."""
        off = self._store_offsets
        title, _, text = self._store_blob[off[docid]:off[docid + 1]].decode("utf-8").partition(L.FIELD_SEPARATOR)
        return title, text

    # -- postings ------------------------------------------------------------------------------
    def postings(self, term_id: int) -> tuple[np.ndarray, np.ndarray]:
        """All (docid, tf) of a term across shards, docid ascending (for tests and tools)."""
        docs, tfs = [], []
        mask = np.uint32((1 << self.tf_bits) - 1)
        for sh in self.shards:
            e0, e1 = int(sh.term_ptr[term_id]), int(sh.term_ptr[term_id + 1])
            for e in range(e0, e1):
                p = np.asarray(sh.postings[int(sh.blk_start[e]):int(sh.blk_start[e + 1])])
                docs.append(int(sh.blk_id[e]) * self.block_size + (p >> np.uint32(self.tf_bits)).astype(np.int64))
                tfs.append((p & mask).astype(np.int64))
        if not docs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(docs), np.concatenate(tfs)


def _offsets(a: np.ndarray) -> memoryview:
    """A layout's little-endian u64 offsets as a memoryview of native uint64 (copied only on a big-endian host)."""
    return memoryview(np.ascontiguousarray(a, dtype=np.uint64)).cast("B").cast("Q")


def _map_blob(path: Path) -> mmap.mmap | bytes:
    """A read-only map of a whole file (an empty file cannot be mapped: its contents, b"")."""
    if path.stat().st_size == 0:
        return b""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
