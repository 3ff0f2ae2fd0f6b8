"""GPU backend benchmark: gpu vs cpu backend vs a naive torch scorer, against the postings-read floor.

    python scripts/bench_gpu.py --real arguana IDX TOPICS --real hotpot IDX TOPICS --json out.json
    python scripts/bench_gpu.py --synth dpr21m 21000000 --synth-topics nq=NQ_TOPICS msmarco=MSMARCO_TOPICS \
        --reference REF_IDX --workdir /tmp/synth --json out.json
(``scripts/gpu_bench_inputs.py`` builds the real indexes and the reference index.)

One run measures the card's memory rate once: a device-to-device copy (bytes read + written a second) and a
read-only sum (bytes read a second); the floor takes the higher, so it stays a lower bound. Then per corpus and
query set:
- the postings floor of each query: every posting of its terms read once, 4 B each (the packed u32 the device
  holds, ``indexer/FORMAT.md``), over that rate. This backend reads every such posting (its thresholds skip
  read-outs, never postings). Norms are left out (a document whose score bound cannot reach the top-k needs
  none), and so are accumulators and results (a kernel can keep them on chip);
- single-query latency (end to end: planning, kernels, top-k, results on the host) of the gpu backend, the cpu
  backend and a naive torch scorer (per term and shard: decode, gather norms, ``index_add_`` into a dense f64
  accumulator; then ``torch.topk``), per query class: all queries, the largest 10% by postings and the smallest
  10%, each as p50 and as the median of latency / postings floor; the smallest class's p50 is the per-query fixed
  cost (launches, planning, top-k and host work that do not grow with the postings);
- batched throughput (queries/s): the gpu backend in batches of ``--batch`` queries, the cpu backend with one
  thread per logical CPU (the CPU's model and count are recorded) over its (smaller) query sample, the naive
  scorer one query at a time;
- parity: the gpu backend's ids and score bits against the cpu backend's, on the cpu sample.
``--synth`` writes a synthetic index straight into the layout (``scripts/synth_layout.py``) and maps the real
topics onto its vocabulary by df rank first. Results go to ``--json`` (compact, with the per-query postings
and gpu latencies); a table is printed last.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from indexer.reader import IndexReader  # noqa: E402
from indexer import bm25  # noqa: E402
from ragserve.kernels.gpu.backend import SCORERS, GpuBackend  # noqa: E402
from ragserve.kernels.gpu.relevancy import M32  # noqa: E402
from ragserve.kernels.gpu.selection import METHODS as TOPK_METHODS  # noqa: E402
from ragserve.kernels.contract import StageTimes  # noqa: E402
from ragserve.retrieval.searcher import Searcher  # noqa: E402
from ragserve.topics import read_queries  # noqa: E402
from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402


def triton_version() -> str | None:
    try:
        return version("triton")
    except PackageNotFoundError:
        return None


T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


# Bytes a posting occupies on the device: one packed u32 (offset in block << tf_bits | tf).
POSTING_BYTES = 4
# Query classes by postings: the largest and the smallest tenth of the timed sample.
CLASS_SHARE = 0.1


def _median_seconds(op, device: torch.device, reps: int) -> float:
    op()  # warm-up
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            op()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            op()
            times.append(time.perf_counter() - t)
    return float(np.median(times))


def memory_rates(device: torch.device, nbytes: int = 4 << 30, reps: int = 10) -> tuple[float, float]:
    """(device-to-device copy, bytes read + written a second; read-only sum, bytes read a second), medians of
    ``reps``. On the CPU (a dry run) host memory, 256 MiB."""
    if device.type != "cuda":
        nbytes, reps = min(nbytes, 256 << 20), 3
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    y = torch.empty_like(x)
    copy = 2 * nbytes / _median_seconds(functools.partial(y.copy_, x), device, reps)
    read = nbytes / _median_seconds(x.sum, device, reps)
    del x, y
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return copy, read


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


def by_class(lat: np.ndarray, floor_s: np.ndarray, classes: dict[str, np.ndarray]) -> dict:
    """Per query class: queries, p50 latency (ms) and the median of latency / postings floor."""
    out = {}
    for name, sel in classes.items():
        sel = sel[:lat.size]
        out[name] = {"n": int(sel.sum()), "p50_ms": percentile(lat[sel] * 1e3, 50),
                     "xfloor_p50": percentile(lat[sel] / floor_s[:lat.size][sel], 50)}
    return out


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
    searcher = Searcher(reader, backend="gpu", device=str(device), max_batch=args.batch, scorer=args.scorer)
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
    out["postings_per_query"] = {"p10": percentile(postings, 10), "p50": percentile(postings, 50),
                                 "p90": percentile(postings, 90), "max": int(postings.max()) if postings.size else 0}
    out["postings"] = postings.tolist()  # per timed query, so other floors can be computed from this file
    floor_s = POSTING_BYTES * postings / bw
    none = np.zeros(postings.size, bool)
    classes = {"all": ~none,
               "large": postings >= np.percentile(postings, 100 * (1 - CLASS_SHARE)) if postings.size else none,
               "small": postings <= np.percentile(postings, 100 * CLASS_SHARE) if postings.size else none}

    res: dict = {}
    out["results"] = res
    for k in args.ks:
        r: dict = {"k": k, "floor_ms": {c: percentile(floor_s[sel] * 1e3, 50) for c, sel in classes.items()}}
        # gpu single
        g.search_terms(sample[:3], k, k1, b)  # warm-up (kernel compilation)
        lat = []
        for q in sample:
            t = time.perf_counter()
            g.search_terms([q], k, k1, b)
            lat.append(time.perf_counter() - t)
        lat = np.array(lat)
        cls = by_class(lat, floor_s, classes)
        large = classes["large"]
        r["gpu"] = {"p50_ms": percentile(lat * 1e3, 50), "p99_ms": percentile(lat * 1e3, 99), "mean_ms": lat.mean() * 1e3,
                    "min_ms": float(lat.min() * 1e3), "classes": cls, "fixed_ms": cls["small"]["p50_ms"],
                    "large_postings_GBps_p50": percentile(POSTING_BYTES * postings[large] / lat[large] / 1e9, 50),
                    "latency_us": np.round(lat * 1e6, 1).tolist()}
        nb = min(args.batch_n, len(analysed))
        g.search_terms(analysed[:args.batch], k, k1, b)
        t = time.perf_counter()
        gres = g.search_terms(analysed[:nb], k, k1, b)
        dt = time.perf_counter() - t
        r["gpu"]["batch_qps"] = nb / dt
        r["gpu"]["batch"] = args.batch
        log(f"{name} k={k} gpu: p50 {r['gpu']['p50_ms']:.3f} ms p99 {r['gpu']['p99_ms']:.3f} ms, "
            f"postings floor x{cls['all']['xfloor_p50']:.1f} (large x{cls['large']['xfloor_p50']:.1f}), "
            f"fixed cost {r['gpu']['fixed_ms'] * 1e3:.0f} us, "
            f"batch {r['gpu']['batch_qps']:.0f} q/s")
        # stage split: one batch, and single queries (the graph's own events where the device plans them)
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
        if g.scorer == "torch":  # the dense path's other top-k threshold method, for comparison
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
        r["naive"] = {"n": nn, "p50_ms": percentile(lat_n * 1e3, 50), "p99_ms": percentile(lat_n * 1e3, 99),
                      "mean_ms": lat_n.mean() * 1e3 if nn else float("nan"),
                      "classes": by_class(lat_n, floor_s, classes),
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
            r["cpu"] = {"n": nc, "n_single": int(lat_c.size), "threads": cpu.threads,
                        "p50_ms": percentile(lat_c * 1e3, 50), "p99_ms": percentile(lat_c * 1e3, 99),
                        "mean_ms": lat_c.mean() * 1e3, "classes": by_class(lat_c[:mc], floor_s, classes),
                        "batch_qps": nc / dtc}
            same = [x.same_as(y) for x, y in zip(gres, cres)]
            r["parity"] = {"compared": len(same), "mismatches": len(same) - sum(same)}
            r["speedup_batch_vs_cpu"] = r["gpu"]["batch_qps"] / r["cpu"]["batch_qps"]
            log(f"{name} k={k} cpu p50 {r['cpu']['p50_ms']:.3f} ms, {r['cpu']['batch_qps']:.1f} q/s on {nc}; "
                f"gpu/cpu batch x{r['speedup_batch_vs_cpu']:.1f}; parity mismatches {r['parity']['mismatches']}/{len(same)}")
        log(f"{name} k={k} naive p50 {r['naive']['p50_ms']:.3f} ms "
            f"(postings floor x{r['naive']['classes']['all']['xfloor_p50']:.0f})")
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
    """Per corpus and k: each engine's p50 and median x postings floor by query class, the gpu's fixed cost, and
    the batched q/s of the gpu and the cpu backend with the CPU named."""
    nan = float("nan")
    cpu = f"{report['cpu_model']}, {report['cpus']} logical CPUs"
    rows = [f"{report['card']}: copy {report['copy_GBps']:.0f} GB/s (read + write), read {report['read_GBps']:.0f} "
            f"GB/s; postings floor = {POSTING_BYTES} B a posting / {report['floor_GBps']:.0f} GB/s",
            f"host: {cpu}",
            f"{'corpus':<20}{'k':>6}{'engine':>7}{'class':>7}{'n':>5}{'floor us':>10}{'p50 us':>10}{'x floor':>9}"]
    for c in report["corpora"]:
        for k, r in c.get("results", {}).items():
            for e in ("gpu", "cpu", "naive"):
                for cname, x in r.get(e, {}).get("classes", {}).items():
                    rows.append(f"{c['corpus']:<20}{k:>6}{e:>7}{cname:>7}{x['n']:>5}"
                                f"{r['floor_ms'][cname] * 1e3:>10.1f}{x['p50_ms'] * 1e3:>10.1f}{x['xfloor_p50']:>9.1f}")
            gq = r.get("gpu", {})
            if gq:
                rows.append(f"{'':<20}{k:>6}  gpu fixed cost (p50 of the smallest {CLASS_SHARE:.0%}) "
                            f"{gq['fixed_ms'] * 1e3:.1f} us, fastest {gq['min_ms'] * 1e3:.1f} us; large queries read "
                            f"postings at {gq['large_postings_GBps_p50']:,.1f} GB/s")
                line = f"{'':<20}{k:>6}  batched: gpu {gq['batch_qps']:,.0f} q/s (batch {gq['batch']})"
                if "cpu" in r:
                    line += (f", cpu backend {r['cpu']['batch_qps']:,.0f} q/s ({r['cpu']['threads']} threads on {cpu}):"
                             f" gpu/cpu x{r['speedup_batch_vs_cpu']:.1f}; parity {r['parity']['mismatches']}/"
                             f"{r['parity']['compared']} mismatches")
                rows.append(line)
            if "naive" in r:
                rows.append(f"{'':<20}{k:>6}  naive scorer {r['naive'].get('batch_qps', nan):,.1f} q/s")
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
    ap.add_argument("--scorer", default="auto", choices=SCORERS,
                    help="the gpu backend's kernels: cuda (CUDA C), triton, torch (the dense path); auto: the first "
                         "that runs")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop starting new work after this many seconds")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    device = torch.device(args.device)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor()})"
    report = {"card": card, "torch": torch.__version__,
              "triton": triton_version(),
              "cpu_model": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "argv": sys.argv, "corpora": []}
    copy, read = memory_rates(device)
    bw = max(copy, read)  # the highest rate shown keeps the floor a lower bound
    report.update(copy_GBps=copy / 1e9, read_GBps=read / 1e9, floor_GBps=bw / 1e9)
    log(f"{report['card']}: device copy {copy / 1e9:.0f} GB/s (read + write), read {read / 1e9:.0f} GB/s; "
        f"host {report['cpu_model']}, {report['cpus']} logical CPUs")

    def save() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(stamp(report), separators=(",", ":"), default=float))

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
