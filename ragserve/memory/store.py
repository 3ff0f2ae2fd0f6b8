"""A persisted memory bank: texts added, recalled by meaning, listed and deleted by id, kept in a directory.

The entries live in a ``MemoryBank`` (the same relevancy + top-k kernels: cpu, gpu, fpga-sim) and every change
is first a record of an append-only log (``indexer.wal``), fsynced before the call returns: an acknowledged add
or delete survives a crash (``kill -9``, power loss), and one add of several texts is one record, so it is there
whole or not at all. Opening the directory replays the log into a fresh bank; replaying the same records in the
same order rebuilds the same bank (slots, ties, evictions), so a search after a restart finds the same hits with
the same scores. The embeddings are logged with their texts, so a replay never re-embeds. When more entries have
been deleted or evicted than are alive, the log is rewritten (atomically) with just the live entries.

Directory: ``memory.json`` (settings: the encoder's identity, dimension, capacity), ``memory.log`` and ``lock``
(one process at a time holds the directory).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from indexer.wal import AppendLog, LogError, fsync_dir, read_records
from ragserve.memory.bank import BACKENDS, MemoryBank, MemoryBankError

FORMAT = 1
SETTINGS, LOG, LOCK = "memory.json", "memory.log", "lock"
DEFAULT_CAPACITY = 65536
COMPACT_MIN_DEAD = 1024  # dead entries in the log before a rewrite is worth it
COMPACT_CHUNK = 4096  # live entries per record of a rewritten log
_JSON_LEN = struct.Struct("<I")
logger = logging.getLogger("ragserve.memory")


class MemoryStoreError(ValueError):
    """Bad settings or input, a directory that is not a memory bank, or one held by another process."""


@dataclass
class MemoryEntry:
    id: int
    text: str
    metadata: dict = field(default_factory=dict)
    created: float = 0.0  # seconds since the epoch

    def to_dict(self) -> dict:
        return {"id": self.id, "text": self.text, "metadata": self.metadata, "created": self.created}


@dataclass
class MemoryHit:
    entry: MemoryEntry
    score: float  # the inner product of the query's and the entry's embeddings (cosine for unit vectors)

    def to_dict(self) -> dict:
        return {"id": self.entry.id, "score": self.score, "text": self.entry.text,
                "metadata": self.entry.metadata, "created": self.entry.created}


def _encode_record(head: dict, vectors: np.ndarray | None = None) -> bytes:
    # ASCII: a lone surrogate (which JSON input may carry) is kept escaped rather than failing to encode
    js = json.dumps(head, separators=(",", ":")).encode("ascii")
    vec = b"" if vectors is None else np.ascontiguousarray(vectors, dtype="<f4").tobytes()
    return _JSON_LEN.pack(len(js)) + js + vec


def _decode_record(payload: bytes, dim: int) -> tuple[dict, np.ndarray]:
    (n,) = _JSON_LEN.unpack_from(payload)
    head = json.loads(payload[_JSON_LEN.size:_JSON_LEN.size + n])
    vec = np.frombuffer(payload, dtype="<f4", offset=_JSON_LEN.size + n).astype(np.float32)
    return head, vec.reshape(-1, dim)


def check_metadata(value, what: str = "metadata") -> dict:
    """A JSON object (of JSON values): what an entry may carry besides its text."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MemoryStoreError(f"{what} must be a JSON object, got {type(value).__name__}")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise MemoryStoreError(f"{what} must hold only JSON values: {e}") from None
    return value


def _check_texts(texts: list, what: str) -> None:
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise MemoryStoreError(f"{what} must be non-empty strings")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:  # the tokenizer would refuse it
            raise MemoryStoreError(f"{what} must be valid Unicode text (one holds a lone surrogate)") from None


class MemoryStore:
    """A memory bank kept in ``path``. ``model``: the sentence encoder (a model directory) for a new bank; an
    existing one uses the encoder it was made with (or ``model``/``embedder``, which must be that one).
    ``backend`` (cpu, gpu, fpga-sim) is where recall runs, chosen at each open. Thread-safe; one process at a
    time (``MemoryStoreError`` names the holder otherwise). ``create=False``: the bank must exist."""

    def __init__(self, path: str | Path, model: str | Path | None = None, *, backend: str = "cpu",
                 device: str | None = None, capacity: int | None = None, embed_device: str = "cpu",
                 embedder=None, create: bool = True) -> None:
        self.path = Path(path)
        if backend not in BACKENDS:
            raise MemoryStoreError(f"memory backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        settings_file = self.path / SETTINGS
        exists = settings_file.is_file()
        if not exists:
            if not create:
                raise MemoryStoreError(f"{self.path} is not a memory bank (no {SETTINGS})")
            if self.path.exists() and (not self.path.is_dir() or {p.name for p in self.path.iterdir()} - {LOCK}):
                raise MemoryStoreError(f"{self.path} exists and is not a memory bank; give a new or empty directory")
            if model is None and embedder is None:
                raise MemoryStoreError(f"{self.path} is a new memory bank: give the sentence encoder that makes "
                                       f"its embeddings (a model directory)")
        self._lock_fd = None
        try:
            self._lock_fd = self._take_lock()
            self._embedder, self._model, self._embed_device = embedder, model, embed_device
            self._checked = False  # the encoder checked against the bank's settings
            if exists:
                self.settings = self._read_settings(settings_file)
                if capacity is not None and capacity != self.settings["capacity"]:
                    raise MemoryStoreError(f"the memory bank {self.path} holds {self.settings['capacity']} entries; "
                                           f"its capacity is fixed when it is made (asked for {capacity})")
                if embedder is not None or model is not None:  # one given: check it now
                    self.embedder  # noqa: B018
            else:
                self.settings = self._write_settings(capacity or DEFAULT_CAPACITY)
            self.dim, self.capacity, self.backend = self.settings["dim"], self.settings["capacity"], backend
            self.bank = MemoryBank(self.dim, self.capacity, backend, device)
            self.entries: dict[int, MemoryEntry] = {}  # oldest first (ids only grow)
            self.next_id = 0
            self._dead = 0  # entries in the log that are no longer alive (deleted, evicted)
            self._mutex = threading.RLock()
            self._encode_mutex = threading.Lock()  # a fast tokenizer refuses concurrent calls
            self.log = AppendLog(self.path / LOG)
            for n, payload in enumerate(self.log.replay()):
                try:
                    head, vectors = _decode_record(payload, self.dim)
                except (ValueError, KeyError, struct.error) as e:  # whole (its checksum held), so not a crash's
                    raise MemoryStoreError(f"{self.path / LOG}: record {n} is not a memory record: {e}") from None
                self._apply(head, vectors)
        except (MemoryBankError, LogError) as e:
            self._release_lock()
            raise MemoryStoreError(str(e)) from None
        except OSError as e:  # a folder that cannot be made, a file that cannot be read or written
            self._release_lock()
            raise MemoryStoreError(f"cannot open the memory bank {self.path}: {e.strerror or e}"
                                   + (f" ({e.filename})" if e.filename else "")) from None
        except BaseException:
            self._release_lock()
            raise

    # -- opening -------------------------------------------------------------------------------------
    def _take_lock(self) -> int:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise MemoryStoreError(f"the memory bank {self.path} is in use by another process (pid {holder}); "
                                   f"use that one (a server's /v1/memory) or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    @property
    def embedder(self):
        """The sentence encoder, loaded on first use (listing and deleting never need it), checked to be the
        one the bank was made with."""
        if self._embedder is None:
            from ragserve.retrieval.embedder import Embedder

            self._embedder = Embedder(self._model or self.settings["encoder"]["path"], device=self._embed_device)
        if not self._checked:
            self._embedder.check_same_model(self.settings["encoder"], f"the memory bank {self.path}")
            self._checked = True
        return self._embedder

    def _read_settings(self, f: Path) -> dict:
        try:
            s = json.loads(f.read_text(encoding="utf-8"))
            if s.get("format") != FORMAT:
                raise MemoryStoreError(f"{f}: memory bank format {s.get('format')!r}, this ragserve reads {FORMAT}")
            s["dim"], s["capacity"], s["encoder"]["path"]  # noqa: B018 - the keys every bank has
            return s
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise MemoryStoreError(f"{f}: unreadable memory bank settings: {e}") from None

    def _write_settings(self, capacity: int) -> dict:
        if capacity < 1:
            raise MemoryStoreError(f"a memory bank's capacity must be at least 1, got {capacity}")
        if self._embedder is None:
            from ragserve.retrieval.embedder import Embedder

            self._embedder = Embedder(self._model, device=self._embed_device)
        s = {"format": FORMAT, "dim": self._embedder.dim, "capacity": capacity,
             "encoder": self._embedder.info.to_dict(), "created": time.time()}
        tmp = self.path / (SETTINGS + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(s, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / SETTINGS)
        fsync_dir(self.path)
        return s

    # -- the log -------------------------------------------------------------------------------------
    def _apply(self, head: dict, vectors: np.ndarray) -> list[int]:
        """One record, applied to the bank and the entries (live or in a replay: the same code, the same bank)."""
        op = head["op"]
        if op == "add":
            ids = head["ids"]
            if len(ids) != vectors.shape[0]:
                raise MemoryStoreError(f"{self.path / LOG}: an add record with {len(ids)} ids and "
                                       f"{vectors.shape[0]} embeddings")
            created = head["created"]  # one time for an add; each entry's own in a rewritten log
            created = created if isinstance(created, list) else [created] * len(ids)
            for i, text, meta, t in zip(ids, head["texts"], head["metadata"], created):
                self.entries[i] = MemoryEntry(i, text, meta, t)
            evicted = self.bank.insert(vectors, ids)
            for i in evicted:
                del self.entries[i]
            self._dead += len(evicted)
            self.next_id = max(self.next_id, max(ids) + 1)
            return evicted
        if op == "delete":
            removed = self.bank.remove(head["ids"])
            for i in removed:
                del self.entries[i]
            self._dead += len(removed)
            return removed
        if op == "next_id":  # the first record of a rewritten log: ids are never reused
            self.next_id = max(self.next_id, head["next_id"])
            return []
        raise MemoryStoreError(f"{self.path / LOG}: unknown record {op!r}")

    def _commit(self, head: dict, vectors: np.ndarray | None = None) -> list[int]:
        """Log the record (fsynced), then apply it: what a caller is told happened is on disk."""
        self.log.append(_encode_record(head, vectors))
        return self._apply(head, vectors if vectors is not None else np.zeros((0, self.dim), np.float32))

    def _maybe_compact(self) -> None:
        """After a committed change: its caller is answered whatever happens here (the log is still whole)."""
        if self._dead >= max(COMPACT_MIN_DEAD, len(self.entries)):
            try:
                self.compact()
            except OSError as e:
                logger.warning("memory bank %s: the log could not be compacted (%s); kept as it is", self.path, e)

    def compact(self) -> None:
        """Rewrite the log with only the live entries (atomically), then order the bank as its replay will."""
        with self._mutex:
            live = list(self.entries.values())
            vecs = self._live_vectors()

            def records() -> Iterator[bytes]:
                yield _encode_record({"op": "next_id", "next_id": self.next_id})
                for c in range(0, len(live), COMPACT_CHUNK):
                    part = live[c:c + COMPACT_CHUNK]
                    yield _encode_record({"op": "add", "ids": [e.id for e in part], "texts": [e.text for e in part],
                                          "metadata": [e.metadata for e in part],
                                          "created": [e.created for e in part]}, vecs[c:c + len(part)])

            self.log.rewrite(records())
            self.bank.remove([])
            self._dead = 0

    def _live_vectors(self) -> np.ndarray:
        """The live entries' embeddings, oldest first, exactly as logged."""
        if self.backend != "gpu":
            return np.asarray(self.bank.keys[self.bank.slots_by_age()])
        # a gpu bank holds fp16 copies: the f32 embeddings come from the log itself
        found: dict[int, np.ndarray] = {}
        for payload in read_records(self.path / LOG):
            head, vecs = _decode_record(payload, self.dim)
            for j, i in enumerate(head.get("ids", []) if head["op"] == "add" else []):
                if i in self.entries:
                    found[i] = vecs[j]
        return np.stack([found[i] for i in self.entries]) if found else np.zeros((0, self.dim), np.float32)

    # -- the API -------------------------------------------------------------------------------------
    def _encode(self, texts: list[str]) -> np.ndarray:
        with self._encode_mutex:
            return self.embedder.encode(texts)

    def add(self, texts: Sequence[str], metadata: Sequence[dict | None] | None = None) -> list[int]:
        """Store the texts (one write: all of them or, after a crash, none); returns their new ids. Once it
        returns they are on disk. The oldest entries leave once ``capacity`` are held."""
        return self.add_with_evictions(texts, metadata)[0]

    def add_with_evictions(self, texts: Sequence[str], metadata: Sequence[dict | None] | None = None
                           ) -> tuple[list[int], list[int]]:
        """``add``, and the ids it evicted (oldest first)."""
        texts = list(texts)
        if not texts:
            raise MemoryStoreError("nothing to add: give at least one text")
        _check_texts(texts, "memory texts")
        metadata = [None] * len(texts) if metadata is None else list(metadata)
        if len(metadata) != len(texts):
            raise MemoryStoreError(f"{len(texts)} texts but {len(metadata)} metadata objects")
        metadata = [check_metadata(m) for m in metadata]
        vectors = self._encode(texts)
        with self._mutex:
            self._check_open()
            ids = list(range(self.next_id, self.next_id + len(texts)))
            evicted = self._commit({"op": "add", "ids": ids, "texts": texts, "metadata": metadata,
                                    "created": time.time()}, vectors)
            self._maybe_compact()
            return ids, evicted

    def delete(self, ids: Sequence[int]) -> list[int]:
        """Forget these entries (one write); returns the ids that were held (the others are not an error)."""
        ids = [int(i) for i in ids]
        with self._mutex:
            self._check_open()
            held = [i for i in dict.fromkeys(ids) if i in self.entries]
            if held:
                self._commit({"op": "delete", "ids": held})
                self._maybe_compact()
            return held

    def get(self, id: int) -> MemoryEntry | None:
        with self._mutex:
            return self.entries.get(int(id))

    def list(self, after: int | None = None, limit: int = 100) -> list[MemoryEntry]:
        """Entries oldest first (by id), those with an id above ``after``, at most ``limit``."""
        with self._mutex:
            it = iter(self.entries.values())
            if after is not None:
                it = (e for e in it if e.id > after)
            return list(islice(it, max(0, limit)))

    def __len__(self) -> int:
        return len(self.entries)

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[MemoryHit]]:
        """Each query's top-k entries by the inner product of the embeddings, best first (ties: the older)."""
        queries = list(queries)
        _check_texts(queries, "queries")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise MemoryStoreError(f"k must be an integer >= 1, got {k!r}")
        qv = self._encode(queries)
        with self._mutex:
            self._check_open()
            try:
                recalls = self.bank.recall(qv, int(k))
            except MemoryBankError as e:
                raise MemoryStoreError(str(e)) from None
            return [[MemoryHit(self.entries[int(i)], float(s)) for i, s in zip(r.ids, r.scores)] for r in recalls]

    def search(self, query: str, k: int = 5) -> list[MemoryHit]:
        return self.search_batch([query], k)[0]

    def describe(self) -> dict:
        return {"path": str(self.path), "entries": len(self), "capacity": self.capacity, "dim": self.dim,
                "backend": self.backend, "encoder": self.settings["encoder"]["name"], "next_id": self.next_id,
                "log_bytes": self.log.size}

    def _check_open(self) -> None:
        if self._lock_fd is None:
            raise MemoryStoreError(f"the memory bank {self.path} is closed")

    def close(self) -> None:
        with self._mutex:
            if self._lock_fd is not None:
                self.log.close()
                self._release_lock()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["MemoryEntry", "MemoryHit", "MemoryStore", "MemoryStoreError", "DEFAULT_CAPACITY"]
