#!/usr/bin/env python
"""Fan-out overhead of ragserve on Ray: the same index and queries, searched by one local ``Searcher`` and by a
``DistributedSearcher`` over R shard-group replicas (Ray actors) on the same machine.

Per replica count R (``--replicas``, default 1 2 4 8):
- single: each of ``--single`` queries alone (after ``--warmup`` untimed), k = ``--k``: p50 / p99 latency in ms
  from query text to ranked hits, local and distributed, and their difference (the fan-out overhead, which
  also includes any gain from scoring the groups in parallel); and ``round_trip``: the distributed latency less
  the slowest replica's own scoring time (what the head, Ray's calls and the merge add).
- batch: ``--batch-n`` queries in batches of ``--batch`` (one fan-out per batch): queries per second.

CPU mode (default): cpu backend, one search thread per replica and locally. GPU mode (``--backend gpu``): each
replica reserves ``1 / R`` of the GPU (``num_gpus``), so R replicas share one device, against one local gpu
backend. The ArguAna index is built first (small blocks and banks, so it has >= 8 shards) unless ``--index``
names one.

    .venv/bin/python scripts/bench_distributed.py --json benchmarks/raw/distributed/cpu_arguana.json
    python scripts/bench_distributed.py --backend gpu --replicas 4 --single 300 --batch-n 1000 \\
        --deadline-s 150 --json $OUT/gpu_arguana.json        # on the H200 machine
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.machine import cpu_model, gpu_name  # noqa: E402
from tools.provenance import stamp  # noqa: E402

ARGUANA = REPO.parent / "shared" / "data" / "beir-arguana"


def pct(xs: list[float], p: float) -> float:
    return round(float(np.percentile(np.asarray(xs), p)) * 1e3, 3)


def single_latencies(searcher, queries: list[str], k: int, warmup: int) -> tuple[list[float], list[float]]:
    """Seconds per query, and seconds of it outside the slowest scoring pass (``relevancy`` of StageTimes)."""
    from ragserve.kernels.contract import StageTimes

    for q in queries[:warmup]:
        searcher.search(q, k=k)
    total, outside = [], []
    for q in queries[warmup:]:
        t = StageTimes()
        t0 = time.perf_counter()
        searcher.search(q, k=k, times=t)
        dt = time.perf_counter() - t0
        total.append(dt)
        outside.append(dt - t.relevancy)
    return total, outside


def batch_qps(searcher, queries: list[str], k: int, batch: int) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch):
        searcher.search_batch(queries[i:i + batch], k=k, with_text=False)
    return round(len(queries) / (time.perf_counter() - t0), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", help="index directory (default: build ArguAna into --workdir)")
    ap.add_argument("--workdir", default="/tmp/bench_distributed")
    ap.add_argument("--corpus", default=str(ARGUANA / "corpus.jsonl.gz"), help="corpus the index is built from")
    ap.add_argument("--queries", default=str(ARGUANA / "queries.jsonl.gz"))
    ap.add_argument("--gpu-memory-gib", type=float, default=0,
                    help="gpu: device memory each backend may plan for (default: its own share of what is free)")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--single", type=int, default=200, help="timed single queries")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-n", type=int, default=640, help="queries in the batch measurement")
    ap.add_argument("--deadline-s", type=float, default=0, help="skip replica counts once this much time passed")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args()
    t_start = time.monotonic()

    from indexer.options import BuildOptions
    from indexer.writer import build_index
    from ragserve.retrieval.searcher import Searcher
    from ragserve.topics import read_queries

    index = Path(args.index) if args.index else Path(args.workdir) / "arguana-b512-bank640k"
    if not (index / "manifest.json").exists():
        build_index([args.corpus], index,
                    BuildOptions(block_size=1 << 9, bank_bytes=640 << 10, progress=False, overwrite=True))
    manifest = json.loads((index / "manifest.json").read_text())
    n_shards = manifest["layout"]["num_shards"]
    texts = [q.text for q in read_queries(args.queries)]
    single_q = (texts * 2)[:args.warmup + args.single]
    batch_q = (texts * 4)[:args.batch_n]

    # Replicas at the priority of the local searcher, importing this checkout (workers inherit the environment).
    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    import ray

    from ragserve.distributed.shards import DistributedSearcher, GroupOptions

    gpu = args.backend == "gpu"
    ray.init(num_cpus=max(args.replicas) + 1, num_gpus=1 if gpu else 0, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False, _node_ip_address="127.0.0.1")
    gpu_opts = {"memory_bytes": int(args.gpu_memory_gib * (1 << 30))} if args.gpu_memory_gib else {}
    local_opts = gpu_opts if gpu else {"threads": 1}
    local = Searcher(index, backend=args.backend, **local_opts)
    lt, lo = single_latencies(local, single_q, args.k, args.warmup)
    local_row = {"p50_ms": pct(lt, 50), "p99_ms": pct(lt, 99), "batch_qps": batch_qps(local, batch_q, args.k,
                                                                                       args.batch)}
    local.close()
    print(f"local {args.backend}: {local_row}", flush=True)
    rows = []
    for r in args.replicas:
        if r > n_shards:
            print(f"skipping {r} replicas: the index has {n_shards} shards", flush=True)
            continue
        if args.deadline_s and time.monotonic() - t_start > args.deadline_s:
            print(f"skipping {r} replicas: past the {args.deadline_s:g} s deadline", flush=True)
            continue
        opts = GroupOptions(backend=args.backend, num_cpus=1.0, num_gpus=(1.0 / r) if gpu else 0.0,
                            backend_options=gpu_opts if gpu else {"threads": 1})
        t0 = time.monotonic()
        ds = DistributedSearcher(index, ray="local", groups=r, options=opts, timeout_s=120)
        start_s = time.monotonic() - t0
        dt, do = single_latencies(ds, single_q, args.k, args.warmup)
        row = {"replicas": r, "groups": ds.plan, "start_s": round(start_s, 1), "p50_ms": pct(dt, 50),
               "p99_ms": pct(dt, 99), "overhead_p50_ms": round(pct(dt, 50) - local_row["p50_ms"], 3),
               "overhead_p99_ms": round(pct(dt, 99) - local_row["p99_ms"], 3),
               "round_trip_p50_ms": pct(do, 50), "round_trip_p99_ms": pct(do, 99),
               "batch_qps": batch_qps(ds, batch_q, args.k, args.batch)}
        ds.close()
        rows.append(row)
        print(json.dumps(row), flush=True)
    ray.shutdown()
    report = {
        "benchmark": "scripts/bench_distributed.py", "backend": args.backend, "k": args.k,
        "index": {"path": str(index), "num_docs": manifest["stats"]["num_docs"], "num_shards": n_shards,
                  "block_size": manifest["layout"]["block_size"], "bank_bytes": manifest["layout"]["bank_bytes"]},
        "queries": args.queries, "single": args.single, "warmup": args.warmup, "batch": args.batch,
        "batch_n": len(batch_q), "local": local_row, "distributed": rows,
        "machine": {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "gpu": gpu_name(),
                    "python": platform.python_version(), "ray": ray.__version__},
        "seconds": round(time.monotonic() - t_start, 1),
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(stamp(report), separators=(",", ":")) + "\n")
    print(json.dumps({k: report[k] for k in ("local", "seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
