"""GPU backend benchmark: gpu vs cpu backend vs a naive torch scorer, against the memory-bandwidth floor.

    python scripts/bench_gpu.py --real arguana IDX TOPICS --real hotpot IDX TOPICS --json out.json
    python scripts/bench_gpu.py --synth dpr21m 21000000 --synth-topics nq=NQ_TOPICS msmarco=MSMARCO_TOPICS \
        --reference REF_IDX --workdir /tmp/synth --json out.json
(``scripts/gpu_bench_inputs.py`` builds the real indexes and the reference index.)

One run measures the device copy bandwidth once (a device-to-device copy, bytes read + written), then per
corpus and query set:
- the bytes each query must move at least: its postings (4 B each), the norm gathered per posting (1 B),
  the f64 accumulator read-modify-write per posting (16 B), one read of each matched document's score for the
  top-k (8 B) and the result (12 B a hit); its floor is those bytes over the copy bandwidth;
- single-query latency (p50/p99, end to end: planning, kernels, top-k, results on the host) of the gpu backend,
  the cpu backend and a naive torch scorer (per term and shard: decode, gather norms, ``index_add_`` into a
  dense f64 accumulator; then ``torch.topk``), and latency / floor;
- batched throughput (queries/s): the gpu backend in batches of ``--batch`` queries, the cpu backend with one
  thread per core over its (smaller) query sample, the naive scorer one query at a time;
- parity: the gpu backend's ids and score bits against the cpu backend's, on the cpu sample.
``--synth`` writes a synthetic index straight into the layout (``scripts/synth_layout.py``) and maps the real
topics onto its vocabulary by df rank first. Results go to ``--json``; a table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from indexer.reader import IndexReader  # noqa: E402
from indexer import bm25  # noqa: E402
from ragserve.kernels.gpu import tiles as gpu_tiles  # noqa: E402
from ragserve.kernels.gpu.backend import GpuBackend  # noqa: E402
from ragserve.kernels.gpu.dense import M32  # noqa: E402
from ragserve.kernels.gpu.selection import METHODS as TOPK_METHODS  # noqa: E402
from ragserve.kernels.contract import StageTimes  # noqa: E402
from ragserve.retrieval.searcher import Searcher  # noqa: E402
from ragserve.topics import read_queries  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def copy_bandwidth(device: torch.device, nbytes: int = 4 << 30, reps: int = 10) -> float:
    """Device-to-device copy rate, bytes read + written per second (median of ``reps``)."""
    cuda = device.type == "cuda"
    if not cuda:
        nbytes, reps = min(nbytes, 256 << 20), 3  # a dry run on the CPU: host memcpy
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            y.copy_(x)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            y.copy_(x)
            times.append(time.perf_counter() - t)
    del x, y
    if cuda:
        torch.cuda.empty_cache()
    return 2 * nbytes / float(np.median(times))


class NaiveScorer:
    """Per term (ascending) and shard: decode, gather norms, ``index_add_`` into a dense f64 row; ``torch.topk``."""

    def __init__(self, g: GpuBackend) -> None:
        self.a = g.device_arrays()
        self.g = g
        self.acc = torch.zeros(g.num_docs, dtype=torch.float64, device=g.device)

    def search(self, q, k: int, cache: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        a, g = self.a, self.g
        it = a["planner"].items([q])
        order = np.lexsort((it.shard, it.slot))
        for i in order.tolist():
            e = torch.arange(int(a["entry_base"][it.shard[i]] + it.e0[i]),
                             int(a["entry_base"][it.shard[i]] + it.e0[i] + it.ne[i] + 1), device=g.device)
            st = a["blk_start"][e].long() & M32
            blk = torch.repeat_interleave(a["blk_id"][e[:-1]].long(), st[1:] - st[:-1])
            p0 = int(a["posting_base"][it.shard[i]] + it.a[i])
            p = a["postings"][p0:p0 + int(it.n[i])].long() & M32
            doc = (blk << g.block_shift) + (p >> g.tf_bits)
            tf = (p & ((1 << g.tf_bits) - 1)).to(torch.float32)
            w = float(it.w[i])
            s = w - w / (1 + tf * cache[a["norms"][doc].long()])
            self.acc.index_add_(0, doc, s.to(torch.float64))
        vals, idx = torch.topk(self.acc.to(torch.float32), k)
        self.acc.zero_()
        return idx.cpu().numpy(), vals.cpu().numpy()


def percentile(x, p: float) -> float:
    return float(np.percentile(np.asarray(x, dtype=np.float64), p)) if len(x) else float("nan")


def bench_corpus(name: str, index_dir: Path, topics: Path, args, bw: float, device: torch.device, out: dict,
                 save) -> None:
    """Fill ``out`` (already in the report) with this corpus' measurements, saving after each k."""
    out.update({"corpus": name, "index": str(index_dir), "topics": str(topics)})
    reader = IndexReader(index_dir)
    m = reader.manifest
    out["stats"] = {k: m["stats"][k] for k in ("num_docs", "num_postings", "vocab_size")}
    out["shards"] = len(m["shards"])
    k1, b = reader.k1, reader.b
    t = time.time()
    searcher = Searcher(reader, backend="gpu", device=str(device), max_batch=args.batch, kernel=args.kernel)
    g: GpuBackend = searcher.backend
    out["gpu_load_s"] = round(time.time() - t, 2)
    out["gpu_describe"] = g.describe()
    log(f"gpu backend loaded in {out['gpu_load_s']}s: {g.describe()}")
    try:  # the cpu backend needs numba; keep the gpu numbers if it cannot load
        from ragserve.kernels.cpu.backend import CpuBackend

        cpu = CpuBackend(reader, threads=os.cpu_count())
    except Exception as e:
        cpu = None
        out["cpu_error"] = f"{type(e).__name__}: {e}"
        log(f"cpu backend unavailable: {out['cpu_error']}")
    texts = [q.text for q in read_queries(topics)]
    analysed = [a for a in (searcher.analyze(t) for t in texts) if len(a)]
    out["queries"] = len(analysed)
    log(f"{name}: {m['stats']['num_docs']:,} docs, {m['stats']['num_postings']:,} postings, {len(analysed)} queries")
    planner = g.device_arrays()["planner"]
    n_single = min(args.single, len(analysed))
    sample = analysed[:n_single]
    postings = np.array([planner.items([q]).postings for q in sample], dtype=np.int64)
    matched = g.matched_counts(sample, k1, b)
    out["postings_per_query"] = {"p50": percentile(postings, 50), "p90": percentile(postings, 90),
                                 "max": int(postings.max()) if postings.size else 0}
    out["matched_per_query_p50"] = percentile(matched, 50)
    large = postings >= np.percentile(postings, 90) if postings.size else np.zeros(0, bool)

    def floor_bytes(k: int) -> np.ndarray:
        return 21 * postings + 8 * matched + 12 * np.minimum(k, matched)

    res: dict = {}
    out["results"] = res
    for k in args.ks:
        fb = floor_bytes(k)
        r: dict = {"k": k, "floor_ms_p50": percentile(fb / bw * 1e3, 50)}
        # gpu single
        g.search_terms(sample[:3], k, k1, b)  # warm-up (kernel compilation)
        lat = []
        for q in sample:
            t = time.perf_counter()
            g.search_terms([q], k, k1, b)
            lat.append(time.perf_counter() - t)
        lat = np.array(lat)
        ratio = lat / (fb / bw)
        r["gpu"] = {"p50_ms": percentile(lat * 1e3, 50), "p99_ms": percentile(lat * 1e3, 99), "mean_ms": lat.mean() * 1e3,
                    "floor_ratio_p50": percentile(ratio, 50), "floor_ratio_large_p50": percentile(ratio[large], 50),
                    "large_achieved_GBps_p50": percentile(fb[large] / lat[large] / 1e9, 50)}
        nb = min(args.batch_n, len(analysed))
        g.search_terms(analysed[:args.batch], k, k1, b)
        t = time.perf_counter()
        gres = g.search_terms(analysed[:nb], k, k1, b)
        dt = time.perf_counter() - t
        r["gpu"]["batch_qps"] = nb / dt
        r["gpu"]["batch"] = args.batch
        log(f"{name} k={k} gpu: p50 {r['gpu']['p50_ms']:.3f} ms p99 {r['gpu']['p99_ms']:.3f} ms, "
            f"floor x{r['gpu']['floor_ratio_p50']:.2f} (large x{r['gpu']['floor_ratio_large_p50']:.2f}), "
            f"batch {r['gpu']['batch_qps']:.0f} q/s")
        # stage split: one batch, and single queries (synchronised between the stages)
        kt = StageTimes()
        g.search_terms(analysed[:args.batch], k, k1, b, kt)
        bp = planner.items(analysed[:args.batch]).postings
        r["gpu"]["batch_stage_s"] = {"scoring": kt.relevancy, "topk": kt.retrieval, "postings": bp,
                                     "scoring_Gpostings_per_s": bp / kt.relevancy / 1e9 if kt.relevancy else None}
        kt = StageTimes()
        for q in sample[:100]:
            g.search_terms([q], k, k1, b, kt)
        r["gpu"]["single_stage_ms_mean"] = {"scoring": kt.relevancy * 1e3 / len(sample[:100]),
                                            "topk": kt.retrieval * 1e3 / len(sample[:100])}
        log(f"{name} k={k} gpu stages {r['gpu']['single_stage_ms_mean']}, batch {r['gpu']['batch_stage_s']}")
        if g.kernel == "torch":  # the dense path's other top-k threshold method, for comparison
            default_topk = g.topk
            g.topk = next(m for m in TOPK_METHODS if m != default_topk)
            lat_t = []
            for q in sample[:200]:
                t = time.perf_counter()
                g.search_terms([q], k, k1, b)
                lat_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            g.search_terms(analysed[:nb], k, k1, b)
            r["gpu_alt_topk"] = {"topk": g.topk, "p50_ms": percentile(np.array(lat_t) * 1e3, 50),
                                 "batch_qps": nb / (time.perf_counter() - t)}
            g.topk = default_topk
            log(f"{name} k={k} with topk={r['gpu_alt_topk']['topk']}: p50 {r['gpu_alt_topk']['p50_ms']:.3f} ms, "
                f"batch {r['gpu_alt_topk']['batch_qps']:.0f} q/s")
        # naive
        naive = NaiveScorer(g)
        cache = torch.from_numpy(bm25.norm_cache(k1, b, reader.avgdl)).to(device)
        nn = min(args.naive_n, n_single)
        naive.search(sample[0], k, cache)
        lat_n = []
        for q in sample[:nn]:
            t = time.perf_counter()
            naive.search(q, k, cache)
            lat_n.append(time.perf_counter() - t)
        lat_n = np.array(lat_n)
        ratio_n = lat_n / (fb[:nn] / bw)
        r["naive"] = {"n": nn, "p50_ms": percentile(lat_n * 1e3, 50), "p99_ms": percentile(lat_n * 1e3, 99),
                      "mean_ms": lat_n.mean() * 1e3 if nn else float("nan"),
                      "floor_ratio_p50": percentile(ratio_n, 50),
                      "floor_ratio_large_p50": percentile(ratio_n[large[:nn]], 50),
                      "batch_qps": nn / lat_n.sum() if nn else float("nan")}
        del naive
        # cpu
        if cpu is not None:
            nc = min(args.cpu_n, len(analysed))
            cpu.search_terms([analysed[0]], k, k1, b)
            lat_c = []
            for q in analysed[:min(nc, args.cpu_single_n or nc)]:
                t = time.perf_counter()
                cpu.search_terms([q], k, k1, b)
                lat_c.append(time.perf_counter() - t)
            lat_c = np.array(lat_c)
            t = time.perf_counter()
            cres = cpu.search_terms(analysed[:nc], k, k1, b)
            dtc = time.perf_counter() - t
            mc = min(lat_c.size, n_single)
            ratio_c = lat_c[:mc] / (fb[:mc] / bw)
            r["cpu"] = {"n": nc, "n_single": int(lat_c.size), "threads": cpu.threads,
                        "p50_ms": percentile(lat_c * 1e3, 50), "p99_ms": percentile(lat_c * 1e3, 99),
                        "mean_ms": lat_c.mean() * 1e3, "floor_ratio_p50": percentile(ratio_c, 50),
                        "batch_qps": nc / dtc}
            same = [x.same_as(y) for x, y in zip(gres, cres)]
            r["parity"] = {"compared": len(same), "mismatches": len(same) - sum(same)}
            r["speedup_batch_vs_cpu"] = r["gpu"]["batch_qps"] / r["cpu"]["batch_qps"]
            log(f"{name} k={k} cpu p50 {r['cpu']['p50_ms']:.3f} ms, {r['cpu']['batch_qps']:.1f} q/s on {nc}; "
                f"gpu/cpu batch x{r['speedup_batch_vs_cpu']:.1f}; parity mismatches {r['parity']['mismatches']}/{len(same)}")
        log(f"{name} k={k} naive p50 {r['naive']['p50_ms']:.3f} ms (floor x{r['naive']['floor_ratio_p50']:.1f})")
        res[str(k)] = r
        save()
        if time.time() - T0 > args.deadline_s:
            log("deadline reached: skipping the remaining k values")
            break
    searcher.close()
    del g, searcher
    if device.type == "cuda":
        torch.cuda.empty_cache()


def table(report: dict) -> str:
    rows = [f"copy bandwidth {report['copy_GBps']:.0f} GB/s ({report['card']})",
            f"{'corpus':<24}{'k':>6}{'engine':>8}{'p50 ms':>10}{'p99 ms':>10}{'xfloor':>8}{'xfl.lg':>8}{'q/s':>10}"]
    for c in report["corpora"]:
        for k, r in c.get("results", {}).items():
            for e in ("gpu", "naive", "cpu"):
                if e not in r:
                    continue
                x = r[e]
                rows.append(f"{c['corpus']:<24}{k:>6}{e:>8}{x['p50_ms']:>10.3f}{x['p99_ms']:>10.3f}"
                            f"{x.get('floor_ratio_p50', float('nan')):>8.2f}{x.get('floor_ratio_large_p50', float('nan')):>8.2f}"
                            f"{x['batch_qps']:>10.1f}")
            if "parity" in r:
                rows.append(f"{'':<24}{'':>6}  parity {r['parity']['mismatches']}/{r['parity']['compared']} mismatches, "
                            f"gpu/cpu batch x{r['speedup_batch_vs_cpu']:.1f}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", nargs=3, action="append", default=[], metavar=("NAME", "INDEX", "TOPICS"))
    ap.add_argument("--synth", nargs=2, action="append", default=[], metavar=("NAME", "DOCS"))
    ap.add_argument("--synth-topics", nargs="*", default=[], metavar="NAME=FILE",
                    help="real topics to map onto each synthetic index")
    ap.add_argument("--reference", type=Path, help="index of real text for mapping queries onto synthetic terms")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_gpu"))
    ap.add_argument("--map-limit", type=int, default=2000, help="real queries mapped per topics file")
    ap.add_argument("--ks", type=int, nargs="+", default=[10, 1000])
    ap.add_argument("--single", type=int, default=500, help="queries timed one at a time (gpu)")
    ap.add_argument("--batch", type=int, default=64, help="queries per gpu batch")
    ap.add_argument("--batch-n", type=int, default=2000, help="queries in the gpu throughput run")
    ap.add_argument("--cpu-n", type=int, default=200, help="queries for the cpu backend (latency, throughput, parity)")
    ap.add_argument("--cpu-single-n", type=int, default=0,
                    help="of those, how many are timed one at a time (default: all)")
    ap.add_argument("--naive-n", type=int, default=100)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernel", default="auto", choices=("auto", "triton", "torch"))
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop starting new work after this many seconds")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    device = torch.device(args.device)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor()})"
    report = {"card": card, "torch": torch.__version__,
              "triton": getattr(gpu_tiles.triton, "__version__", None),
              "cpus": os.cpu_count(), "python": platform.python_version(), "argv": sys.argv, "corpora": []}
    bw = copy_bandwidth(device)
    report["copy_GBps"] = bw / 1e9
    log(f"{report['card']}: device copy {bw / 1e9:.0f} GB/s (read + write)")

    def save() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=float))

    jobs = [(n, Path(i), Path(t)) for n, i, t in args.real]
    for name, docs in args.synth:
        from synth_layout import map_queries, write_layout

        idx = args.workdir / name
        if not idx.exists():
            t = time.time()
            write_layout(idx, int(docs), log=log)
            report.setdefault("synth_write_s", {})[name] = round(time.time() - t, 1)
        for spec in args.synth_topics:
            qname, _, topics = spec.partition("=")
            qfile = args.workdir / f"{name}.{qname}.tsv"
            t = time.time()
            rows = map_queries(idx, args.reference, Path(topics), args.map_limit)
            qfile.write_text("".join(f"{q}\t{text}\n" for q, text in rows))
            log(f"{len(rows)} {qname} queries mapped onto {name} in {time.time() - t:.1f}s")
            jobs.append((f"{name}/{qname}", idx, qfile))
    for name, idx, topics in jobs:
        if time.time() - T0 > args.deadline_s:
            log(f"deadline reached: {name} not run")
            report["corpora"].append({"corpus": name, "skipped": "deadline"})
            continue
        entry: dict = {"corpus": name}
        report["corpora"].append(entry)
        try:
            bench_corpus(name, idx, topics, args, bw, device, entry, save)
        except Exception as e:  # keep the other corpora's numbers
            log(f"{name} FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
            entry["error"] = f"{type(e).__name__}: {e}"
        save()
    save()
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
