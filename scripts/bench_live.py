"""A live index against rebuilding: write throughput, refresh latency, search latency with 0/1/10 delta segments
against the merged index, merge time (``indexer/segments.py``, ``ragserve/retrieval/live.py``).

    nice -n 10 .venv/bin/python scripts/bench_live.py --docs 1000000 --json benchmarks/raw/live/live_1m.json

Steps, on a synthetic corpus (``indexer.synth``) of N passages plus 1% more, and synthetic queries:
1. rebuild: ``build_index`` of the N passages (the cost a live index saves);
2. the base as a live index; search latency with 0 deltas;
3. the extra 1% written in 10 rounds, each 1,000-document requests (each fsynced: acknowledged) plus deletes of
   0.01% of the base, then one refresh: 10 delta segments (latency measured after the first and the last);
   write throughput in documents/s, and single-document requests/s;
4. merge of the 10 deltas, then of everything (the merged index: same documents, one segment), search latency;
5. refresh latency as a server sees it (``LiveMaintenance`` at ``--refresh-interval``): a one-document write to the
   moment a search finds it.
Search latency: single queries, k = 10, the cpu backend on one thread, best of ``--passes`` passes (median and
mean), also a plain ``Searcher`` over the merged segment (the live path's own overhead), and the 1- and 10-delta
states searched with a backend call per segment (``per_segment``: the way before the one-call kernel).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from indexer.readers import iter_documents  # noqa: E402
from indexer.segments import LiveIndex, MergePolicy  # noqa: E402
from indexer.synth import write_corpus  # noqa: E402
from indexer.options import BuildOptions  # noqa: E402
from indexer.writer import build_index_from_documents  # noqa: E402
from ragserve.retrieval.live import LiveSearcher  # noqa: E402
from ragserve.retrieval.searcher import Searcher  # noqa: E402
from ragserve.server.documents import LiveMaintenance  # noqa: E402
from ragserve.topics import read_queries  # noqa: E402
from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402


class Pinned:
    """One snapshot of the live index, searched later (a ``LiveSearcher`` source that never changes)."""

    def __init__(self, live: LiveIndex) -> None:
        self.snap, self.path = live.snapshot(), live.path

    def snapshot(self):
        return self.snap

    def on_refresh(self, fn) -> None:
        pass


def latencies(searchers: dict, queries: list[str], passes: int) -> dict:
    """Per-query seconds of each searcher, the states interleaved pass by pass (the shared machine's load drifts
    over minutes); for each, the pass with the lowest median."""
    runs: dict[str, list] = {name: [] for name in searchers}
    for _ in range(passes):
        for name, s in searchers.items():
            t = []
            for q in queries:
                t0 = time.perf_counter()
                s.search(q, k=10, with_text=False)
                t.append(time.perf_counter() - t0)
            runs[name].append(sorted(t))
    out = {}
    for name, rs in runs.items():
        best = min(rs, key=statistics.median)
        out[name] = {"p50_ms": round(1e3 * statistics.median(best), 3), "mean_ms": round(1e3 * statistics.mean(best), 3),
                     "p90_ms": round(1e3 * best[int(0.9 * len(best))], 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000, help="passages in the base index (default 1M)")
    ap.add_argument("--queries", type=int, default=300, help="synthetic queries (default 300)")
    ap.add_argument("--passes", type=int, default=3, help="timed passes over the queries per state (default 3)")
    ap.add_argument("--rounds", type=int, default=10, help="delta segments the 1%% is written as (default 10)")
    ap.add_argument("--refresh-interval", type=float, default=1.0, help="server refresh interval (default 1.0 s)")
    ap.add_argument("--workdir", default="/tmp/ragserve-bench-live", help="corpus and indexes (default %(default)s)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    n, n_add = args.docs, args.docs // 100
    res: dict = {"benchmark": "live index", "docs": n, "added": n_add, "rounds": args.rounds,
                 "machine": f"{cpu_model()}, {os.cpu_count()} CPUs", "load_start": round(os.getloadavg()[0], 2),
                 "command": " ".join(sys.argv)}

    corpus, qfile = work / f"synth-{n + n_add}.jsonl", work / f"synth-{n + n_add}-queries.tsv"
    if not corpus.exists():
        write_corpus(corpus, n + n_add, seed=1, n_queries=args.queries, queries_path=qfile)
    queries = [q.text for q in read_queries(qfile)][:args.queries]
    docs = iter_documents([corpus])
    base = [next(docs) for _ in range(n)]
    extra = list(docs)

    # 1. rebuild
    idx = work / "live"
    shutil.rmtree(idx, ignore_errors=True)
    t0 = time.perf_counter()
    build_index_from_documents(base, idx, BuildOptions(progress=False))
    res["rebuild_s"] = round(time.perf_counter() - t0, 2)
    print(f"rebuild of {n:,} passages: {res['rebuild_s']} s", flush=True)

    # 2. the base, live
    t0 = time.perf_counter()
    live = LiveIndex(idx, policy=MergePolicy(max_segments=1000, max_deleted_fraction=1.0))  # merges by hand here
    res["open_s"] = round(time.perf_counter() - t0, 2)
    states = {"search_0_deltas": Pinned(live)}
    print(f"open {res['open_s']} s", flush=True)

    # 3. writes: the 1% in rounds, each its own delta segment, with deletes of base documents
    rng = random.Random(1)
    per = len(extra) // args.rounds
    write_s = refresh_s = 0.0
    refreshes = []
    for r in range(args.rounds):
        chunk = extra[r * per:(r + 1) * per]
        t0 = time.perf_counter()
        for i in range(0, len(chunk), 1000):
            live.add(chunk[i:i + 1000])
        live.delete([base[rng.randrange(n)].id for _ in range(max(1, n // 10_000))])
        t1 = time.perf_counter()
        live.refresh()
        t2 = time.perf_counter()
        write_s += t1 - t0
        refresh_s += t2 - t1
        refreshes.append(round(t2 - t1, 3))
        if r == 0:
            states["search_1_delta"] = Pinned(live)
    res["write"] = {"docs": per * args.rounds, "write_s": round(write_s, 2),
                    "docs_per_s": round(per * args.rounds / write_s), "refresh_s": refreshes,
                    "add_1pct_total_s": round(write_s + refresh_s, 2),
                    "fraction_of_rebuild": round((write_s + refresh_s) / res["rebuild_s"], 4)}
    t0 = time.perf_counter()
    singles = 200
    for i in range(singles):
        live.add([(f"single-{i}", "single", f"one document request {i}")])
    res["write"]["single_requests_per_s"] = round(singles / (time.perf_counter() - t0), 1)
    live.delete([f"single-{i}" for i in range(singles)])
    live.refresh()  # no segment for the singles: added and deleted before the refresh
    print(f"writes: {res['write']}", flush=True)
    states["search_10_deltas"] = Pinned(live)

    # 4. merges
    t0 = time.perf_counter()
    live.merge(1, len(live.snapshot().segments))
    res["merge_deltas_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    live.force_merge()
    res["merge_all_s"] = round(time.perf_counter() - t0, 2)
    states["search_merged"] = Pinned(live)
    searchers = {name: LiveSearcher(p, backend="cpu", threads=1) for name, p in states.items()}
    for name in ("search_1_delta", "search_10_deltas"):
        searchers[f"{name}_per_segment"] = LiveSearcher(states[name], backend="cpu", threads=1, per_segment=True)
    searchers["search_merged_plain_searcher"] = Searcher(live.snapshot().segments[0].reader, backend="cpu", threads=1)
    for s in searchers.values():  # open and warm every backend before timing
        s.search_batch(queries[:20], k=10, with_text=False)
    res.update(latencies(searchers, queries, args.passes))
    for name in ("search_1_delta", "search_10_deltas"):  # the one-call search ranks as the call per segment does
        ranked = [[[(h.id, float(h.score), h.docid) for h in hits]
                   for hits in searchers[n].search_batch(queries, k=100, with_text=False)]
                  for n in (name, f"{name}_per_segment")]
        res[name]["same_top100_as_per_segment"] = ranked[0] == ranked[1]
    for name, s in searchers.items():
        state = name.removesuffix("_per_segment")
        if state in states:
            snap = states[state].snap
            res[name].update(segments=len(snap.segments), deleted=sum(int(x.deleted.size) for x in snap.segments),
                             skipped=s.skipped)
        s.close()
    for k in ("search_0_deltas", "search_1_delta", "search_10_deltas", "search_1_delta_per_segment",
              "search_10_deltas_per_segment"):
        res[k]["p50_vs_merged"] = round(res[k]["p50_ms"] / res["search_merged"]["p50_ms"], 3)
        res[k]["mean_vs_merged"] = round(res[k]["mean_ms"] / res["search_merged"]["mean_ms"], 3)
    for name in searchers:
        print(f"{name}: {res[name]}", flush=True)
    print(f"merge deltas {res['merge_deltas_s']} s, all {res['merge_all_s']} s", flush=True)

    # 5. refresh latency, as the server's maintenance thread gives it
    s = LiveSearcher(live, backend="cpu", threads=1)
    m = LiveMaintenance(live, args.refresh_interval)
    m.start()
    lat = []
    for i in range(20):
        token = f"fresh{i}token"
        live.add([(f"fresh-{i}", "", f"{token} written now")])
        t0 = time.perf_counter()
        while not s.search(token, k=1, with_text=False):
            time.sleep(0.005)
        lat.append(time.perf_counter() - t0)
        time.sleep(rng.uniform(0, args.refresh_interval))  # writes arrive at any phase of the interval
    m.stop()
    s.close()
    lat.sort()
    res["refresh_latency"] = {"interval_s": args.refresh_interval, "p50_s": round(statistics.median(lat), 3),
                              "max_s": round(lat[-1], 3)}
    print(f"refresh latency: {res['refresh_latency']}", flush=True)
    live.close()
    res["load_end"] = round(os.getloadavg()[0], 2)
    res = stamp(res)  # the tree measured: commit, dirty, and its files' hash (a copy's .git can be stale)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, separators=(",", ":")) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
