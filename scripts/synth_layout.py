"""Write a synthetic BM25 index straight into the layout of ``indexer/FORMAT.md`` (no text, no indexer), fast.

    python scripts/synth_layout.py write OUT_DIR --docs 21000000 [--workers 16]
    python scripts/synth_layout.py queries OUT_DIR --reference REF_INDEX --topics FILE --out QUERIES.tsv

``write``: document frequencies follow a two-regime Zipf law over term ranks, ``df(r) ~ r^-s`` up to rank
``r_c``, then ``r^-s_tail`` (the shape ``indexer/synth.py`` fitted on Wikipedia passages: s ~ 1, a steeper tail
past a few thousand ranks), capped at ``df_cap * N`` and scaled so that a document holds ``terms_per_doc``
distinct terms on average (a 100-word DPR passage has ~48 after stopwords). The vocabulary ends where the
expected df reaches 1. Term strings are fixed-width decimal numbers (the analyzer keeps them as they are) and
ranks are shuffled over term ids, as a sorted real vocabulary is unrelated to frequency. Each term's documents
are a Bernoulli(df/N) sample (geometric gaps for frequent terms, sorted uniform draws for rare ones), its tf
``1 + Geometric(tf_p)`` (capped at ``TF_CAP``), and a document's length is the sum of its tfs, so norms, avgdl
and every block bound are those of a real index with these postings. Shards are generated in parallel, one
process each; ``store.bin`` holds an empty title and text per document.

``queries``: maps real queries onto the synthetic vocabulary by document-frequency rank. Each analysed query
term gets its df fraction in a reference index of real text (e.g. Wikipedia paragraphs); the synthetic term is
drawn (by a hash of the real term, so a term always maps the same way) among the synthetic terms whose df
fraction is in the same bin (df_ref +- 0.5 over the reference's doc count), i.e. of the same df rank. Terms the
reference lacks go to the part of the vocabulary rarer than any reference term. Repeated terms stay repeated.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer import layout as L  # noqa: E402
from indexer.analyzer import AnalyzerConfig  # noqa: E402
from indexer.norms import LENGTH_TABLE, encode_lengths  # noqa: E402
from indexer.bm25 import avgdl_f32, norm_cache  # noqa: E402
from indexer.reader import IndexReader  # noqa: E402

TF_CAP = 31  # max tf; the first posting of shard 0 gets it, so the collection's max_tf (and tf_bits) is fixed
TERM_CHUNK = 16_000_000  # random draws per step of a shard's generation (bounds a worker's memory)


# ---- the df law ------------------------------------------------------------------------------------------
def zipf_df(num_docs: int, terms_per_doc: float, s: float, r_c: int, s_tail: float, df_cap: float,
            vocab: int = 0) -> np.ndarray:
    """Expected df of each rank (float64, non-increasing), summing to terms_per_doc * num_docs."""
    def shape(v: int) -> np.ndarray:
        r = np.arange(1, v + 1, dtype=np.float64)
        return np.where(r <= r_c, r ** -s, r_c ** -s * (r / r_c) ** -s_tail)

    def scaled(v: int) -> np.ndarray:
        w = shape(v)
        lo, hi = 0.0, float(num_docs) * 10
        for _ in range(100):  # bisection on the scale: the cap makes the sum non-linear in it
            mid = (lo + hi) / 2
            if np.minimum(df_cap * num_docs, mid * w).sum() < terms_per_doc * num_docs:
                lo = mid
            else:
                hi = mid
        return np.minimum(df_cap * num_docs, hi * w)

    if vocab:
        return scaled(vocab)
    v = r_c * 4
    for _ in range(6):  # grow the vocabulary until the rarest expected df is ~1
        df = scaled(v)
        if df[-1] <= 1.0:
            return df[: int(np.searchsorted(-df, -1.0, side="right"))]
        v = int(v * min(16.0, (df[-1]) ** (1 / s_tail)) + 1)
    return df


# ---- shard generation (worker processes) --------------------------------------------------------------------
def _shard_postings(rng: np.random.Generator, lam: np.ndarray, docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Local docids of every term (term-major, ascending within a term) and per-term counts.

    A term's docs are the occupied slots of a Poisson process of rate mu = -ln(1 - p) per doc, p = lam / docs:
    each doc then holds the term independently with probability exactly p. Given its count, the process is
    uniform order statistics, drawn sorted as normalised cumulative sums of exponentials (no sort needed).
    """
    V = lam.size
    p = np.minimum(lam / docs, 0.999)
    n_all = rng.poisson(-np.log1p(-p) * docs)
    counts = np.zeros(V, dtype=np.int64)
    pieces = []
    # Terms in ranges of ~TERM_CHUNK draws: bounded memory per worker.
    bounds = np.searchsorted(np.cumsum(n_all), np.arange(TERM_CHUNK, int(n_all.sum()) + TERM_CHUNK, TERM_CHUNK))
    t0 = 0
    for t1 in np.unique(np.append(np.minimum(bounds + 1, V), V)).tolist():
        terms = t0 + np.flatnonzero(n_all[t0:t1])
        t0 = t1
        if terms.size == 0:
            continue
        n = n_all[terms]
        c = rng.random(int(n.sum()) + terms.size)
        np.log(c, out=c)  # -log(U) is Exp(1); faster than the ziggurat here
        c = -np.cumsum(c)
        last = np.cumsum(n + 1) - 1  # each segment: n points and one closing spacing
        base = np.concatenate(([0.0], c[last[:-1]]))
        seg = np.repeat(np.arange(terms.size, dtype=np.int32), n + 1)
        keep = np.ones(c.size, dtype=bool)
        keep[last] = False
        seg = seg[keep]
        pos = ((c[keep] - base[seg]) / (c[last] - base)[seg] * docs).astype(np.int32)
        del c, keep
        first = np.ones(pos.size, dtype=bool)  # several points in one doc: the doc holds the term once
        first[1:] = (pos[1:] != pos[:-1]) | (seg[1:] != seg[:-1])
        pieces.append(pos[first])
        counts[terms] = np.bincount(seg[first], minlength=terms.size)
    out = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    return out, counts


def _write(path: Path, arr: np.ndarray) -> dict:
    data = np.ascontiguousarray(arr).tobytes()
    with open(path, "wb") as f:
        f.write(data)
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _gen_shard(job: dict) -> dict:
    """Phase 1: postings, term_ptr, blk_id, blk_start of one shard; returns doc lengths and df counts."""
    si, d0, d1, bs_bits, tf_bits, out = job["shard"], job["doc_start"], job["doc_end"], job["bs_bits"], job["tf_bits"], Path(job["out"])
    rng = np.random.default_rng([job["seed"], si])
    lam = np.load(job["lam_path"], mmap_mode="r") * ((d1 - d0) / job["num_docs"])
    docs, counts = _shard_postings(rng, np.asarray(lam), d1 - d0)
    P = docs.size
    # tf = 1 + Geometric(tf_p), capped, by table lookup on 16 random bits (quantiles of the law).
    u = (np.arange(1 << 16) + 0.5) / (1 << 16)
    table = np.minimum(1 + np.floor(np.log1p(-u) / np.log1p(-job["tf_p"])), TF_CAP).astype(np.uint32)
    tf = table[rng.integers(0, 1 << 16, size=P, dtype=np.uint16)]
    if si == 0 and P:
        tf[0] = TF_CAP
    more = np.flatnonzero(tf > 1)  # most tfs are 1: count docs, then add the rest
    lengths = np.bincount(docs, minlength=d1 - d0) + np.bincount(docs[more], weights=tf[more] - 1,
                                                                  minlength=d1 - d0).astype(np.int64)
    del more
    gdoc = docs.astype(np.int64) + d0
    del docs
    blk = (gdoc >> bs_bits).astype(np.int32)
    nz = np.flatnonzero(counts)
    tstart = (np.cumsum(counts) - counts)[nz]
    change = np.zeros(P, dtype=bool)
    change[tstart] = True
    change[1:] |= blk[1:] != blk[:-1]
    starts = np.flatnonzero(change)
    entry_term = nz[np.searchsorted(tstart, starts, side="right") - 1]
    d = out / L.shard_dirname(si)
    d.mkdir()
    files = {}
    packed = ((gdoc & ((1 << bs_bits) - 1)).astype(np.uint32) << np.uint32(tf_bits)) | tf
    del gdoc, tf
    files[L.POSTINGS] = _write(d / L.POSTINGS, packed.astype("<u4"))
    del packed
    term_ptr = np.searchsorted(entry_term, np.arange(lam.size + 1), side="left").astype("<u4")
    files[L.TERM_PTR] = _write(d / L.TERM_PTR, term_ptr)
    files[L.BLK_ID] = _write(d / L.BLK_ID, blk[starts].astype("<u4"))
    files[L.BLK_START] = _write(d / L.BLK_START, np.append(starts, P).astype("<u4"))
    # Large per-shard results go through files: pickling them back would serialise the pool.
    np.save(out / f"_lengths_{si}.npy", lengths)
    np.save(out / f"_counts_{si}.npy", counts.astype(np.uint32))
    return {"shard": si, "postings": int(P), "entries": int(starts.size), "files": files}


def _bounds_shard(job: dict) -> dict:
    """Phase 2: blk_maxq / blk_maxtf / blk_minnorm of one shard (needs the global norms and avgdl)."""
    d = Path(job["out"]) / L.shard_dirname(job["shard"])
    tf_bits, bs_bits = job["tf_bits"], job["bs_bits"]
    post = np.fromfile(d / L.POSTINGS, dtype="<u4")
    bid = np.fromfile(d / L.BLK_ID, dtype="<u4").astype(np.int64)
    bst = np.fromfile(d / L.BLK_START, dtype="<u4").astype(np.int64)
    norms = np.memmap(Path(job["out"]) / L.NORMS, dtype=np.uint8, mode="r")
    cache = np.asarray(job["cache"], dtype=np.float32)
    files = {}
    if post.size:
        doc = (np.repeat(bid, np.diff(bst)) << bs_bits) + (post >> np.uint32(tf_bits)).astype(np.int64)
        tf = post & np.uint32((1 << tf_bits) - 1)
        nrm = np.asarray(norms[doc])
        del doc
        q = tf.astype(np.float32) * cache[nrm]
        s = bst[:-1]
        files[L.BLK_MAXQ] = _write(d / L.BLK_MAXQ, np.maximum.reduceat(q, s).astype("<f4"))
        files[L.BLK_MAXTF] = _write(d / L.BLK_MAXTF, np.maximum.reduceat(tf, s).astype("<u4"))
        files[L.BLK_MINNORM] = _write(d / L.BLK_MINNORM, np.minimum.reduceat(nrm, s).astype(np.uint8))
    else:
        for name in (L.BLK_MAXQ, L.BLK_MAXTF, L.BLK_MINNORM):
            files[name] = _write(d / name, np.zeros(0, np.uint8))
    return {"shard": job["shard"], "files": files}


def _fixed_width_ids(start: int, stop: int, width: int) -> np.ndarray:
    """Bytes of the decimal numbers start..stop-1, zero-padded to ``width`` (vectorised)."""
    n = np.arange(start, stop, dtype=np.int64)
    digits = np.empty((n.size, width), dtype=np.uint8)
    for i in range(width - 1, -1, -1):
        digits[:, i] = 48 + n % 10
        n //= 10
    return digits.reshape(-1)


def _root_file(job: dict) -> dict:
    """Vocabulary, external ids and stored text (placeholder) files."""
    out, kind, count, width = Path(job["out"]), job["kind"], job["count"], job["width"]
    h = hashlib.sha256()
    size = 0
    chunk = 1 << 22
    name = {"vocab": L.VOCAB_BYTES, "docids": L.DOCIDS_BYTES, "store": L.STORE_BYTES}[kind]
    with open(out / name, "wb") as f:
        for o in range(0, count, chunk):
            m = min(chunk, count - o)
            data = (np.full(m, ord(L.FIELD_SEPARATOR), np.uint8) if kind == "store"
                    else _fixed_width_ids(o, o + m, width)).tobytes()
            f.write(data)
            h.update(data)
            size += len(data)
    res = {name: {"bytes": size, "sha256": h.hexdigest()}}
    offsets = {"vocab": L.VOCAB_OFFSETS, "docids": L.DOCIDS_OFFSETS, "store": L.STORE_OFFSETS}[kind]
    h = hashlib.sha256()
    size = 0
    with open(out / offsets, "wb") as f:
        for o in range(0, count + 1, chunk):
            data = (np.arange(o, min(o + chunk, count + 1), dtype="<u8") * np.uint64(width if kind != "store" else 1)).tobytes()
            f.write(data)
            h.update(data)
            size += len(data)
    res[offsets] = {"bytes": size, "sha256": h.hexdigest()}
    return res


# ---- orchestration ----------------------------------------------------------------------------------------
def _plan_shards(df: np.ndarray, num_docs: int, block_size: int, bank_bytes: int, terms_per_doc: float) -> list[tuple[int, int]]:
    """Blocks per shard from the expected postings and entries of a block, with 3% headroom."""
    V = df.size
    p_blk = terms_per_doc * block_size
    e_blk = float((-np.expm1(-df * (block_size / num_docs))).sum())
    per_block = 4 * p_blk + 13 * e_blk + block_size
    room = 0.97 * bank_bytes - 4 * (V + 1) - 4
    b = int(room // per_block)
    if b < 1:
        raise SystemExit(f"a doc block needs ~{per_block:,.0f} bytes, more than a bank of {bank_bytes:,}: "
                         f"use a smaller --block-size or larger --bank-bytes")
    num_blocks = (num_docs + block_size - 1) // block_size
    return [(b0, min(b0 + b, num_blocks)) for b0 in range(0, num_blocks, b)]


def write_layout(out: Path, num_docs: int, terms_per_doc: float = 48.0, s: float = 1.0, r_c: int = 6276,
                 s_tail: float = 1.8, df_cap: float = 0.5, tf_p: float = 0.75, block_size: int = L.DEFAULT_BLOCK_SIZE,
                 bank_bytes: int = L.DEFAULT_BANK_BYTES, k1: float = 0.9, b: float = 0.4, seed: int = 1,
                 workers: int = 0, vocab: int = 0, log=print) -> dict:
    t0 = time.time()
    if out.exists():
        raise SystemExit(f"{out} already exists")
    tf_bits = L.tf_bits_for(TF_CAP)
    if block_size & (block_size - 1) or block_size > (1 << (32 - tf_bits)):
        raise SystemExit(f"block size must be a power of two <= 2^{32 - tf_bits}")
    bs_bits = block_size.bit_length() - 1
    df_rank = zipf_df(num_docs, terms_per_doc, s, r_c, s_tail, df_cap, vocab)
    V = df_rank.size
    rng = np.random.default_rng(seed)
    rank_of_term = rng.permutation(V)  # term id t has rank rank_of_term[t]
    lam = df_rank[rank_of_term]
    tmp = out.parent / f"{out.name}.partial-{os.getpid()}"
    tmp.mkdir(parents=True)
    np.save(tmp / "_lam.npy", lam)
    shards = _plan_shards(df_rank, num_docs, block_size, bank_bytes, terms_per_doc)
    log(f"synth: {num_docs:,} docs, vocab {V:,}, expected postings {df_rank.sum():,.0f}, {len(shards)} shards, "
        f"{time.time() - t0:.1f}s")
    jobs = [{"shard": i, "doc_start": b0 * block_size, "doc_end": min(b1 * block_size, num_docs), "bs_bits": bs_bits,
             "tf_bits": tf_bits, "out": str(tmp), "seed": seed, "lam_path": str(tmp / "_lam.npy"),
             "num_docs": num_docs, "tf_p": tf_p} for i, (b0, b1) in enumerate(shards)]
    workers = workers or os.cpu_count() or 1
    ctx = mp.get_context("fork")
    files: dict[str, dict] = {}
    # Closed and joined, not terminated: a forked worker may have inherited a signal handler that ignores SIGTERM
    # (a JVM loaded in the parent, as in the test process), and Pool.__exit__'s terminate() would wait forever.
    pool = ctx.Pool(workers)
    try:
        width_v, width_d = len(str(max(V - 1, 0))), len(str(max(num_docs - 1, 0)))
        roots = pool.map_async(_root_file, [{"out": str(tmp), "kind": "vocab", "count": V, "width": width_v},
                                            {"out": str(tmp), "kind": "docids", "count": num_docs, "width": width_d},
                                            {"out": str(tmp), "kind": "store", "count": num_docs, "width": 1}])
        res1 = sorted(pool.map(_gen_shard, jobs), key=lambda r: r["shard"])
        log(f"synth: postings written, {time.time() - t0:.1f}s")
        lengths = np.concatenate([np.load(tmp / f"_lengths_{r['shard']}.npy") for r in res1])
        df = np.zeros(V, dtype=np.int64)
        for r in res1:
            df += np.load(tmp / f"_counts_{r['shard']}.npy")
        doc_count = int((lengths > 0).sum())
        sum_tf = int(lengths.sum())
        avgdl = avgdl_f32(sum_tf, doc_count)
        files[L.NORMS] = _write(tmp / L.NORMS, encode_lengths(lengths))
        files[L.DF] = _write(tmp / L.DF, df.astype("<u4"))
        del lengths
        cache = norm_cache(k1, b, avgdl)
        res2 = pool.map(_bounds_shard, [{**j, "cache": cache.tolist()} for j in jobs])
        for r in roots.get():
            files.update(r)
    except BaseException:
        pool.terminate()
        raise
    pool.close()
    pool.join()
    for p in tmp.glob("_*.npy"):
        p.unlink()
    shard_meta = []
    for j, r1 in zip(jobs, res1):
        size = L.shard_bytes(r1["postings"], r1["entries"], V, j["doc_end"] - j["doc_start"])
        if size > bank_bytes:
            shutil.rmtree(tmp)
            raise SystemExit(f"shard {j['shard']} came out at {size:,} bytes, over the bank ({bank_bytes:,})")
        dname = L.shard_dirname(j["shard"])
        shard_meta.append({"dir": dname, "doc_start": j["doc_start"], "doc_end": j["doc_end"],
                           "block_start": j["doc_start"] >> bs_bits, "block_end": shards[j["shard"]][1],
                           "postings": r1["postings"], "entries": r1["entries"], "bytes": size})
        for name, meta in r1["files"].items():
            files[f"{dname}/{name}"] = meta
    for r2 in res2:
        for name, meta in r2["files"].items():
            files[f"{L.shard_dirname(r2['shard'])}/{name}"] = meta
    num_postings = sum(r["postings"] for r in res1)
    manifest = {
        "format": L.FORMAT_NAME, "version": L.FORMAT_VERSION,
        "analyzer": {"name": "lucene-english", **{k: v for k, v in AnalyzerConfig().__dict__.items() if k != "name"}},
        "bm25": {"k1": k1, "b": b},
        "stats": {"num_docs": num_docs, "doc_count": doc_count, "sum_total_tf": sum_tf, "avgdl": float(avgdl),
                  "vocab_size": V, "num_postings": num_postings, "max_tf": TF_CAP if num_postings else 0,
                  "empty_docs": num_docs - doc_count},
        "layout": {"block_size": block_size, "block_bits": 32 - tf_bits, "tf_bits": tf_bits, "bank_bytes": bank_bytes,
                   "accumulator_bytes": block_size * L.ACCUMULATOR_BYTES_PER_DOC,
                   "num_blocks": (num_docs + block_size - 1) // block_size, "num_shards": len(shard_meta),
                   "length_table": [int(x) for x in LENGTH_TABLE]},
        "shards": shard_meta,
        "files": dict(sorted(files.items())),
        "source": {"synthetic": {"generator": "scripts/synth_layout.py", "terms_per_doc": terms_per_doc, "zipf_s": s,
                                 "tail_rank": r_c, "tail_s": s_tail, "df_cap": df_cap, "tf_p": tf_p, "seed": seed}},
        "build_seconds": round(time.time() - t0, 3),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "builder": "scripts/synth_layout.py",
    }
    with open(tmp / L.MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(out)
    log(f"synth: {out} done: {num_postings:,} postings, {sum(m['bytes'] for m in files.values()) / 1e9:.2f} GB, "
        f"{time.time() - t0:.1f}s")
    return manifest


# ---- query mapping --------------------------------------------------------------------------------------
class QueryMapper:
    """Real query text -> synthetic query text over ``synth``'s vocabulary, by df rank (see the module docstring).

    Built once per (synthetic, reference) pair; calling it maps one query string, so a RAG loop's queries can be
    mapped as they are formed. A query with no analysed term (only stopwords or punctuation) maps to ""."""

    def __init__(self, synth: Path | IndexReader, reference: Path | IndexReader) -> None:
        self.synth = synth if isinstance(synth, IndexReader) else IndexReader(synth)
        self.reference = reference if isinstance(reference, IndexReader) else IndexReader(reference)
        syn_df = np.asarray(self.synth.df).astype(np.int64)
        self._by_df = np.argsort(syn_df, kind="stable")  # term ids, df ascending
        self._sorted_df = syn_df[self._by_df].astype(np.float64)  # float like the keys: searchsorted would convert per call
        self.scale = self.synth.doc_count / self.reference.doc_count
        self._width = len(str(max(self.synth.vocab_size - 1, 0)))
        self._ref_df = np.asarray(self.reference.df)

    def term(self, term: str) -> int:
        """The synthetic term id an analysed real term maps to."""
        sorted_df, scale = self._sorted_df, self.scale
        t = self.reference.term_ids.get(term)
        dref = int(self._ref_df[t]) if t is not None else 0
        lo = np.searchsorted(sorted_df, (dref - 0.5) * scale, side="left") if dref else 0
        hi = np.searchsorted(sorted_df, (dref + 0.5) * scale, side="right")
        if hi <= lo:  # empty bin: the nearest df
            lo = min(int(np.searchsorted(sorted_df, dref * scale)), sorted_df.size - 1)
            hi = lo + 1
        return int(self._by_df[lo + zlib.crc32(term.encode()) % (hi - lo)])

    def __call__(self, text: str) -> str:
        counts, _ = self.reference.analyzer.term_counts(text)
        words = []
        for term, c in counts.items():
            words += [str(self.term(term)).zfill(self._width)] * c
        return " ".join(words)


def map_queries(synth_dir: Path, reference_dir: Path, topics: Path, limit: int = 0) -> list[tuple[str, str]]:
    """(qid, synthetic query text) for the real queries of ``topics`` that keep a term (see ``QueryMapper``)."""
    from ragserve.topics import read_queries

    mapper = QueryMapper(synth_dir, reference_dir)
    out = []
    for q in read_queries(topics)[:limit or None]:
        text = mapper(q.text)
        if text:
            out.append((q.id, text))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write a synthetic index")
    w.add_argument("out", type=Path)
    w.add_argument("--docs", type=int, required=True)
    w.add_argument("--terms-per-doc", type=float, default=48.0)
    w.add_argument("--zipf-s", type=float, default=1.0)
    w.add_argument("--tail-rank", type=int, default=6276)
    w.add_argument("--tail-s", type=float, default=1.8)
    w.add_argument("--df-cap", type=float, default=0.5)
    w.add_argument("--tf-p", type=float, default=0.75)
    w.add_argument("--vocab", type=int, default=0, help="vocabulary size (default: where the expected df reaches 1)")
    w.add_argument("--block-size", type=int, default=L.DEFAULT_BLOCK_SIZE)
    w.add_argument("--bank-bytes", type=int, default=L.DEFAULT_BANK_BYTES)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--workers", type=int, default=0)
    q = sub.add_parser("queries", help="map real queries onto a synthetic index's vocabulary")
    q.add_argument("index", type=Path)
    q.add_argument("--reference", type=Path, required=True, help="index of real text giving the df of real terms")
    q.add_argument("--topics", type=Path, required=True)
    q.add_argument("--out", type=Path, required=True)
    q.add_argument("--limit", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "write":
        write_layout(a.out, a.docs, a.terms_per_doc, a.zipf_s, a.tail_rank, a.tail_s, a.df_cap, a.tf_p, a.block_size,
                     a.bank_bytes, seed=a.seed, workers=a.workers, vocab=a.vocab)
    else:
        rows = map_queries(a.index, a.reference, a.topics, a.limit)
        a.out.write_text("".join(f"{qid}\t{text}\n" for qid, text in rows))
        print(f"{len(rows)} queries -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
