"""One query at a time through each layer of the production path, side by side, on the same queries.

    python scripts/bench_search_paths.py --index IDX --queries QUERIES.tsv --backend gpu -k 10 --n 300 --out paths.json

For each query (text), in one process, interleaved so drift hits every path alike:
- ``backend``: the backend's own call on the analysed query (what ``bench_gpu.py`` times: the GPU's single-query
  CUDA graph);
- ``searcher``: ``Searcher.search(text, k, with_text=False)``, the production path of the CLI, the server and the
  RAG loops (analysis, the device queue, the backend, hit ids), with stage times asked for as they always are;
- ``searcher+text``: the same with the passages fetched (what ``/v1/search`` returns).
Prints p50 / p99 per path and each path's p50 minus the backend's; ``--out`` writes compact JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragserve.kernels.contract import StageTimes  # noqa: E402
from ragserve.retrieval.searcher import Searcher  # noqa: E402
from ragserve.topics import read_queries  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", required=True, help="any topics format ragserve.topics reads")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--n", type=int, default=300, help="queries timed (each through every path)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    s = Searcher(a.index, backend=a.backend)
    texts = [q.text for q in read_queries(a.queries)][:a.warmup + a.n]
    analysed = {t: s.analyze(t) for t in texts}
    paths = {  # the backend path is timed without the analysis (as bench_gpu.py times it); the others include it
        "backend": lambda t: s.backend.search_terms([analysed[t]], a.k, s.index.k1, s.index.b),
        "searcher": lambda t: s.search(t, a.k, with_text=False, times=StageTimes()),
        "searcher+text": lambda t: s.search(t, a.k, times=StageTimes()),
    }
    times: dict[str, list[float]] = {p: [] for p in paths}
    for i, t in enumerate(texts):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn(t)
            dt = time.perf_counter() - t0
            if i >= a.warmup:
                times[name].append(dt)
    t0 = time.perf_counter()
    for t in texts[a.warmup:]:
        s.analyze(t)
    analyse_us = (time.perf_counter() - t0) / max(1, len(texts) - a.warmup) * 1e6
    report = {"index": a.index, "backend": s.backend_name, "k": a.k, "n": len(times["backend"]),
              "host": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "analyse_mean_us": round(analyse_us, 1), "paths": {}}
    base = float(np.median(times["backend"])) * 1e6
    print(f"{'path':<15} {'p50 us':>9} {'p99 us':>9} {'p50 - backend':>14}")
    for name, v in times.items():
        p50, p99 = float(np.median(v)) * 1e6, float(np.percentile(v, 99)) * 1e6
        report["paths"][name] = {"p50_us": round(p50, 1), "p99_us": round(p99, 1), "over_backend_us": round(p50 - base, 1)}
        print(f"{name:<15} {p50:9.1f} {p99:9.1f} {p50 - base:14.1f}")
    print(f"analysis alone: {analyse_us:.1f} us a query (mean)")
    if a.out:
        a.out.write_text(json.dumps(report, separators=(",", ":")))
    s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
