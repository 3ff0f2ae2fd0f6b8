"""A live index (``indexer/FORMAT.md``, "Live index"): documents added, replaced and deleted without a rebuild.

The index is a list of **segments**, each a complete version-1 index directory (written by ``indexer.writer``)
that never changes once written, plus a **tombstone** list per segment (its deleted local docids). The
**commit** (``live/commit.json``, replaced by an atomic rename) names the segments in order, their tombstone files
and the last write-ahead-log sequence number they include. Every write request is one record of the
write-ahead log (``indexer.wal``), on disk before it is acknowledged; a **refresh** turns the requests logged
since the last commit into a new delta segment and new tombstones and commits them; a **merge** folds a run of
adjacent segments into one, dropping their deleted documents, and swaps it in with a commit.

Scoring is exact: a ``Snapshot`` holds the live collection's statistics (documents, summed lengths, each term's
df over live documents only), so every segment is scored with the numbers a fresh build of the live documents
would have, and a live document's global docid is its position in "last-written order" (segments in order,
each one's live documents in local order): exactly the docid of that fresh build, which breaks ties.

Readers never wait for writers: a snapshot is immutable, ``LiveIndex.snapshot()`` returns the current one, and
a refresh or merge publishes a new one by replacing a reference.

An index whose plain form had a flat dense part keeps one per segment (``settings.dense``): a ``DenseWriter``
(``ragserve.retrieval.live_dense``, registered on import: this layer runs no model) embeds a new segment's passages
at its refresh and copies rows into a merged one, both before the commit that names the segment.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Protocol

import numpy as np

from indexer import bm25
from indexer import layout as L
from indexer.analyzer import Analyzer
from indexer.readers.model import Document
from indexer.reader import IndexReader, InvalidIndexError
from indexer.wal import AppendLog, fsync_dir
from indexer.analysis import indexed_text
from indexer.options import BuildOptions
from indexer.writer import build_index_from_documents

LIVE_FORMAT = "ragserve-live"
LIVE_VERSION = 1
LIVE_VERSION_DENSE = 2  # a commit whose segments carry a dense part (``settings.dense``): older readers refuse it
LIVE_DIR = "live"
COMMIT = "commit.json"
WAL = "wal.log"
LOCK = "write.lock"
MAX_ID_BYTES = 1024
SMALL_SEGMENT = 1 << 15  # documents below which a segment is a small one (a delta: its terms are looked up together)


class LiveIndexError(ValueError):
    """A bad write (unknown id, bad document) or a live index that cannot be opened as asked."""


class LiveIndexLocked(LiveIndexError):
    """Another process holds the index open for writing."""


class DenseWriter(Protocol):
    """Writes the dense part of a live index's segments (``ragserve.retrieval.live_dense``: it embeds with the
    encoder the dense part records; the index layer itself runs no model)."""

    def prefetch(self, docs: list[tuple[str, str]]) -> None:
        """Embed these (title, text) passages now, before the refresh takes the write lock (optional work)."""

    def write_segment(self, seg: Path) -> None:
        """Write ``seg/dense/`` for the new segment at ``seg``: every stored passage embedded."""

    def write_merged(self, seg: Path, parts: list[tuple[IndexReader, np.ndarray]]) -> None:
        """Write ``seg/dense/`` for a merged segment: the rows ``docs`` of each part's dense part, in order."""


# Made by ``ragserve.retrieval.live_dense`` (registered when imported): ``factory(settings["dense"], model)``.
_dense_writer_factory: Callable[[dict, str | None], DenseWriter] | None = None


def register_dense_writer(factory: Callable[[dict, str | None], DenseWriter]) -> None:
    global _dense_writer_factory
    _dense_writer_factory = factory


def dense_settings(root: Path) -> dict | None:
    """What a live index keeps of the plain index's dense part at ``root`` (None: it has none); ``LiveIndexError``
    where writes cannot keep it exact."""
    mpath = root / L.DENSE_DIR / L.MANIFEST
    if not (root / L.DENSE_DIR).is_dir():
        return None
    try:
        m = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LiveIndexError(f"{root / L.DENSE_DIR}: unreadable dense part ({e}); rebuild it with "
                             f"`ragserve index-dense {root} --model MODEL --overwrite`") from None
    kind = m.get("faiss", {}).get("kind")
    if kind != "flat":
        raise LiveIndexError(f"{root} has a dense part of faiss kind {kind!r}; writes need the exact kind 'flat' "
                             f"(rebuild it with `ragserve index-dense {root} --model MODEL --faiss flat --overwrite`)")
    emb = m.get("embedding") or {}
    if emb.get("batching") != L.DENSE_BATCHING:
        raise LiveIndexError(f"{root}'s dense part was embedded in padded batches (an older ragserve), so an added "
                             f"passage's vector could differ from a fresh build's; rebuild it with `ragserve "
                             f"index-dense {root} --model MODEL --overwrite` to take writes")
    return {"encoder": m["encoder"], "embedding": emb, "dim": m["dim"], "kind": kind}


def is_live(path: str | Path) -> bool:
    return (Path(path) / LIVE_DIR / COMMIT).is_file()


def _fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then the directories themselves (the writer syncs only its manifest). The
    files are flushed from several threads at once: a segment has a few dozen, and a journaling file system
    commits concurrent flushes together (measured: a refresh's syncs 3x faster than one after another)."""
    files, dirs = [], []
    for d, _, names in os.walk(root):
        dirs.append(d)
        files += [os.path.join(d, n) for n in names]

    def sync(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(sync, files))
        list(pool.map(fsync_dir, dirs[::-1]))


def _write_durably(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all, and on disk when this returns."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def build_segment(docs: Iterable[Document], out: Path, options: BuildOptions) -> None:
    """Write ``docs`` as a version-1 index at ``out``, durably. A refresh and a merge may build at once in two
    threads: each in-process build analyses with state of its own."""
    build_index_from_documents(docs, out, options)
    _fsync_tree(out)


def document_terms(analyzer: Analyzer, title: str, text: str) -> tuple[Counter, int]:
    """(term -> tf, length) of a document as the writer indexes it (title and text as one field)."""
    return analyzer.term_counts(indexed_text(title, text))


# ---------------------------------------------------------------------------------------------
# Segments and snapshots (the read side)

class SegmentState:
    """One segment as one snapshot sees it: its index, its deleted docs, and the statistics of its live docs."""

    def __init__(self, name: str, reader: IndexReader, deleted: np.ndarray, n_live: int, doc_count: int,
                 sum_tf: int, df: np.ndarray) -> None:
        self.name = name
        self.reader = reader
        self.deleted = deleted  # int64 local docids, ascending
        self.n_live = n_live
        self.doc_count = doc_count  # live docs with at least one token
        self.sum_tf = sum_tf
        self.df = df  # int64 per local term id: live documents holding the term

    @classmethod
    def open(cls, name: str, reader: IndexReader, deleted: np.ndarray | None = None) -> "SegmentState":
        st = reader.manifest["stats"]
        # Everything a search may read later is opened now: a merge may delete the directory while an old
        # snapshot still serves (an open map outlives the unlink).
        reader._docids_blob, reader._store_blob, reader.term_ids  # noqa: B018 (cached properties)
        s = cls(name, reader, np.zeros(0, np.int64), reader.num_docs, st["doc_count"], st["sum_total_tf"],
                np.asarray(reader.df, dtype=np.int64))
        return s.with_deletes(deleted) if deleted is not None and deleted.size else s

    def with_deletes(self, new: Iterable[int]) -> "SegmentState":
        """This segment with the local docids ``new`` deleted too: the live statistics lose each document's
        length and terms (analysed again from its stored passage, exactly as the writer analysed it)."""
        new = np.setdiff1d(np.asarray(list(new) if not isinstance(new, np.ndarray) else new, dtype=np.int64),
                           self.deleted)
        if not new.size:
            return self
        df = self.df.copy()
        doc_count, sum_tf = self.doc_count, self.sum_tf
        ids = self.reader.term_ids
        an = self.reader.analyzer
        for d in new.tolist():
            counts, length = document_terms(an, *self.reader.document(d))
            if length:
                doc_count -= 1
                sum_tf -= length
            for t in counts:
                df[ids[t]] -= 1
        return SegmentState(self.name, self.reader, np.union1d(self.deleted, new), self.n_live - int(new.size),
                            doc_count, sum_tf, df)

    def is_deleted(self, local: np.ndarray) -> np.ndarray:
        if not self.deleted.size:
            return np.zeros(local.shape, bool)
        pos = np.searchsorted(self.deleted, local)
        return (pos < self.deleted.size) & (self.deleted[np.minimum(pos, self.deleted.size - 1)] == local)

    def live_rank(self, local: np.ndarray) -> np.ndarray:
        """Position of live local docids among the segment's live docs."""
        return local - np.searchsorted(self.deleted, local) if self.deleted.size else local

    @cached_property
    def deleted_mask(self) -> np.ndarray:
        """u8 per local docid, 1 where deleted (an empty array where none is): what the cpu kernels skip."""
        if not self.deleted.size:
            return np.zeros(0, np.uint8)
        out = np.zeros(self.reader.num_docs, np.uint8)
        out[self.deleted] = 1
        return out

    @cached_property
    def live_docs(self) -> np.ndarray:
        """Local docids of the live documents, ascending."""
        return np.setdiff1d(np.arange(self.reader.num_docs, dtype=np.int64), self.deleted, assume_unique=True)


@dataclass(frozen=True)
class LiveQuery:
    """An analysed query against one snapshot: the terms with live df > 0 (ascending by UTF-8 bytes, the
    canonical order), their f32 weights from the live statistics, and their term ids in each segment."""

    terms: tuple[str, ...]
    weights: np.ndarray  # f32, boost * idf(live df, live doc count)
    boosts: np.ndarray  # f32
    local: np.ndarray  # int64 [segments, terms]: each term's id in each segment, -1 where absent
    small_rows: np.ndarray  # int64 [terms]: each term's row in ``Snapshot.small_terms``, -1 where absent


class Snapshot:
    """The live index at one commit: segments in order, global statistics. Immutable."""

    def __init__(self, generation: int, segments: tuple[SegmentState, ...], settings: dict,
                 before: "Snapshot | None" = None) -> None:
        """``before``: the snapshot this one follows, whose ``small_terms`` (if built) this one extends rather than
        builds again (not kept: snapshots do not chain)."""
        self.generation = generation
        self.segments = segments
        self.settings = settings
        self.k1: float = settings["bm25"]["k1"]
        self.b: float = settings["bm25"]["b"]
        self.analyzer = Analyzer.from_config(settings["analyzer"])
        self.num_docs = sum(s.n_live for s in segments)
        self.doc_count = sum(s.doc_count for s in segments)
        self.sum_total_tf = sum(s.sum_tf for s in segments)
        self.avgdl = bm25.avgdl_f32(self.sum_total_tf, self.doc_count)
        self.offsets = np.cumsum([0] + [s.n_live for s in segments]).astype(np.int64)
        # The large segments' term lookups and live dfs, one by one; the small ones' together (``small_terms``).
        self._large = [(si, s.reader.term_ids.get, s.df) for si, s in enumerate(segments)
                       if s.reader.num_docs >= SMALL_SEGMENT]
        self._small_before = before.__dict__.get("small_terms_by_name") if before is not None else None

    @property
    def small_terms(self) -> tuple[np.ndarray, dict[str, int], np.ndarray, np.ndarray]:
        """The small segments' vocabularies as one: (their indexes, term -> row, [rows + 1, small segments] term
        ids (-1: absent; the last row is all -1, for terms none holds), [rows + 1] summed live df). A query's
        terms are then looked up once, not once a segment: with 10 delta segments that lookup was a tenth of a
        1M-passage search. Built once a snapshot (``LiveSearcher`` asks before the snapshot is published)."""
        return self.small_terms_by_name[1:]

    @cached_property
    def small_terms_by_name(self) -> tuple[tuple[str, ...], np.ndarray, dict[str, int], np.ndarray, np.ndarray]:
        """``small_terms`` with the small segments' names first. Where the snapshot before had it and its small
        segments lead this one's (a refresh adds a delta at the end), its vocabulary is extended by the new
        segments' terms alone: the dict and the id table copied, not rebuilt (measured at 1M with 10-15 deltas:
        65-230 ms a refresh to build, under the index's write lock)."""
        small = [si for si, s in enumerate(self.segments) if s.reader.num_docs < SMALL_SEGMENT]
        names = tuple(self.segments[si].name for si in small)
        got, self._small_before = self._small_before, None
        old = 0
        if got is not None and names[:len(got[0])] == got[0]:
            old = len(got[0])
            row = dict(got[2])
        else:
            row = {}
        vocab = [self.segments[si].reader.term_ids for si in small[old:]]
        for v in vocab:
            for t in v:
                row.setdefault(t, len(row))
        ids = np.full((len(row) + 1, len(small)), -1, np.int64)
        if old:
            n_old = len(got[2])
            ids[:n_old, :old] = got[3][:n_old]
        for j, v in enumerate(vocab, start=old):
            r = np.fromiter(map(row.__getitem__, v), np.int64, len(v))
            ids[r, j] = np.fromiter(v.values(), np.int64, len(v))
        df = np.zeros(len(row) + 1, np.int64)
        for j, si in enumerate(small):  # every segment's live df: deletes since the snapshot before change it
            col = ids[:, j]
            there = col >= 0
            df[there] += self.segments[si].df[col[there]]
        return names, np.array(small, np.int64), row, ids, df

    def prepare(self, query: str) -> LiveQuery:
        """Distinct query terms boosted by their count in the query, weighted with the live idf (``bm25``)."""
        counts = Counter(self.analyzer.analyze(query))
        terms = sorted(counts, key=lambda t: t.encode("utf-8"))
        n = len(terms)
        absent = [-1] * n
        ids = np.empty((len(self.segments), n), np.int64)
        small, row, small_ids, small_df = self.small_terms
        none = small_df.size - 1  # the all-absent row
        rows = np.array(list(map(row.get, terms, [none] * n)), np.int64)
        if small.size:
            ids[small] = small_ids[rows].T
            dfs = small_df[rows].tolist()
        else:
            dfs = [0] * n
        rows[rows == none] = -1
        for si, get, df in self._large:
            local = list(map(get, terms, absent))
            ids[si] = local
            for j, t in enumerate(local):
                if t >= 0:
                    dfs[j] += df.item(t)
        keep = [j for j, d in enumerate(dfs) if d > 0]  # a term only deleted documents hold is unknown
        if len(keep) < n:
            terms = [terms[j] for j in keep]
            dfs = [dfs[j] for j in keep]
            ids = ids[:, keep]
            rows = rows[keep]
        boosts = np.array([counts[t] for t in terms], dtype=np.float32)
        idf = bm25.idf_f32(np.array(dfs, dtype=np.int64), self.doc_count)
        return LiveQuery(tuple(terms), (boosts * idf).astype(np.float32), boosts, ids, rows)

    def segment_terms(self, q: LiveQuery, si: int) -> bm25.QueryTerms | None:
        """The query in segment ``si``'s term ids (None: it holds none of its terms). Ascending as they come: every
        segment's vocabulary is sorted by UTF-8 bytes, the canonical order the query's terms are in."""
        ids = q.local[si]
        there = ids >= 0
        if there.all():
            return bm25.QueryTerms(term_ids=ids.astype(np.uint32), boosts=q.boosts, weights=q.weights)
        if not there.any():
            return None
        return bm25.QueryTerms(term_ids=ids[there].astype(np.uint32), boosts=q.boosts[there],
                               weights=q.weights[there])

    def locate(self, docid: int) -> tuple[SegmentState, int]:
        """(segment, local docid) of a global docid."""
        if not 0 <= docid < self.num_docs:
            raise IndexError(f"docid {docid} out of range")
        si = int(np.searchsorted(self.offsets, docid, side="right")) - 1
        s = self.segments[si]
        r = docid - int(self.offsets[si])
        return s, (int(s.live_docs[r]) if s.deleted.size else r)

    def external_id(self, docid: int) -> str:
        s, local = self.locate(docid)
        return s.reader.external_id(local)

    def document(self, docid: int) -> tuple[str, str]:
        s, local = self.locate(docid)
        return s.reader.document(local)

    def documents(self) -> Iterable[tuple[str, str, str]]:
        """Every live document (id, title, text) in global docid order."""
        for s in self.segments:
            yield from _live_documents(s)


# ---------------------------------------------------------------------------------------------
# The commit (the durable state)

@dataclass
class Commit:
    generation: int
    seq: int  # the last write-ahead-log record the segments include
    settings: dict
    segments: list[dict] = field(default_factory=list)  # {"name", "docs", "tombstones", "deleted", "crc32"}
    next_segment: int = 0

    def to_json(self) -> dict:
        version = LIVE_VERSION_DENSE if "dense" in self.settings else LIVE_VERSION
        return {"format": LIVE_FORMAT, "version": version, "generation": self.generation, "seq": self.seq,
                "settings": self.settings, "segments": self.segments, "next_segment": self.next_segment}

    @classmethod
    def read(cls, live: Path) -> "Commit":
        path = live / COMMIT
        try:
            m = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InvalidIndexError(f"{path}: unreadable live-index commit: {e}") from e
        if m.get("format") != LIVE_FORMAT:
            raise InvalidIndexError(f"{path}: not a ragserve live index (format {m.get('format')!r})")
        if m.get("version") not in (LIVE_VERSION, LIVE_VERSION_DENSE):
            raise InvalidIndexError(f"{path}: live-index version {m.get('version')} is not supported (this ragserve "
                                    f"reads versions {LIVE_VERSION} and {LIVE_VERSION_DENSE})")
        return cls(m["generation"], m["seq"], m["settings"], m["segments"], m["next_segment"])

    def write(self, live: Path) -> None:
        _write_durably(live / COMMIT, json.dumps(self.to_json(), indent=1).encode())


def _read_tombstones(live: Path, seg: dict) -> np.ndarray:
    name = seg.get("tombstones")
    if not name:
        return np.zeros(0, np.int64)
    data = (live / name).read_bytes()
    if len(data) != 4 * seg["deleted"] or zlib.crc32(data) != seg["crc32"]:
        raise InvalidIndexError(f"{live / name}: tombstone file does not match the commit; the index is corrupt")
    return np.frombuffer(data, dtype="<u4").astype(np.int64)


def _settings_of(manifest: dict) -> dict:
    lay = manifest["layout"]
    return {"analyzer": manifest["analyzer"], "bm25": manifest["bm25"], "block_size": lay["block_size"],
            "bank_bytes": lay["bank_bytes"], "fine_block": lay.get("fine_block", L.DEFAULT_FINE_BLOCK)}


def default_settings() -> dict:
    o = BuildOptions()
    return {"analyzer": Analyzer(o.analyzer).config_dict(), "bm25": {"k1": o.k1, "b": o.b},
            "block_size": o.block_size, "bank_bytes": o.bank_bytes, "fine_block": o.fine_block}


def _convert(root: Path) -> None:
    """Make the plain index at ``root`` the first segment of a live index, without copying: its files are linked
    into ``live/seg_000000/``, the commit is written, and ``live/`` appears by one rename; the root's own layout
    files are removed after that (from then on ``live/`` is the index, and an unfinished removal is finished at
    the next open)."""
    IndexReader(root)  # a complete index, or a clear error
    dense = dense_settings(root)
    tmp = root / f".{LIVE_DIR}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    seg = tmp / "seg_000000"
    seg.mkdir(parents=True)
    manifest = json.loads((root / L.MANIFEST).read_text())
    names = [*manifest["files"], L.MANIFEST]
    if dense is not None:  # the dense part goes with the layout: segment 0's own dense part
        names += [f"{L.DENSE_DIR}/{p.name}" for p in sorted((root / L.DENSE_DIR).iterdir()) if p.is_file()]
    for name in names:
        (seg / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(root / name, seg / name)
    _fsync_tree(tmp)
    settings = _settings_of(manifest)
    if dense is not None:
        settings["dense"] = dense
    Commit(0, 0, settings, [{"name": "seg_000000", "docs": manifest["stats"]["num_docs"],
                             "tombstones": None, "deleted": 0, "crc32": 0}], 1).write(tmp)
    os.rename(tmp, root / LIVE_DIR)
    fsync_dir(root)
    _remove_plain_layout(root)


def _remove_plain_layout(root: Path) -> None:
    """The root's version-1 files left from a conversion (its dense part, then the manifest: the root then is no
    plain index, then the rest)."""
    m = root / L.MANIFEST
    if not m.is_file():
        return
    names = list(json.loads(m.read_text())["files"])
    shutil.rmtree(root / L.DENSE_DIR, ignore_errors=True)  # linked into segment 0 (or refused) by the conversion
    m.unlink()
    for name in names:
        (root / name).unlink(missing_ok=True)
    for d in sorted({(root / n).parent for n in names} - {root}):
        try:
            d.rmdir()
        except OSError:
            pass
    fsync_dir(root)


def _create_empty(root: Path, settings: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{LIVE_DIR}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    Commit(0, 0, settings, [], 0).write(tmp)
    os.rename(tmp, root / LIVE_DIR)
    fsync_dir(root)


# ---------------------------------------------------------------------------------------------
# The live index (the write side, and the snapshots it publishes)

@dataclass(frozen=True)
class MergePolicy:
    """When the background merge folds segments (Lucene's TieredMergePolicy in miniature)."""

    max_segments: int = 6  # above this many segments, merge the cheapest run of ``merge_factor`` adjacent ones
    merge_factor: int = 4
    max_deleted_fraction: float = 0.25  # a segment with more deleted docs than this is rewritten without them


@dataclass
class WriteResult:
    seq: int
    added: int = 0
    deleted: int = 0
    missing: list[str] = field(default_factory=list)  # delete of ids the index does not hold


class LiveIndex:
    """A live index directory opened for writing (``writable``) or for reading its last commit.

    Writes (``add``, ``delete``, ``apply``) are logged and fsynced before they return (the acknowledgement);
    they become searchable at the next ``refresh``. ``snapshot()`` never blocks on writers."""

    def __init__(self, path: str | Path, writable: bool = True, create: bool = False,
                 policy: MergePolicy | None = None, settings: dict | None = None,
                 dense: DenseWriter | None = None, dense_model: str | None = None) -> None:
        """``dense``: what writes the segments' dense parts where the index has one (default: the registered
        ``ragserve.retrieval.live_dense`` writer, its encoder ``dense_model`` or the one the dense part records,
        loaded when a refresh first has passages to embed)."""
        self.path = Path(path)
        self.live = self.path / LIVE_DIR
        self.writable = writable
        self.policy = policy or MergePolicy()
        self._lock = threading.RLock()  # writers (and refresh, and a merge's swap) one at a time
        self._merge_lock = threading.Lock()  # one merge at a time
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._lock_fd = -1
        self._wal: AppendLog | None = None
        self._building: set[str] = set()  # segments a merge is writing: not the clean-up's to remove
        self._dense = dense
        self._dense_model = dense_model
        if not is_live(self.path):
            if not writable:
                raise InvalidIndexError(f"{self.path}: not a live index (no {LIVE_DIR}/{COMMIT})")
            if (self.path / L.MANIFEST).is_file():
                _convert(self.path)
            elif create and (not self.path.exists() or (self.path.is_dir() and not any(self.path.iterdir()))):
                _create_empty(self.path, settings or default_settings())
            else:
                raise LiveIndexError(f"{self.path} is not an index (build one with `ragserve index`, or pass "
                                     f"--create to start an empty live index)")
        if writable:
            self._take_lock()
        self._readers: dict[str, IndexReader] = {}
        self._open()

    # -- opening ------------------------------------------------------------------------------
    def _take_lock(self) -> None:
        fd = os.open(self.live / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LiveIndexLocked(f"{self.path} is open for writing by another process (a server started with "
                                  f"--writes, or another ragserve add/delete); send writes there, or stop it")
        self._lock_fd = fd

    def _open(self) -> None:
        for attempt in range(20):  # a reader may race a writer's commit and clean-up: read the next commit
            try:
                commit = Commit.read(self.live)
                segs = [self._segment(s["name"], _read_tombstones(self.live, s), "dense" in commit.settings)
                        for s in commit.segments]
                break
            except (FileNotFoundError, InvalidIndexError):
                if self.writable or attempt == 19:
                    raise
                time.sleep(0.05)
        self.commit = commit
        self.settings = commit.settings
        self._snapshot = Snapshot(commit.generation, tuple(segs), commit.settings)
        if not self.writable:
            return
        _remove_plain_layout(self.path)
        self._gc()
        # Writer state: where each live id is, and the requests logged since the commit.
        self._where: dict[str, tuple[str, int]] = {}
        for s in segs:
            dead = set(s.deleted.tolist())
            for d, i in enumerate(s.reader.external_ids(np.arange(s.reader.num_docs))):
                if d not in dead:
                    self._where[i] = (s.name, d)
        self._pending: dict[str, tuple[str, str]] = {}  # id -> (title, text), in write order
        self._pending_del: dict[str, set[int]] = {}  # segment name -> local docids deleted since the commit
        self._seq = commit.seq
        self._wal = AppendLog(self.live / WAL)
        for payload in self._wal.replay():  # a torn tail is cut off once the replay is done
            rec = json.loads(payload)
            if rec["seq"] > commit.seq:
                self._apply_ops(rec["ops"])
                self._seq = rec["seq"]
        if self._pending or self._pending_del:
            self.refresh()

    def _segment(self, name: str, deleted: np.ndarray, dense: bool) -> SegmentState:
        reader = self._readers.get(name) if hasattr(self, "_readers") else None
        if reader is None:
            reader = IndexReader(self.live / name)
            if dense and not (self.live / name / L.DENSE_DIR / L.MANIFEST).is_file():
                raise InvalidIndexError(f"{self.live / name}: segment without its dense part; the index is corrupt")
        return SegmentState.open(name, reader, deleted)

    def _gc(self) -> None:
        """Remove what the commit does not name: merged-away segments, old tombstones, unfinished writes."""
        keep = {COMMIT, WAL, LOCK, *self._building}
        for s in self.commit.segments:
            keep.add(s["name"])
            if s["tombstones"]:
                keep.add(s["tombstones"])
        for p in self.live.iterdir():
            if p.name not in keep and not any(p.name.startswith(f".{b}.") for b in self._building):
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)

    # -- reading ------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def on_refresh(self, fn: Callable[[Snapshot], None]) -> None:
        """Call ``fn(snapshot)`` for each new snapshot, just before it is published (``snapshot()`` still returns
        the one before): a searcher readies itself for it (opens its segments' backends) before any search sees
        it, so none pays for that."""
        self._listeners.append(fn)

    def reload(self) -> bool:
        """A read-only opener: pick up a newer commit. True when the snapshot changed."""
        if self.writable:
            return False
        commit = Commit.read(self.live)
        if commit.generation == self.commit.generation:
            return False
        self._readers = {s.name: s.reader for s in self._snapshot.segments}
        old = self._snapshot
        self._open()
        new, self._snapshot = self._snapshot, old
        self._publish(new)
        return True

    # -- writing ------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Requests' operations logged but not yet searchable."""
        return len(self._pending) + sum(map(len, self._pending_del.values())) if self.writable else 0

    def add(self, docs: Iterable[Document | dict | tuple]) -> WriteResult:
        """Add documents, replacing any live document of the same id (delete + add: it moves to the end)."""
        return self.apply([("add", d) for d in docs])

    def delete(self, ids: Iterable[str]) -> WriteResult:
        return self.apply([("delete", i) for i in ids])

    def apply(self, ops: list[tuple[str, object]]) -> WriteResult:
        """One request, logged as one record: acknowledged (returned) only once it is on disk."""
        if not self.writable:
            raise LiveIndexError(f"{self.path} was opened read-only")
        rec = [self._check(op, x) for op, x in ops]
        if not rec:
            raise LiveIndexError("no documents or ids given")
        with self._lock:
            seq = self._seq + 1
            self._wal.append(json.dumps({"seq": seq, "ops": rec}, ensure_ascii=False,
                                        separators=(",", ":")).encode("utf-8"))
            self._seq = seq
            return self._apply_ops(rec, WriteResult(seq))

    def _check(self, op: str, x: object) -> dict:
        if op == "delete":
            if not isinstance(x, str) or not x:
                raise LiveIndexError(f"a document id must be a non-empty string, got {x!r}")
            return {"op": "delete", "id": x}
        if op != "add":
            raise LiveIndexError(f"unknown operation {op!r}")
        if isinstance(x, Document):
            i, title, text = x.id, x.title, x.text
        elif isinstance(x, dict):
            i, title, text = x.get("id"), x.get("title", ""), x.get("text", x.get("contents"))
        else:
            i, title, text = x
        if not isinstance(i, str) or not i or len(i.encode("utf-8", "replace")) > MAX_ID_BYTES:
            raise LiveIndexError(f"a document needs an id: a non-empty string of at most {MAX_ID_BYTES} bytes")
        if not isinstance(title, str) or not isinstance(text, str):
            raise LiveIndexError(f"document {i!r}: title and text must be strings")
        max_tf = (1 << (32 - (self.settings["block_size"] - 1).bit_length())) - 1
        # Each occurrence of a term takes a character and a separator: a shorter text cannot exceed max_tf, and
        # needs no analysis here (the refresh analyses it).
        counts = Counter() if len(title) + len(text) + 1 < 2 * max_tf else \
            document_terms(self._snapshot.analyzer, title, text)[0]
        if counts and max(counts.values()) > max_tf:
            raise LiveIndexError(f"document {i!r}: a term occurs {max(counts.values())} times; this index's "
                                 f"layout holds at most {max_tf}")
        return {"op": "add", "id": i, "title": title, "text": text}

    def _apply_ops(self, ops: list[dict], res: WriteResult | None = None) -> WriteResult:
        res = res or WriteResult(self._seq)
        for o in ops:
            i = o["id"]
            found = self._drop(i)
            if o["op"] == "add":
                self._pending[i] = (o["title"], o["text"])
                res.added += 1
            elif found:
                res.deleted += 1
            else:
                res.missing.append(i)
        return res

    def _drop(self, i: str) -> bool:
        """Remove id ``i`` from the live state (pending add, or tombstone its committed copy)."""
        if self._pending.pop(i, None) is not None:
            return True
        where = self._where.pop(i, None)
        if where is None:
            return False
        self._pending_del.setdefault(where[0], set()).add(where[1])
        return True

    # -- refresh (commit) ---------------------------------------------------------------------
    def _build_options(self) -> BuildOptions:
        st = self.settings
        return BuildOptions(block_size=st["block_size"], bank_bytes=st["bank_bytes"], k1=st["bm25"]["k1"],
                            b=st["bm25"]["b"], workers=1, fine_block=st["fine_block"], progress=False,
                            analyzer=Analyzer.from_config(st["analyzer"]).config)

    @property
    def has_dense(self) -> bool:
        return "dense" in self.settings

    def _dense_writer(self) -> DenseWriter:
        """The writer of the segments' dense parts (made at first need; the encoder loads at its first embedding)."""
        if self._dense is None:
            if _dense_writer_factory is None:
                raise LiveIndexError(f"{self.path} has a dense part, and no dense writer is registered here (import "
                                     f"ragserve.retrieval.live_dense, or write through the ragserve CLI or server)")
            self._dense = _dense_writer_factory(self.settings["dense"], self._dense_model)
        return self._dense

    def _new_segment(self, docs: list[Document]) -> str:
        name = f"seg_{self.commit.next_segment:06d}"
        self.commit.next_segment += 1
        build_segment(docs, self.live / name, self._build_options())
        if self.has_dense:  # the segment's vectors, durable before the commit names it
            self._dense_writer().write_segment(self.live / name)
            _fsync_tree(self.live / name / L.DENSE_DIR)
            fsync_dir(self.live / name)
        return name

    def refresh(self) -> Snapshot:
        """Make every acknowledged write searchable: a delta segment of the pending adds, tombstones of the
        pending deletes, one commit; then the log is emptied."""
        if not self.writable:
            self.reload()
            return self._snapshot
        if self.has_dense and self._pending:
            # The slow part of a dense refresh, with no lock held (writes go on): the pending passages embedded
            # now are looked up by text under the lock (a vector is a function of its text alone).
            with self._lock:
                todo = list(self._pending.values())
            self._dense_writer().prefetch(todo)
        with self._lock:
            if not self._pending and not self._pending_del:
                return self._snapshot
            snap = self._snapshot
            states = list(snap.segments)
            entries = [dict(s) for s in self.commit.segments]
            gen = self.commit.generation + 1
            for si, s in enumerate(states):
                dead = self._pending_del.get(s.name)
                if dead:
                    states[si] = s.with_deletes(np.array(sorted(dead), dtype=np.int64))
                    entries[si] = self._tombstone_entry(states[si], gen)
            if self._pending:
                docs = [Document(i, t, x) for i, (t, x) in self._pending.items()]
                name = self._new_segment(docs)
                reader = IndexReader(self.live / name)
                states.append(SegmentState.open(name, reader))
                entries.append({"name": name, "docs": len(docs), "tombstones": None, "deleted": 0, "crc32": 0})
                for d, i in enumerate(self._pending):
                    self._where[i] = (name, d)
            self._commit(gen, entries, states)
            self._pending.clear()
            self._pending_del.clear()
            return self._snapshot

    def _tombstone_entry(self, s: SegmentState, gen: int) -> dict:
        data = s.deleted.astype("<u4").tobytes()
        name = f"{s.name}.del-{gen:06d}.u32"
        _write_durably(self.live / name, data)
        return {"name": s.name, "docs": s.reader.num_docs, "tombstones": name, "deleted": int(s.deleted.size),
                "crc32": zlib.crc32(data)}

    def _commit(self, gen: int, entries: list[dict], states: list[SegmentState]) -> None:
        commit = Commit(gen, self._seq, self.settings, entries, self.commit.next_segment)
        commit.write(self.live)  # the commit point
        self.commit = commit
        self._wal.rewrite([])  # every logged request is in the commit
        self._publish(Snapshot(gen, tuple(states), self.settings, self._snapshot))
        self._gc()

    def _publish(self, snap: Snapshot) -> None:
        for fn in self._listeners:
            fn(snap)
        self._snapshot = snap

    # -- merging ------------------------------------------------------------------------------
    def merge_candidates(self) -> tuple[int, int] | None:
        """The run of segments [i, j) the policy would merge now, or None."""
        segs = self._snapshot.segments
        p = self.policy
        for i, s in enumerate(segs):
            if s.reader.num_docs and s.deleted.size > p.max_deleted_fraction * s.reader.num_docs:
                return i, i + 1
        if len(segs) <= p.max_segments:
            return None
        f = min(p.merge_factor, len(segs))
        sizes = [s.n_live for s in segs]
        best = min(range(len(segs) - f + 1), key=lambda i: sum(sizes[i:i + f]))
        return best, best + f

    def maybe_merge(self) -> bool:
        run = self.merge_candidates()
        if run is None:
            return False
        self.merge(*run)
        return True

    def force_merge(self) -> Snapshot:
        """Fold every segment into one without deleted documents."""
        self.refresh()
        n = len(self._snapshot.segments)
        if n > 1 or (n == 1 and self._snapshot.segments[0].deleted.size):
            self.merge(0, n)
        return self._snapshot

    def merge(self, i: int, j: int) -> None:
        """Fold segments [i, j) of the current snapshot into one segment of their live documents in order. Writes
        go on meanwhile; the swap (under the write lock) carries deletes made during the merge over."""
        if not self.writable:
            raise LiveIndexError(f"{self.path} was opened read-only")
        with self._merge_lock:
            with self._lock:
                snap = self._snapshot
                olds = snap.segments[i:j]
                if not olds:
                    return
                names = [s.name for s in olds]
                name = f"seg_{self.commit.next_segment:06d}"
                self.commit.next_segment += 1
                self._building.add(name)
            try:
                # The long part, with no lock held: searches and writes go on.
                docs = (Document(*d) for s in olds for d in _live_documents(s))
                merged = None
                if sum(s.n_live for s in olds):
                    build_segment(docs, self.live / name, self._build_options())
                    if self.has_dense:  # the old rows copied: one text, one vector, no model run
                        self._dense_writer().write_merged(self.live / name, [
                            (s.reader, s.live_docs if s.deleted.size else np.arange(s.reader.num_docs))
                            for s in olds])
                        _fsync_tree(self.live / name / L.DENSE_DIR)
                        fsync_dir(self.live / name)
                    merged = IndexReader(self.live / name)
                self._swap(names, olds, name, merged)
            finally:
                self._building.discard(name)

    def _swap(self, names: list[str], olds: tuple[SegmentState, ...], name: str,
              merged: IndexReader | None) -> None:
        """Put the merged segment in place of ``names`` with one commit."""
        with self._lock:
            self.refresh()
            cur = self._snapshot
            pos = [s.name for s in cur.segments].index(names[0])
            assert [s.name for s in cur.segments[pos:pos + len(names)]] == names
            # Deletes made while merging: old local -> merged local (the old doc's rank among the live ones
            # the merge read).
            late, base = [], 0
            for old, now in zip(olds, cur.segments[pos:pos + len(names)]):
                extra = np.setdiff1d(now.deleted, old.deleted)
                late.append(base + old.live_rank(extra))
                base += old.n_live
            late = np.concatenate(late) if late else np.zeros(0, np.int64)
            gen = self.commit.generation + 1
            entries = [dict(s) for s in self.commit.segments]
            states = list(cur.segments)
            if merged is None:
                new_states, new_entries = [], []
            else:
                st = SegmentState.open(name, merged, late)
                new_states = [st]
                new_entries = [self._tombstone_entry(st, gen) if late.size else
                               {"name": name, "docs": merged.num_docs, "tombstones": None, "deleted": 0,
                                "crc32": 0}]
                gone = set(names)
                for d, ext in enumerate(merged.external_ids(np.arange(merged.num_docs))):
                    w = self._where.get(ext)
                    if w is not None and w[0] in gone:
                        self._where[ext] = (name, d)
            states[pos:pos + len(names)] = new_states
            entries[pos:pos + len(names)] = new_entries
            self._commit(gen, entries, states)

    def close(self) -> None:
        if self._wal is not None:
            self._wal.close()
            self._wal = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _live_documents(s: SegmentState) -> Iterable[tuple[str, str, str]]:
    """(id, title, text) of the segment's live documents in local docid order."""
    docs = s.live_docs if s.deleted.size else np.arange(s.reader.num_docs)
    r = s.reader
    for d in docs.tolist():
        yield (r.external_id(d), *r.document(d))


def open_live(path: str | Path) -> LiveIndex:
    """The live index at ``path`` for searching: opened for writing when no other process writes it (so writes
    logged before a crash are replayed and committed), else read-only at its last commit."""
    try:
        return LiveIndex(path, writable=True)
    except LiveIndexLocked:
        return LiveIndex(path, writable=False)
