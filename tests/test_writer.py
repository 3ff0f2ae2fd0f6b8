"""Layout writer: round trip, shard/bank sizing, block tables, atomic and interrupted builds."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from indexer import layout as L
from indexer.analyzer import Analyzer
from indexer.reader import IndexReader, InvalidIndexError
from indexer.options import BuildError, BuildOptions
from indexer.writer import build_index_from_documents
from indexer import bm25


@dataclass
class D:
    id: str
    title: str
    text: str


def _corpus(n: int, seed: int = 1) -> list[D]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)] + ["the", "of", "running", "runs", "Caf\u00e9", "na\u00efve"]
    weights = [1.0 / (r + 1) for r in range(len(words))]
    docs = []
    for i in range(n):
        length = rng.randint(0, 40)
        text = " ".join(rng.choices(words, weights, k=length))
        docs.append(D(f"doc-{i}", f"Title {i % 7}" if i % 3 else "", text))
    return docs


def _opts(**kw) -> BuildOptions:
    base = dict(block_size=64, bank_bytes=16 << 10, progress=False, workers=1)
    base.update(kw)
    return BuildOptions(**base)


def test_round_trip_postings_norms_and_text(tmp_path):
    docs = _corpus(700)
    m = build_index_from_documents(docs, tmp_path / "idx", _opts())
    r = IndexReader(tmp_path / "idx", verify=True)
    assert m["layout"]["num_shards"] > 1 and m["layout"]["num_blocks"] == 11
    an = Analyzer()
    expected: dict[str, dict[int, int]] = {}
    lengths = []
    for i, d in enumerate(docs):
        counts, n = an.term_counts(f"{d.title} {d.text}" if d.title else d.text)
        lengths.append(n)
        for t, c in counts.items():
            expected.setdefault(t, {})[i] = c
    assert sorted(expected) == sorted(r.term_ids)
    assert list(r.term_ids) == sorted(r.term_ids, key=lambda t: t.encode())  # ids follow UTF-8 byte order
    for term, postings in expected.items():
        t = r.term_ids[term]
        docs_, tfs = r.postings(t)
        assert dict(zip(docs_.tolist(), tfs.tolist())) == postings
        assert int(r.df[t]) == len(postings)
    assert r.doc_count == sum(1 for n in lengths if n > 0)
    assert r.manifest["stats"]["sum_total_tf"] == sum(lengths)
    assert np.float32(r.manifest["stats"]["avgdl"]) == bm25.avgdl_f32(sum(lengths), r.doc_count)
    for i in (0, 1, 350, 699):
        assert r.document(i) == (docs[i].title, docs[i].text)
        assert r.external_id(i) == docs[i].id


def test_shards_fit_banks_and_block_tables_are_consistent(tmp_path):
    build_index_from_documents(_corpus(900), tmp_path / "idx", _opts(fine_block=8))
    r = IndexReader(tmp_path / "idx")
    lay = r.manifest["layout"]
    cache = bm25.norm_cache(r.k1, r.b, r.avgdl)
    prev_end = 0
    for sm, sh in zip(r.manifest["shards"], r.shards):
        assert sm["bytes"] <= lay["bank_bytes"]
        assert sm["doc_start"] == prev_end and sm["doc_start"] == sm["block_start"] * lay["block_size"]
        prev_end = sm["doc_end"]
        assert np.all(np.diff(sh.blk_start.astype(np.int64)) > 0)  # no empty entries
        assert int(sh.blk_start[-1]) == sh.postings.size
        for t in range(0, r.vocab_size, 7):
            e0, e1 = int(sh.term_ptr[t]), int(sh.term_ptr[t + 1])
            blocks = sh.blk_id[e0:e1].astype(np.int64)
            assert np.all(np.diff(blocks) > 0) and np.all((blocks >= sm["block_start"]) & (blocks < sm["block_end"]))
            for e in range(e0, e1):
                p = np.asarray(sh.postings[int(sh.blk_start[e]):int(sh.blk_start[e + 1])])
                off, tf = L.unpack_postings(p, r.tf_bits)
                assert np.all(np.diff(off.astype(np.int64)) > 0) and int(off.max()) < lay["block_size"]
                docs = int(sh.blk_id[e]) * lay["block_size"] + off.astype(np.int64)
                q = tf.astype(np.float32) * cache[np.asarray(r.norms)[docs]]
                assert np.float32(sh.blk_maxq[e]) == q.max()
                assert int(sh.blk_maxtf[e]) == int(tf.max())
                assert int(sh.blk_minnorm[e]) == int(np.asarray(r.norms)[docs].min())
                # Fine bounds: the entry's postings in runs of fine_block, each with its max q and last offset.
                f0, f1 = int(sh.fine_ptr[e]), int(sh.fine_ptr[e + 1])
                fb = lay["fine_block"]
                assert f1 - f0 == -(-off.size // fb)
                for i, f in enumerate(range(f0, f1)):
                    assert np.float32(sh.fine_maxq[f]) == q[i * fb:(i + 1) * fb].max()
                    assert int(sh.fine_last[f]) == int(off[min((i + 1) * fb, off.size) - 1])
        assert int(sh.fine_ptr[-1]) == sm["fine_blocks"] == sh.fine_maxq.size == sh.fine_last.size
    assert prev_end == r.num_docs


def test_two_workers_give_identical_files(tmp_path):
    docs = _corpus(2500, seed=3)
    a = build_index_from_documents(docs, tmp_path / "a", _opts(workers=1))
    b = build_index_from_documents(docs, tmp_path / "b", _opts(workers=2))
    assert {k: v["sha256"] for k, v in a["files"].items()} == {k: v["sha256"] for k, v in b["files"].items()}


def test_small_run_budget_gives_identical_files(tmp_path):
    docs = _corpus(1500, seed=4)
    a = build_index_from_documents(docs, tmp_path / "a", _opts())
    b = build_index_from_documents(docs, tmp_path / "b", _opts(run_postings=500))
    assert {k: v["sha256"] for k, v in a["files"].items()} == {k: v["sha256"] for k, v in b["files"].items()}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_interrupted_build_leaves_nothing(tmp_path, exc, workers):
    def docs():
        for i, d in enumerate(_corpus(5000)):
            if i == 3000:
                raise exc("interrupted")
            yield d

    with pytest.raises(exc):
        build_index_from_documents(docs(), tmp_path / "idx", _opts(workers=workers))
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_stops_a_pool_build_and_leaves_nothing(tmp_path):
    """SIGINT to the whole process group (Ctrl-C) while workers run: the build stops at once, leaving nothing."""
    script = ("import itertools, sys\n"
              "from indexer.options import BuildOptions\n"
              "from indexer.writer import build_index_from_documents\n"
              "from tests.test_writer import _corpus\n"
              "docs = itertools.chain.from_iterable(itertools.repeat(_corpus(2000), 10_000))\n"
              "build_index_from_documents(docs, sys.argv[1], BuildOptions(progress=False, workers=2))\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "idx")], cwd=Path(__file__).parents[1],
                            start_new_session=True, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not any(tmp_path.iterdir()) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(2)  # the workers are busy by now
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err
    assert list(tmp_path.iterdir()) == []


def test_failed_rebuild_keeps_the_old_index(tmp_path):
    build_index_from_documents(_corpus(100), tmp_path / "idx", _opts())
    before = (tmp_path / "idx" / L.MANIFEST).read_text()

    def bad():
        yield from _corpus(50)
        raise ValueError("broken input")

    with pytest.raises(ValueError):
        build_index_from_documents(bad(), tmp_path / "idx", _opts(overwrite=True))
    assert (tmp_path / "idx" / L.MANIFEST).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    IndexReader(tmp_path / "idx", verify=True)


def test_existing_output_requires_overwrite(tmp_path):
    build_index_from_documents(_corpus(10), tmp_path / "idx", _opts())
    with pytest.raises(BuildError, match="already exists"):
        build_index_from_documents(_corpus(10), tmp_path / "idx", _opts())
    build_index_from_documents(_corpus(20), tmp_path / "idx", _opts(overwrite=True))
    assert IndexReader(tmp_path / "idx").num_docs == 20


def test_bad_options_and_empty_input(tmp_path):
    with pytest.raises(BuildError, match="power of two"):
        build_index_from_documents(_corpus(10), tmp_path / "x", _opts(block_size=100))
    with pytest.raises(BuildError, match="no documents"):
        build_index_from_documents([], tmp_path / "y", _opts())
    with pytest.raises(BuildError, match="alone needs"):
        build_index_from_documents(_corpus(200), tmp_path / "z", _opts(bank_bytes=2048))
    assert list(tmp_path.iterdir()) == []


def test_large_tf_shrinks_tf_field_not_values(tmp_path):
    docs = [D("a", "", "word " * 70000 + "other"), D("b", "", "word other other")]
    with pytest.raises(BuildError, match="block-size"):
        build_index_from_documents(docs, tmp_path / "x", _opts(block_size=1 << 18))
    build_index_from_documents(docs, tmp_path / "idx", _opts(block_size=1 << 10))
    r = IndexReader(tmp_path / "idx")
    assert r.tf_bits == 17
    d, tf = r.postings(r.term_ids["word"])
    assert tf.tolist() == [70000, 1]


def test_corrupt_or_partial_index_is_rejected(tmp_path):
    with pytest.raises(InvalidIndexError, match="no manifest|not an index"):
        IndexReader(tmp_path)
    build_index_from_documents(_corpus(100), tmp_path / "idx", _opts())
    post = tmp_path / "idx" / "shard_0000" / L.POSTINGS
    data = bytearray(post.read_bytes())
    data[0] ^= 0xFF
    post.write_bytes(bytes(data))
    IndexReader(tmp_path / "idx")  # sizes still match
    with pytest.raises(InvalidIndexError, match="checksum"):
        IndexReader(tmp_path / "idx", verify=True)
    post.write_bytes(bytes(data[:-4]))
    with pytest.raises(InvalidIndexError, match="truncated"):
        IndexReader(tmp_path / "idx")
    m = json.loads((tmp_path / "idx" / L.MANIFEST).read_text())
    m["version"] = 99
    (tmp_path / "idx" / L.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InvalidIndexError, match="version"):
        IndexReader(tmp_path / "idx")


def _reference_shard(parts: list[tuple], remap: np.ndarray, log2_bs: int, tf_bits: int, norms: np.ndarray,
                     cache: np.ndarray, fine_block: int) -> dict:
    """A shard's arrays, fine bounds included, by a plain lexsort/reduceat construction."""
    V = remap.size
    tid = np.concatenate([p[0] for p in parts]).astype(np.int64)
    tf = np.concatenate([p[1] for p in parts]).astype(np.int64)
    doc = np.concatenate([np.repeat(np.arange(first, first + uniq.size), uniq) for _, _, uniq, first in parts])
    tid = remap[tid]
    order = np.lexsort((doc, tid))
    tid, doc, tf = tid[order], doc[order], tf[order]
    blk = doc >> log2_bs
    starts = np.flatnonzero(np.concatenate(([True], (tid[1:] != tid[:-1]) | (blk[1:] != blk[:-1]))))
    q = tf.astype(np.float32) * cache[norms[doc]]
    ends = np.append(starts[1:], tid.size)
    fine_starts = [np.arange(a, b, fine_block) for a, b in zip(starts, ends)]
    first = np.concatenate(fine_starts)
    last = np.minimum(first + fine_block, np.repeat(ends, [f.size for f in fine_starts])) - 1
    return {
        L.FINE_PTR: np.cumsum([0] + [f.size for f in fine_starts]).astype(np.uint32),
        L.FINE_MAXQ: np.maximum.reduceat(q, first),
        L.FINE_LAST: (doc - (blk << log2_bs))[last].astype(np.uint32),
        L.POSTINGS: ((doc - (blk << log2_bs)) << tf_bits | tf).astype(np.uint32),
        L.TERM_PTR: np.searchsorted(tid[starts], np.arange(V + 1)).astype(np.uint32),
        L.BLK_ID: blk[starts].astype(np.uint32),
        L.BLK_START: np.append(starts, tid.size).astype(np.uint32),
        L.BLK_MAXQ: np.maximum.reduceat(q, starts),
        L.BLK_MAXTF: np.maximum.reduceat(tf, starts).astype(np.uint32),
        L.BLK_MINNORM: np.minimum.reduceat(norms[doc], starts),
    }


def test_shard_counting_sort_matches_a_lexsort_reference(tmp_path):
    """write_shard (counting sort on two threads, numba block tables) against a plain construction."""
    from concurrent.futures import ThreadPoolExecutor

    from indexer.files import Checksums
    from indexer.packing import write_shard

    rng = np.random.default_rng(0)
    log2_bs, tf_bits, V = 8, 6, 300
    parts = []
    for d0 in (0, 500, 700):  # runs in docid order, postings grouped by document; blocks of 256 docs
        pairs = sorted({(int(d), int(t)) for t, d in zip(rng.integers(0, V, 4000), rng.integers(d0, d0 + 200, 4000))})
        uniq = np.bincount([d - d0 for d, _ in pairs], minlength=200).astype(np.uint32)
        parts.append((np.array([t for _, t in pairs], dtype=np.uint32),
                      rng.integers(1, 60, len(pairs)).astype(np.uint32), uniq, d0))
    remap = rng.permutation(V).astype(np.int64)
    norms = rng.integers(0, 256, 1000).astype(np.uint8)
    cache = rng.random(256).astype(np.float32)
    wants = []
    with Checksums(tmp_path) as sums, ThreadPoolExecutor(2) as pool:
        # Three runs (the two scatter halves cut inside the second), one run, none.
        for i, runs in enumerate((parts, parts[1:2], [])):
            d = tmp_path / f"shard{i}"
            d.mkdir()
            want = _reference_shard(runs, remap, log2_bs, tf_bits, norms, cache, fine_block=16) if runs else {
                L.POSTINGS: np.zeros(0, np.uint32), L.TERM_PTR: np.zeros(V + 1, np.uint32),
                L.BLK_START: np.zeros(1, np.uint32), L.FINE_PTR: np.zeros(1, np.uint32)}
            entries = want[L.BLK_START].size - 1
            got = write_shard(d, runs, remap, entries, log2_bs, tf_bits, norms, cache, pool, sums, fine_block=16)
            assert got == (want[L.POSTINGS].size, entries, want[L.FINE_PTR][-1])
            wants.append((d, want))
        files = sums.files()  # waits for the background writes
    for d, want in wants:
        for name, a in want.items():
            assert (d / name).read_bytes() == a.astype(a.dtype.newbyteorder("<")).tobytes(), name
    assert files["shard0/" + L.POSTINGS]["sha256"] == hashlib.sha256((tmp_path / "shard0" / L.POSTINGS).read_bytes()).hexdigest()
    assert len(files) == 3 * (len(L.SHARD_FILES) + len(L.FINE_FILES))
