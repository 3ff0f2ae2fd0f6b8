"""Dense retrieval: the dense part of an index (passage embeddings + a faiss index) and ``DenseSearcher``.

Layout (``indexer/FORMAT.md``, "Dense part"): ``<index>/dense/`` holds ``manifest.json`` (the encoder that made
the embeddings, the faiss index kind and its parameters, sizes and SHA-256 of the files), ``embeddings.f16``
(raw little-endian fp16, [num_docs, dim], internal docid order) and, for ``hnsw`` and ``ivfpq``, ``faiss.index``.
The exact ``flat`` kind stores nothing more: its index is the embeddings, given to ``faiss.IndexFlatIP`` as f32
when opened. A build writes ``.dense.partial-<pid>/`` and renames it into place only when complete.

Search: ``backend="cpu"`` asks faiss (exact inner product for ``flat``; HNSW / IVF-PQ approximate, their hits
rescored exactly from the stored embeddings); ``backend="gpu"`` keeps the fp16 embeddings on the device and runs
the kernel library's inner-product + top-k (``ragserve.kernels.gpu.ip_topk``, exact). Scores are inner products
of the query embedding with the fp16 passage embeddings (cosine similarity for a normalising encoder).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from indexer.files import sha256_file, write_dir_atomically
from indexer.layout import DENSE_DIR
from indexer.reader import IndexReader, InvalidIndexError
from ragserve.kernels.contract import SearchError, StageTimes, TopK
from ragserve.retrieval.embedder import Embedder, EmbedderError
from ragserve.retrieval.contract import Hit, Retriever

FORMAT_NAME = "ragserve-dense"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
EMBEDDINGS = "embeddings.f16"
FAISS_FILE = "faiss.index"
FAISS_KINDS = ("flat", "hnsw", "ivfpq")
EMBED_WINDOW = 8192  # passages read from the store and embedded per step (bounded memory)
FAISS_ADD_ROWS = 1 << 18  # f32 rows converted and added to a faiss index at a time


class DenseIndexError(InvalidIndexError):
    """A missing, incomplete or mismatched dense part."""


@dataclass(frozen=True)
class FaissOptions:
    """How the faiss index is built and searched (one object: the CLI, the server and benchmarks pass it on)."""

    kind: str = "flat"
    hnsw_m: int = 32  # graph degree (level 0 keeps 2M links)
    ef_construction: int = 80
    ef_search: int = 128
    nlist: int = 0  # IVF lists; 0: about 4 sqrt(n), at least 39 training points a list
    pq_m: int = 0  # PQ sub-quantizers; 0: dim / 8 (8 dims, one byte each)
    pq_bits: int = 8
    nprobe: int = 32
    rescore: int = 4  # ivfpq: rescore this many times k candidates exactly from the embeddings
    train_size: int = 131072  # ivfpq training sample

    def check(self) -> None:
        if self.kind not in FAISS_KINDS:
            raise DenseIndexError(f"faiss index kind must be one of {', '.join(FAISS_KINDS)}, got {self.kind!r}")
        for name in ("hnsw_m", "ef_construction", "ef_search", "pq_bits", "nprobe", "rescore", "train_size"):
            if getattr(self, name) < 1:
                raise DenseIndexError(f"{name} must be >= 1")

    def ivf_params(self, n: int, d: int) -> tuple[int, int, int]:
        """(nlist, pq_m, pq_bits) for n vectors of d dims."""
        nlist = self.nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
        pq_m = self.pq_m or max(1, d // 8)
        if d % pq_m:
            raise DenseIndexError(f"pq_m ({pq_m}) must divide the dimension ({d})")
        bits = min(self.pq_bits, max(1, int(math.log2(max(2, n // 39)))))  # at least 39 points a PQ centroid
        return min(nlist, n), pq_m, bits


def memory_plan(n: int, d: int, opts: FaissOptions) -> dict[str, int]:
    """Bytes the dense part needs: on disk (embeddings + faiss file) and in memory when searched by faiss."""
    emb = 2 * n * d
    if opts.kind == "flat":
        faiss_mem, faiss_disk = 4 * n * d, 0  # IndexFlatIP over an f32 copy, made at load
    elif opts.kind == "hnsw":
        # fp16 vectors + level-0 links (2M int32) + upper levels (about 1/M of the nodes, M links each)
        faiss_mem = n * (2 * d + 4 * 2 * opts.hnsw_m) + int(n / opts.hnsw_m * 4 * opts.hnsw_m * 1.1)
        faiss_disk = faiss_mem
    else:
        nlist, pq_m, bits = opts.ivf_params(n, d)
        faiss_mem = n * (math.ceil(pq_m * bits / 8) + 8) + nlist * d * 4 + pq_m * (1 << bits) * (d // pq_m) * 4
        faiss_disk = faiss_mem
    return {"embeddings_disk": emb, "faiss_disk": faiss_disk, "faiss_memory": faiss_mem,
            "gpu_memory": emb}


def describe_plan(n: int, d: int, opts: FaissOptions) -> str:
    p = memory_plan(n, d, opts)
    g = 1 << 30
    return (f"dense part: {n:,} passages x {d} dims; fp16 embeddings {p['embeddings_disk'] / g:.2f} GiB on disk; "
            f"faiss {opts.kind} {p['faiss_memory'] / g:.2f} GiB in memory"
            + (f" and {p['faiss_disk'] / g:.2f} GiB on disk" if p["faiss_disk"] else " (made from the embeddings at load)")
            + f"; gpu search keeps {p['gpu_memory'] / g:.2f} GiB on the device")


def passage_text(title: str, text: str) -> str:
    """What is embedded for a passage: title and text joined by a space (BEIR's convention for bi-encoders)."""
    return f"{title} {text}".strip()


# -- building ---------------------------------------------------------------------------------
def _new_faiss(d: int, n: int, opts: FaissOptions, sample: Callable[[int], np.ndarray]):
    import faiss

    if opts.kind == "hnsw":
        # fp16 storage: the index holds exactly the stored embeddings, so its scores are the flat ones.
        index = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_fp16, opts.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = opts.ef_construction
        index.train(sample(min(n, 1024)))  # fp16 "training" only checks the data
        return index
    nlist, pq_m, bits = opts.ivf_params(n, d)
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFPQ(quantizer, d, nlist, pq_m, bits, faiss.METRIC_INNER_PRODUCT)
    index.train(sample(min(n, max(opts.train_size, 39 * nlist))))
    return index


def _faiss_from(emb: np.ndarray, opts: FaissOptions, progress: bool):
    """The faiss index of ``opts.kind`` over fp16 embeddings, added f32 chunk by chunk."""
    import faiss
    from tqdm import tqdm

    n, d = emb.shape
    if opts.kind == "flat":
        index = faiss.IndexFlatIP(d)
    else:
        rng = np.random.default_rng(0)
        index = _new_faiss(d, n, opts, lambda s: np.ascontiguousarray(
            emb[np.sort(rng.choice(n, size=s, replace=False))], dtype=np.float32))
    with tqdm(total=n, desc=f"faiss {opts.kind}", unit=" vectors", disable=not progress) as bar:
        for i in range(0, n, FAISS_ADD_ROWS):
            index.add(np.ascontiguousarray(emb[i:i + FAISS_ADD_ROWS], dtype=np.float32))
            bar.update(min(FAISS_ADD_ROWS, n - i))
    return index


def build_dense_index(index_dir: str | Path, embedder: Embedder, opts: FaissOptions = FaissOptions(),
                      progress: bool = False, overwrite: bool = False,
                      on_batch: Callable[[int], None] | None = None,
                      embed: Callable[[list[str]], np.ndarray] | None = None) -> dict:
    """Embed every stored passage of the index at ``index_dir`` and write its dense part; returns its manifest.
    ``embed`` (default ``embedder.encode``): what turns a window of passages into vectors (a live index's refresh
    passes one that reuses vectors made before it took its lock: one text, one vector, see ``Embedder.encode``).

    Written under a temporary directory renamed into place when complete: an interrupted build leaves the
    index as it was (no dense part, or the previous one)."""
    from tqdm import tqdm

    reader = IndexReader(index_dir)
    n = reader.num_docs

    def fill(emb: np.ndarray) -> None:
        with tqdm(total=n, desc="embedding", unit=" passages", disable=not progress) as bar:
            for w0 in range(0, n, EMBED_WINDOW):
                texts = [passage_text(*reader.document(i)) for i in range(w0, min(n, w0 + EMBED_WINDOW))]

                def step(k: int) -> None:
                    bar.update(k)
                    if on_batch is not None:
                        on_batch(k)

                if embed is None:
                    emb[w0:w0 + len(texts)] = embedder.encode(texts, on_batch=step)
                else:
                    emb[w0:w0 + len(texts)] = embed(texts)
                    step(len(texts))

    return write_dense_part(reader, embedder.info.to_dict(), embedder.compute, fill, opts, progress, overwrite)


def write_dense_part(reader: IndexReader, encoder: dict, compute: dict, fill: Callable[[np.ndarray], None],
                     opts: FaissOptions = FaissOptions(), progress: bool = False, overwrite: bool = False) -> dict:
    """Write the dense part of the index ``reader`` reads: ``fill(emb)`` puts the vectors of every internal docid
    into the fp16 [num_docs, dim] array ``emb`` (embedded, or rows copied from other dense parts by a live
    index's merge); ``encoder`` and ``compute`` say how they were made. Returns the manifest."""
    opts.check()
    root = Path(reader.path)
    out = root / DENSE_DIR
    if out.exists() and not overwrite:
        raise DenseIndexError(f"{root} already has a dense part (pass --overwrite to replace it)")
    n, d = reader.num_docs, int(encoder["dim"])
    t0 = time.time()

    def build(tmp: Path) -> dict:
        emb = np.memmap(tmp / EMBEDDINGS, dtype="<f2", mode="w+", shape=(n, d)) if n else np.zeros((0, d), "<f2")
        if n:
            fill(emb)
            emb.flush()
        else:
            (tmp / EMBEDDINGS).write_bytes(b"")
        faiss_meta: dict = {"kind": opts.kind}
        if opts.kind != "flat":
            import faiss

            faiss.write_index(_faiss_from(emb, opts, progress), str(tmp / FAISS_FILE))
            faiss_meta["file"] = FAISS_FILE
            if opts.kind == "hnsw":
                faiss_meta.update(m=opts.hnsw_m, ef_construction=opts.ef_construction)
            else:
                nlist, pq_m, bits = opts.ivf_params(n, d)
                faiss_meta.update(nlist=nlist, pq_m=pq_m, pq_bits=bits)
        del emb
        files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir())}
        manifest = {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "num_docs": n, "dim": d, "dtype": "f16",
            "encoder": encoder, "embedding": compute, "faiss": faiss_meta, "text": "title + ' ' + text",
            "docids_sha256": reader.manifest["files"].get("docids.bin", {}).get("sha256"),
            "files": files, "build_seconds": round(time.time() - t0, 3),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        return manifest

    return write_dir_atomically(out, build)


# -- opening ----------------------------------------------------------------------------------
class DenseIndex:
    """Read-only view of an index's dense part."""

    def __init__(self, index: IndexReader, verify: bool = False) -> None:
        self.index = index
        self.path = Path(index.path) / DENSE_DIR
        mpath = self.path / MANIFEST
        if not mpath.is_file():
            raise DenseIndexError(f"index {index.path} has no dense part; build one with "
                                  f"'ragserve index-dense {index.path} --model MODEL'")
        try:
            self.manifest = json.loads(mpath.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DenseIndexError(f"{mpath}: unreadable manifest: {e}") from None
        m = self.manifest
        if m.get("format") != FORMAT_NAME or m.get("version") != FORMAT_VERSION:
            raise DenseIndexError(f"{mpath}: not a ragserve dense part of version {FORMAT_VERSION}; rebuild it")
        if m["num_docs"] != index.num_docs or m.get("docids_sha256") != index.manifest["files"].get(
                "docids.bin", {}).get("sha256"):
            raise DenseIndexError(f"{self.path} was built for other documents than the index's; rebuild it")
        for name, meta in m["files"].items():
            f = self.path / name
            if not f.is_file() or f.stat().st_size != meta["bytes"]:
                raise DenseIndexError(f"{self.path}: file {name} is missing or truncated; rebuild the dense part")
            if verify and sha256_file(f) != meta["sha256"]:
                raise DenseIndexError(f"{self.path}: checksum mismatch in {name}; the dense part is corrupt")
        self.num_docs, self.dim = int(m["num_docs"]), int(m["dim"])
        self.encoder: dict = m["encoder"]
        self.kind: str = m["faiss"]["kind"]
        self.embeddings = np.memmap(self.path / EMBEDDINGS, dtype="<f2", mode="r", shape=(self.num_docs, self.dim))

    def faiss_index(self, opts: FaissOptions):
        """The faiss index, loaded (hnsw, ivfpq) or made from the embeddings (flat); search settings applied."""
        import faiss

        if self.kind == "flat":
            return _faiss_from(self.embeddings, FaissOptions(kind="flat"), progress=False)
        index = faiss.read_index(str(self.path / self.manifest["faiss"]["file"]))
        if index.d != self.dim:
            raise DenseIndexError(f"{self.path}: the faiss index has {index.d} dimensions, the embeddings {self.dim}")
        if self.kind == "hnsw":
            index.hnsw.efSearch = opts.ef_search
        else:
            index.nprobe = opts.nprobe
        return index


def live_selector(deleted: np.ndarray | None, n: int):
    """A faiss ``IDSelector`` of the rows not in ``deleted`` (ascending row numbers; None or empty: every row)."""
    import faiss

    if deleted is None or not deleted.size:
        return faiss.IDSelectorAll()
    keep = np.ones(n, bool)
    keep[deleted] = False
    bits = np.packbits(keep, bitorder="little")
    sel = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bits))
    sel._bits = bits  # the selector reads the array: keep it alive with it
    return sel


def flat_topk(index, qv: np.ndarray, k: int, selector=None) -> list[TopK]:
    """Exact top-k of a faiss ``IndexFlatIP`` by the one scoring rule of flat search (``indexer/FORMAT.md``,
    "Dense part"): score descending, then row ascending, every score faiss's per-pair inner product.

    A selector (``live_selector``: all rows, or a segment's live ones) always sends faiss down its sequential path,
    one SIMD dot product per (query, row). Without one, faiss multiplies by BLAS once the query batch or the
    database is large (and splits the database by thread for a single query), and a score's bits then depend on
    which other rows and queries share the product: measured, 77% of the scores of 400 queries changed by an ulp.
    With the per-pair rule a passage's score is the same in a fresh build and in any segment of a live index.
    At a tie across the cut faiss keeps some of the tied rows: the search is then widened until the rows scoring
    the k-th value are all in hand, so the smallest rows win, as everywhere else."""
    import faiss

    n = index.ntotal
    sel = selector if selector is not None else live_selector(None, n)
    params = faiss.SearchParameters(sel=sel)
    q = np.ascontiguousarray(qv, dtype=np.float32)
    out: list[TopK | None] = [None] * q.shape[0]
    want = min(k + 1, n)
    todo = np.arange(q.shape[0])
    while todo.size:
        scores, ids = index.search(q[todo], want, params=params)
        again = []
        for r, i in enumerate(todo.tolist()):
            keep = ids[r] >= 0
            d, s = ids[r][keep].astype(np.int64), scores[r][keep].astype(np.float32)
            if d.size == want and want < n and d.size > k and s[-1] == s[k - 1]:
                again.append(i)  # the k-th score ties past the cut: widen
                continue
            order = np.lexsort((d, -s))[:k]
            out[i] = TopK(d[order], s[order])
        todo = np.array(again, np.int64)
        want = min(2 * want, n)
    return out  # type: ignore[return-value]


def _to_device(emb: np.ndarray, device, dtype):
    """The memory-mapped embeddings as one device tensor, copied a slice at a time (no full host copy)."""
    import torch

    out = torch.empty(emb.shape, dtype=dtype, device=device)
    for i in range(0, emb.shape[0], FAISS_ADD_ROWS):
        out[i:i + FAISS_ADD_ROWS] = torch.from_numpy(np.array(emb[i:i + FAISS_ADD_ROWS]))
    return out


# -- searching --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DenseOptions:
    """Search-time settings of dense retrieval: faiss's (CPU) and the device kernel's (GPU)."""

    faiss: FaissOptions = field(default_factory=FaissOptions)
    chunk_score_bytes: int = 512 << 20
    split_query: bool = True


def open_dense(index: IndexReader, embedder: Embedder) -> DenseIndex:
    """The index's dense part, checked against the query encoder (same model, same dimension)."""
    dense = DenseIndex(index)
    try:
        embedder.check_same_model(dense.encoder, f"the dense part of {index.path}")
    except EmbedderError as e:
        raise DenseIndexError(str(e)) from None
    return dense


class DenseSearcher(Retriever):
    """Embed the query, score every passage by inner product, rank, fetch."""

    kind = "dense"

    def __init__(self, index: str | Path | IndexReader, embedder: Embedder, backend: str = "cpu",
                 options: DenseOptions = DenseOptions(), device: str | None = None) -> None:
        import torch

        self.index = index if isinstance(index, IndexReader) else IndexReader(index)
        self.embedder = embedder
        self.dense = open_dense(self.index, embedder)
        self.options = options
        if backend == "auto":
            backend = "gpu" if torch.cuda.is_available() else "cpu"
        if backend not in ("cpu", "gpu"):
            raise SearchError(f"dense search runs on the cpu (faiss) or the gpu backend, not {backend!r}")
        self.backend_name = backend
        if backend == "cpu":
            try:
                import faiss  # noqa: F401
            except ImportError:
                raise SearchError("dense search on the cpu backend needs faiss (pip install faiss-cpu)") from None
            self._faiss = self.dense.faiss_index(options.faiss)
        else:
            from ragserve.kernels.gpu.ip_topk import IpTopkTuning

            dev = torch.device(device or "cuda")
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise SearchError("the gpu backend needs a CUDA device; none is usable here")
            self.device = dev
            # fp16 rows on the device as stored; off CUDA (tests) f32, which the CPU multiplies natively.
            dtype = torch.float16 if dev.type == "cuda" else torch.float32
            self._keys = _to_device(self.dense.embeddings, dev, dtype)
            self._tuning = IpTopkTuning(options.chunk_score_bytes, options.split_query)

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @property
    def backend(self):
        return self

    def describe(self) -> dict:
        return {"backend": self.backend_name, "retriever": "dense", "model": self.embedder.info.name,
                "faiss": self.dense.kind if self.backend_name == "cpu" else None}

    def embed(self, queries: list[str]) -> np.ndarray:
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise SearchError("queries must be non-empty strings")
        return self.embedder.encode(queries)

    def search_vectors(self, qv: np.ndarray, k: int, times: StageTimes | None = None) -> list[TopK]:
        """Top-k passages of each query embedding (f32 [m, dim]), best first, ties by docid."""
        if qv.ndim != 2 or qv.shape[1] != self.dense.dim:
            raise SearchError(f"query embeddings have {qv.shape[-1]} dimensions, the dense index {self.dense.dim}")
        t0 = time.perf_counter()
        if self.backend_name == "cpu":
            out = self._faiss_search(qv, k)
        else:
            import torch

            from ragserve.kernels.gpu.ip_topk import ip_topk

            idx, vals = ip_topk(torch.from_numpy(np.ascontiguousarray(qv, dtype=np.float32)).to(self.device),
                                self._keys, k, self._tuning)
            idx, vals = idx.cpu().numpy(), vals.cpu().numpy()
            out = [TopK(idx[i].astype(np.int64), vals[i].astype(np.float32)) for i in range(idx.shape[0])]
        if times is not None:
            times.relevancy += time.perf_counter() - t0
        return out

    def _faiss_search(self, qv: np.ndarray, k: int) -> list[TopK]:
        kind = self.dense.kind
        if kind == "flat":
            return flat_topk(self._faiss, qv, k)
        want = min(k * (self.options.faiss.rescore if kind == "ivfpq" else 1), self.dense.num_docs)
        scores, ids = self._faiss.search(np.ascontiguousarray(qv, dtype=np.float32), want)
        out = []
        for i in range(qv.shape[0]):
            keep = ids[i] >= 0
            d, s = ids[i][keep].astype(np.int64), scores[i][keep].astype(np.float32)
            if kind == "ivfpq":  # PQ scores are approximate: rescore the candidates from the stored embeddings
                s = (self.dense.embeddings[np.sort(d)].astype(np.float32) @ qv[i].astype(np.float32))
                d = np.sort(d)
            # one ranking rule on every path: score descending, then docid ascending
            order = np.lexsort((d, -s))[:k]
            out.append(TopK(d[order], s[order]))
        return out

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None) -> list[list[Hit]]:
        t0 = time.perf_counter()
        qv = self.embed(queries)
        t1 = time.perf_counter()
        kt = StageTimes()
        tops = self.search_vectors(qv, k, kt)
        t2 = time.perf_counter()
        hits = [self.hits(t, with_text) for t in tops]
        if times is not None:
            times.add(StageTimes(prepare=t1 - t0, relevancy=kt.relevancy, retrieval=time.perf_counter() - t2))
        return hits

    def close(self) -> None:
        self._keys = None
        self._faiss = None


__all__ = ["DENSE_DIR", "DenseIndex", "DenseIndexError", "DenseOptions", "DenseSearcher", "FaissOptions",
           "build_dense_index", "describe_plan", "flat_topk", "live_selector", "memory_plan", "open_dense",
           "passage_text", "write_dense_part"]
