"""The live index (indexer/segments.py, indexer/wal.py, ragserve/retrieval/live.py): exact scores after any writes,
crash safety of acknowledged writes, the CLI."""
from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from indexer.readers import iter_documents
from indexer.readers.model import Document
from indexer.reader import IndexReader, InvalidIndexError
from indexer.segments import LiveIndex, LiveIndexLocked, MergePolicy, is_live
from indexer.options import BuildOptions
from indexer.writer import build_index_from_documents
from ragserve.retrieval.live import LiveSearcher
from ragserve.retrieval.searcher import Searcher

from tests.conftest import shared

OPTS = BuildOptions(block_size=1 << 11, bank_bytes=3 << 20, progress=False, workers=1)


@pytest.fixture(scope="module")
def arguana_docs() -> list[Document]:
    return list(iter_documents([shared("beir-arguana", "corpus.jsonl.gz")]))


def _copy(index: Path, to: Path) -> Path:
    shutil.copytree(index, to)
    return to


def _ranked(hits) -> list[tuple]:
    """What parity means: the id, the f32 score bits and the docid (the tie order) of every hit, in order."""
    return [(h.id, int(np.float32(h.score).view(np.uint32)), h.docid) for h in hits]


def _random_writes(live: LiveIndex, pool: list[Document], cur: OrderedDict, n_ops: int, seed: int) -> int:
    """``n_ops`` interleaved adds, replaces and deletes in requests of 1-40, refreshes and policy merges between,
    and once a merge of every segment in a thread while the writes go on (deletes of documents it is merging
    carry over to its result). ``cur`` mirrors the live documents in last-written order. Returns the writes made
    while that merge ran."""
    rng = random.Random(seed)
    gone: list[str] = []
    done, fresh_id = 0, 0
    next_refresh = rng.randint(300, 1200)
    merging: threading.Thread | None = None
    during = 0
    while done < n_ops:
        ops = []
        for _ in range(min(rng.randint(1, 40), n_ops - done)):
            r = rng.random()
            a = rng.choice(pool)
            words = a.text.split()
            at = rng.randrange(max(1, len(words) - 20))
            # A window of a passage: lengths and term statistics move with every write, analysis stays cheap.
            doc = (a.title, " ".join(words[at:at + rng.randint(5, 60)]))
            if r < 0.35 or not cur:
                i = f"new-{fresh_id}"
                fresh_id += 1
            elif r < 0.65:
                i = rng.choice(list(cur)) if rng.random() < 0.5 else next(reversed(cur))  # replace
            elif r < 0.9:
                i = rng.choice(list(cur))
                ops.append(("delete", i))
                cur.pop(i)
                gone.append(i)
                continue
            else:
                i = rng.choice(gone) if gone else f"new-{fresh_id}"  # an id deleted before comes back
            ops.append(("add", Document(i, *doc)))
            cur.pop(i, None)
            cur[i] = doc
        live.apply(ops)
        done += len(ops)
        if merging is not None and merging.is_alive():
            during += len(ops)
        if done >= next_refresh:
            live.refresh()
            if merging is None and done > n_ops // 2:
                merging = threading.Thread(target=live.merge, args=(0, len(live.snapshot().segments)))
                merging.start()
            elif merging is None or not merging.is_alive():
                live.maybe_merge()
            next_refresh = done + rng.randint(300, 1200)
    if merging is not None:
        merging.join()
    live.refresh()
    return during


def _compare(live: LiveIndex, want: list[list[tuple]], queries: list[str], backend: str, options: dict,
             k: int = 100) -> int:
    """Asserts the live ranking is ``want``; returns the segments skipped by their score bound."""
    ls = LiveSearcher(live, backend=backend, **options)
    try:
        got = [_ranked(h) for h in ls.search_batch(queries, k=k, with_text=False)]
    finally:
        ls.close()
    bad = [q for q, a, b in zip(queries, got, want) if a != b]
    assert not bad, f"{backend}: {len(bad)} of {len(queries)} queries differ from the fresh build, e.g. {bad[0]!r}"
    return ls.skipped


def _fresh_ranking(fresh: Path, queries: list[str], backend: str = "cpu", options: dict | None = None,
                   k: int = 100) -> list[list[tuple]]:
    s = Searcher(fresh, backend=backend, **(options if options is not None else {"threads": 1}))
    try:
        return [_ranked(h) for h in s.search_batch(queries, k=k, with_text=False)]
    finally:
        s.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory, arguana_index, arguana_docs, arguana_queries):
    """ArguAna after 10,000 random writes (a live index, kept unmerged), a fresh build of its final documents in
    last-written order, and that build's top-100 of every ArguAna query (ranked on cpu: the backends agree on
    a plain index, which test_hls_parity and test_fpga_backend hold them to, and is checked again below)."""
    tmp = tmp_path_factory.mktemp("live")
    live = LiveIndex(_copy(arguana_index, tmp / "live"), policy=MergePolicy(max_segments=6, merge_factor=3))
    cur = OrderedDict((d.id, (d.title, d.text)) for d in arguana_docs)
    during = _random_writes(live, arguana_docs, cur, 10_000, seed=34)
    assert during > 0  # writes did overlap the threaded merge
    snap = live.snapshot()
    assert len(snap.segments) > 1 and any(s.deleted.size for s in snap.segments)  # deltas and tombstones
    assert [d[0] for d in snap.documents()] == list(cur)  # last-written order
    live.close()
    fresh = tmp / "fresh"
    m = build_index_from_documents([Document(i, *v) for i, v in cur.items()], fresh, OPTS)
    assert (snap.num_docs, snap.doc_count, snap.sum_total_tf) == (
        m["stats"]["num_docs"], m["stats"]["doc_count"], m["stats"]["sum_total_tf"])
    assert snap.avgdl == np.float32(m["stats"]["avgdl"])
    queries = [q.text for q in arguana_queries]
    want = _fresh_ranking(fresh, queries)
    assert sum(map(len, want)) > len(queries) * 90  # the queries do match documents
    return tmp / "live", list(cur), fresh, queries, want


def _open_copy(written, to: Path) -> LiveIndex:
    return LiveIndex(_copy(written[0], to))


@pytest.mark.parametrize("backend,options", [("cpu", {"threads": 1}), ("fpga-sim", {})])
def test_random_writes_equal_a_fresh_build(tmp_path, written, backend, options):
    """After 10,000 interleaved adds, replaces and deletes over ArguAna, every ArguAna query at k=100 (on fpga-sim
    the first 300 of them) ranks the same ids, f32 score bits and order (docids: the tie order) as a fresh build of
    the final documents in last-written order, before and after a merge."""
    _, order, fresh, queries, want = written
    if backend != "cpu":  # the kernel's C simulation, ~5 ms a query here: the segments and tombstones it searches
        queries, want = queries[:300], want[:300]  # are the same for every query, which cpu ranks all of
        assert _fresh_ranking(fresh, queries[:100], backend, options) == want[:100]
    live = _open_copy(written, tmp_path / "live")
    if backend == "cpu":  # the small segments at the end are searched as one folded index (SegmentSet(fold=))
        snap = live.snapshot()
        ls = LiveSearcher(live, backend=backend, **options)
        n = sum(1 for s in snap.segments if s.n_live)
        assert n > 2 and ls._segment_set(snap, snap.k1, snap.b)[0].rows < n
        ls.close()
    _compare(live, want, queries, backend, options)
    if backend == "cpu":  # short queries at k=10, where pruning across segments skips the most, exactly
        short = [" ".join(q.split()[:3]) for q in queries[:300]]
        want_short = _fresh_ranking(fresh, short, k=10)
        _compare(live, want_short, short, backend, options, k=10)
        # A call per segment (the gpu and fpga way): small segments are skipped by their bound, exactly.
        assert _compare(live, want_short, short, backend, {**options, "per_segment": True}, k=10) > 0
    live.force_merge()
    assert len(live.snapshot().segments) == 1 and not live.snapshot().segments[0].deleted.size
    _compare(live, want, queries, backend, options)
    live.close()
    again = LiveIndex(tmp_path / "live", writable=False)  # reopened from disk: the same state
    assert [d[0] for d in again.snapshot().documents()] == order


def test_random_writes_gpu_backend_on_cpu(written):
    """The gpu backend (torch's CPU device) over the same live index: the fresh build's ranking too."""
    path, _, _, queries, want = written
    live = LiveIndex(path, writable=False)
    _compare(live, want[:40], queries[:40], "gpu", {"device": "cpu"})


# -- crash safety -------------------------------------------------------------------------------------

def _writer_child(root: Path, seed: int, fd: int) -> None:
    """Runs in a forked child: writes in a loop, telling the parent each request before it is made (TRY) and once
    it is acknowledged (ACK); refreshes and merges now and then. Killed by the parent at a random moment."""
    out = os.fdopen(fd, "w", buffering=1)
    live = LiveIndex(root, policy=MergePolicy(max_segments=4, merge_factor=2))
    rng = random.Random(seed)
    ids = [d[0] for d in live.snapshot().documents()] + list(live._pending)
    n = 0
    while True:
        n += 1
        ops = []
        for _ in range(rng.randint(1, 8)):
            if ids and rng.random() < 0.3:
                i = ids.pop(rng.randrange(len(ids)))
                ops.append({"op": "delete", "id": i})
            else:
                i = f"s{seed}-{n}-{len(ops)}" if rng.random() < 0.7 or not ids else rng.choice(ids)
                ops.append({"op": "add", "id": i, "title": f"t {i}", "text": f"crash test {i} " * rng.randint(1, 4)})
                if i not in ids:
                    ids.append(i)
        out.write("TRY " + json.dumps(ops) + "\n")
        live.apply([(o["op"], o["id"] if o["op"] == "delete" else o) for o in ops])
        out.write("ACK\n")
        r = rng.random()
        if r < 0.08:
            live.refresh()
        elif r < 0.1:
            live.refresh()
            live.maybe_merge()


def _read_child(fd: int, buf: bytearray, deadline: float, until: Callable[[bytearray], bool] | None = None) -> None:
    """Reads the child's lines into ``buf`` until ``deadline`` (monotonic), the end of the pipe, or ``until(buf)``
    holds; draining as it waits, so the child never blocks on a full pipe."""
    while until is None or not until(buf):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if select.select([fd], [], [], min(left, 60.0))[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            buf += chunk


def _apply(state: OrderedDict, ops: list[dict]) -> None:
    for o in ops:
        state.pop(o["id"], None)
        if o["op"] == "add":
            state[o["id"]] = (o["title"], o["text"])


def test_sigkill_loses_no_acknowledged_write(tmp_path):
    """A child writing in a loop is killed with SIGKILL at random moments, 20 times (every other one just after a
    request is told, to catch it in flight); after each kill the index opens, holds every acknowledged write, and
    the request in flight is either whole or absent."""
    root = tmp_path / "live"
    LiveIndex(root, create=True).close()
    state: OrderedDict = OrderedDict()
    rng = random.Random(7)
    outcomes = {"whole": 0, "absent": 0}
    for kill in range(20):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            os.close(r)
            try:
                _writer_child(root, kill, w)
            finally:
                os._exit(0)
        os.close(w)
        # The kill lands at a random moment of the write loop: the random wait starts once the child has told its
        # first request (opening the index, a replay and a commit, can outlast any fixed wait on a busy machine).
        # Every other kill then waits for the next request to be told and kills at once, so requests in flight
        # (mostly faster than the refreshes and merges between them) are caught often, not by luck.
        got_lines = bytearray()
        _read_child(r, got_lines, time.monotonic() + 120, until=lambda b: b"\n" in b)
        assert got_lines.startswith(b"TRY "), f"kill {kill}: the writer made no request within 120 s"
        _read_child(r, got_lines, time.monotonic() + rng.uniform(0.02, 0.35))
        if kill % 2:
            told = got_lines.count(b"TRY ")
            _read_child(r, got_lines, time.monotonic() + 120, until=lambda b: b.count(b"TRY ") > told)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _read_child(r, got_lines, float("inf"))  # the rest, up to the end of the pipe
        os.close(r)
        inflight = None
        for line in got_lines.decode().splitlines():
            if line.startswith("TRY "):
                inflight = json.loads(line[4:])
            elif line == "ACK":
                _apply(state, inflight)
                inflight = None
        live = LiveIndex(root)  # replays the log, drops a torn tail, commits
        got = OrderedDict((i, (t, x)) for i, t, x in live.snapshot().documents())
        if inflight is not None and got != state:
            _apply(state, inflight)  # logged whole before the kill, not yet acknowledged
            outcomes["whole"] += 1
        elif inflight is not None:
            outcomes["absent"] += 1
        assert list(got.items()) == list(state.items()), f"kill {kill}: the index lost or half-applied a write"
        live.close()
    assert sum(outcomes.values()) > 0 and len(state) > 50, (outcomes, len(state))


# -- the CLI and the format ------------------------------------------------------------------------

def _ragserve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ragserve", *args], capture_output=True, text=True, timeout=300)


def test_cli_add_delete_merge(tmp_path, arguana_index):
    idx = _copy(arguana_index, tmp_path / "idx")
    n0 = IndexReader(idx).num_docs
    new = tmp_path / "new.jsonl"
    new.write_text("\n".join(json.dumps({"_id": f"x{i}", "title": "zebra", "text": f"zebra crossing number {i}"})
                             for i in range(3)) + "\n")
    p = _ragserve("add", str(new), "--index", str(idx))
    assert p.returncode == 0, p.stderr
    assert is_live(idx) and "added 3 documents" in p.stderr
    with pytest.raises(InvalidIndexError, match="live index"):
        IndexReader(idx)
    p = _ragserve("search", "zebra crossing", "--index", str(idx), "-k", "5", "--json")
    assert p.returncode == 0, p.stderr
    assert {h["id"] for h in json.loads(p.stdout)} >= {"x0", "x1", "x2"}
    p = _ragserve("delete", "--index", str(idx), "x1", "nope")
    assert p.returncode == 0 and "deleted 1 documents" in p.stderr and "nope" in p.stderr
    p = _ragserve("merge", "--index", str(idx))
    assert p.returncode == 0, p.stderr
    assert f"{n0 + 2:,} documents in 1 segment(s)" in p.stdout
    live = LiveIndex(idx)
    with pytest.raises(LiveIndexLocked):  # one writer at a time
        LiveIndex(idx)
    p = _ragserve("add", str(new), "--index", str(idx))
    assert p.returncode == 2 and "open for writing by another process" in p.stderr
    live.close()
    p = _ragserve("add", str(new), "--index", str(tmp_path / "none"))
    assert p.returncode == 2 and "--create" in p.stderr


def test_searcher_closes_the_live_index_it_opened(tmp_path, arguana_index):
    """A ``LiveSearcher`` given a path opens the index (for writing, taking its lock, when no other process writes
    it) and closes it with itself: the lock is free again."""
    idx = _copy(arguana_index, tmp_path / "idx")
    LiveIndex(idx).close()  # a live index now
    ls = LiveSearcher(idx, backend="cpu", threads=1)
    assert ls.live.writable
    with pytest.raises(LiveIndexLocked):
        LiveIndex(idx)
    assert ls.search("vegetarian", k=3, with_text=False)
    ls.close()
    LiveIndex(idx).close()


def test_refresh_extends_the_delta_vocabulary_exactly(tmp_path, written, arguana_docs):
    """With a cpu searcher attached, each refresh extends the small segments' shared vocabulary (and sums their
    live dfs again) from the snapshot before: it equals one built from scratch, deletes in old deltas included,
    and searches still rank as the per-segment path does."""
    from indexer.segments import Snapshot

    live = _open_copy(written, tmp_path / "live")
    ls = LiveSearcher(live, backend="cpu", threads=1)
    rng = random.Random(7)
    for r in range(4):
        live.add([Document(f"v{r}-{i}", d.title, d.text) for i, d in enumerate(rng.sample(arguana_docs, 30))])
        if r:  # deletes in the delta before: its live df changes under the shared vocabulary
            live.delete([f"v{r - 1}-{i}" for i in range(5)])
        before = live.snapshot()
        snap = live.refresh()
        assert snap is not before and "small_terms_by_name" in snap.__dict__  # readied before it was published
        fresh = Snapshot(snap.generation, snap.segments, snap.settings)
        got, want = snap.small_terms, fresh.small_terms
        assert np.array_equal(got[0], want[0]) and got[1] == want[1]
        assert np.array_equal(got[2], want[2]) and np.array_equal(got[3], want[3])
    queries = [" ".join(d.text.split()[:6]) for d in arguana_docs[:60]]
    ref = LiveSearcher(live, backend="cpu", threads=1, per_segment=True)
    assert [_ranked(h) for h in ls.search_batch(queries, k=20, with_text=False)] == \
        [_ranked(h) for h in ref.search_batch(queries, k=20, with_text=False)]
    ref.close()
    ls.close()
    live.close()
