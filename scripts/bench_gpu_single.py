"""Latency of the largest queries on the gpu backend, one at a time or in small batches, for variants of the CUDA
scorer's sample of units, interleaved query by query in rotating order (host and clock drift, and the cache a query
leaves, hit every variant alike).

    python scripts/bench_gpu_single.py --synth dpr21m 21000000 --synth-topics nq=NQ_TOPICS msmarco=MSMARCO_TOPICS \
        --reference REF_IDX --workdir /tmp/synth --rows 1 2 4 8 --json out.json
    git worktree add /tmp/old COMMIT
    python scripts/bench_gpu_single.py --code /tmp/old --variants default --batch-qps ... --json old.json

"Largest": the 10% of the first ``--queries`` mapped queries with the most postings (``bench_gpu.py``'s "large");
a batch of r queries takes r consecutive ones. Variants (``GpuSettings`` fields changed from the defaults, a backend
each): ``default``, ``sample`` (``sample_min_units`` 0: sampled wherever ``sample_step`` allows), ``no-sample``
(never), ``no-running`` (the CUDA scorer without its running threshold). ``--code`` imports the backend from another
checkout (to compare commits on one machine, one process after the other; one with ``GpuSettings``). ``--batch-qps``
adds the throughput of all the queries in batches of 64 (best of 3). The synthetic index and the query mapping are
``bench_gpu.py``'s (``scripts/synth_layout.py``).
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.provenance import stamp  # noqa: E402

# the GpuSettings fields of each variant (the rest the checkout's defaults)
VARIANTS = {"default": {}, "sample": {"sample_min_units": 0}, "no-sample": {"sample_min_units": 1 << 62},
            "no-running": {"running_threshold": False}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synth", nargs=2, metavar=("NAME", "DOCS"), required=True)
    ap.add_argument("--synth-topics", nargs="+", required=True, metavar="NAME=FILE")
    ap.add_argument("--reference", type=Path, required=True, help="index of real text the queries are mapped from")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/synth"))
    ap.add_argument("--queries", type=int, default=300, help="mapped queries the largest 10%% are taken from")
    ap.add_argument("--rows", type=int, nargs="+", default=[1], help="queries a search")
    ap.add_argument("--ks", type=int, nargs="+", default=[10, 1000])
    ap.add_argument("--variants", nargs="+", default=["sample", "no-sample"], choices=list(VARIANTS))
    ap.add_argument("--reps", type=int, default=2, help="timed passes over the largest queries (after one warm-up)")
    ap.add_argument("--batch-qps", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (Triton's interpreter)")
    ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to import from")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(args.code.resolve()))

    import numpy as np
    import torch

    from indexer.reader import IndexReader
    from ragserve.kernels.gpu.backend import GpuBackend
    from ragserve.kernels.gpu.settings import GpuSettings
    from ragserve.retrieval.searcher import Searcher
    from synth_layout import map_queries, write_layout

    name, docs = args.synth[0], int(args.synth[1])
    idx = args.workdir / name
    if not idx.exists():
        write_layout(idx, docs)
    reader = IndexReader(idx)
    analyzer = Searcher(reader, backend="cpu", threads=1)
    names = {a for v in args.variants for a in VARIANTS[v]}
    if missing := sorted(a for a in names if not hasattr(GpuSettings(), a)):
        raise SystemExit(f"{args.code} has no {', '.join(missing)}: those variants cannot run there")
    # A backend for each variant, with its settings: the CUDA C scorer (Triton's interpreter on the CPU). A checkout
    # before the option was named for what runs takes kernel="triton" for both.
    scorer = "cuda" if torch.device(args.device).type == "cuda" else "triton"
    path = ({"scorer": scorer} if "scorer" in inspect.signature(GpuBackend).parameters else {"kernel": "triton"})
    backends = {v: GpuBackend(reader, device=args.device, max_batch=64, settings=GpuSettings(**VARIANTS[v]), **path)
                for v in args.variants}
    g = backends[args.variants[0]]
    planner = g.device_arrays()["planner"]
    k1, b = reader.k1, reader.b

    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report: dict = {"argv": sys.argv, "card": card, "code": str(args.code), "results": {}}
    for spec in args.synth_topics:
        qname, _, topics = spec.partition("=")
        rows = map_queries(idx, args.reference, Path(topics), 2 * args.queries)
        qs = [q for q in (analyzer.analyze(t) for _, t in rows) if len(q)][:args.queries]
        postings = np.array([planner.items([q]).postings for q in qs])
        large = [q for q, p in zip(qs, postings) if p >= np.percentile(postings, 90)]
        for k in args.ks:
            res: dict = {}
            if args.batch_qps:
                g.search_terms(qs[:64], k, k1, b)
                best = min(_timed(g.search_terms, qs, k, k1, b) for _ in range(3))
                res["batch q/s"] = round(len(qs) / best)
            for r in args.rows:
                batches = [[large[(i + j) % len(large)] for j in range(r)] for i in range(len(large))]
                lat: dict = {v: [] for v in args.variants}
                for rep in range(args.reps + 1):
                    for i, batch in enumerate(batches):
                        # Rotated: each variant comes first as often (the first meets the batch's postings outside
                        # L2: 7% slower at 100M with identical settings).
                        for v in args.variants[i % len(args.variants):] + args.variants[:i % len(args.variants)]:
                            dt = _timed(backends[v].search_terms, batch, k, k1, b)
                            if rep:  # the first pass warms up
                                lat[v].append(dt)
                res[f"rows={r} p50 ms"] = {v: round(1e3 * float(np.median(x)), 4) for v, x in lat.items()}
            report["results"][f"{name}/{qname} k={k}"] = res
            print(f"{name}/{qname} k={k} {json.dumps(res)}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(stamp(report), indent=1))
    return 0


def _timed(search, queries, k: int, k1: float, b: float) -> float:
    t = time.perf_counter()
    search(queries, k, k1, b)
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
