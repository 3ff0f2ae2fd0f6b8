"""One sparse-attention decode step on a CUDA GPU, every method beside dense SDPA (CUDA events; written for an H200).

    python scripts/bench_attention.py [--quick] [--time-limit S] [--out benchmarks/attention_h200.json]

The whole run (32K, 128K and 1M; batch 1 and 8; both paths) fits one 10-minute call on the H200: no run starts
after --time-limit seconds (default 540), and the JSON is rewritten after every measurement, so a crash or the
limit keeps what ran. Every input comes from the script's own generator, a case's cache before any of its captures,
never from torch's default CUDA generator (a capture that fails leaves that one unusable: "Offset increment outside
graph capture", which ended the first H200 run); the torch path, whose top-k syncs with the host, is not captured.

Shapes: batch 1 and 8, 32 query heads, 8 KV heads, head dim 128, bf16, at 32K, 128K and 1M cached tokens (--quick:
32K and 128K, batch 1). Methods, each through the fused Triton path (``triton``) and the plain torch path
(``torch``): dsa (DeepSeek-V3.2's indexer shape: 64 index heads x 128, one bf16 index key per token shared by the
KV groups, top-2048), quest and lserve (pages of 16), seer-topk (blocks of 64), all with a 2048-token budget per KV
group (sink 16, local 64). For each: stage times (relevancy, retrieval, apply; the index is prepared once,
untimed, and the one-token update a decode step makes is timed apart), the step eager and replayed from a CUDA
graph, the share of the step in relevancy + retrieval, and the step against its bytes-read floor (index keys or page
bounds scanned plus the selected K and V) at the copy bandwidth measured first. The selection alone runs first: our
bucket and radix selects of 2048 from 1M scores against ``torch.topk``. Each measurement is caught and reported on
its own: the run goes on. FlashInfer's top-k is timed beside ours when ``flashinfer`` imports. ``--block-n``,
``--num-warps``, ``--chunk``, ``--programs`` and ``--select`` sweep the Triton path's settings (one run per
combination).

``--device cpu`` (with TRITON_INTERPRET=1) runs the same code on tiny shapes to check the script itself; its
times mean nothing.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ragserve.attention import get_method
from ragserve.attention.common import Index
from ragserve.kernels.gpu.attention import TORCH, TritonOps
from ragserve.kernels.gpu.triton.attention import DEFAULT, TritonAttentionSettings
from ragserve.kernels.gpu.triton.selection import bucket_topk, radix_topk

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.provenance import stamp  # noqa: E402

Q_HEADS, KV_HEADS, DIM = 32, 8, 128
INDEX_HEADS, INDEX_DIM = 64, 128
BUDGET, SINK, LOCAL = 2048, 16, 64
METHODS = ("dsa", "quest", "lserve", "seer-topk")
DEV = "cuda"  # --device


def cuda_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` by CUDA events (by the CPU clock with --device cpu)."""
    for _ in range(warmup if DEV == "cuda" else 1):
        fn()
    times = []
    for _ in range(reps):
        if DEV != "cuda":
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def graph_ms(fn, reps: int) -> float:
    """Median milliseconds of ``fn`` replayed from a CUDA graph (no Python, no launch gaps)."""
    if DEV != "cuda":
        raise RuntimeError("CUDA graphs need --device cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return cuda_ms(g.replay, reps)


def copy_bandwidth(reps: int) -> float:
    """Bytes moved per second (read + write) by a 2 GiB device-to-device copy."""
    size = 1 << 31 if DEV == "cuda" else 1 << 26
    src = torch.empty(size, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    ms = cuda_ms(lambda: dst.copy_(src), reps)
    del src, dst
    return 2 * size / (ms * 1e-3)


class SharedIndexer:
    """DSA's indexer with one bf16 index key per token shared by every KV group (DeepSeek's MLA design) and fixed
    random index queries and weights: the cost of the V3.2 indexer without its trained projections."""

    def __init__(self, batch: int, n: int, gen: torch.Generator) -> None:
        self.keys = torch.randn((batch, 1, n, INDEX_DIM), generator=gen, device=DEV, dtype=torch.bfloat16)
        self.q = torch.randn((batch, 1, INDEX_HEADS, INDEX_DIM), generator=gen, device=DEV, dtype=torch.bfloat16)
        self.w = torch.rand((batch, 1, INDEX_HEADS), generator=gen, device=DEV)

    def index_keys(self, ops, keys):
        return self.keys[..., -keys.shape[-2]:, :]

    def index_queries(self, ops, q, groups: int):
        return self.q, self.w


def floor_bytes(method: str, batch: int, n: int) -> float:
    """Bytes a step must read: what relevancy scans, plus the selected tokens' K and V (bf16)."""
    kv_row = KV_HEADS * DIM * 2
    selected = batch * min(BUDGET, n) * kv_row * 2
    if method == "dense":
        return batch * n * kv_row * 2
    if method == "dsa":
        return batch * n * INDEX_DIM * 2 + selected
    if method == "quest":
        return batch * 2 * math.ceil(n / 16) * kv_row + selected
    if method == "lserve":
        return batch * n * kv_row + selected
    if method == "seer-topk":
        return batch * math.ceil(n / 64) * kv_row + selected
    raise ValueError(method)


def bench_method(name: str, path: str, q, keys, values, batch: int, n: int, reps: int, bw: float,
                 gen: torch.Generator, settings: TritonAttentionSettings = DEFAULT) -> dict:
    ops = TritonOps(settings) if path == "triton" else TORCH
    opts = dict(budget=BUDGET, sink=SINK, local=LOCAL, ops=ops)
    m = get_method(name, **opts)
    if name == "dsa":
        m.indexer = SharedIndexer(batch, n, gen)
    scale = DIM ** -0.5
    index = m.prepare(keys)
    rel = m.relevancy(index, q, keys)
    sel = m.retrieval(rel, n)
    out = {"method": name, "path": path, "batch": batch, "context": n,
           "selected_per_group": float(sel.counts().float().mean())}
    if path == "triton":
        out["settings"] = asdict(settings)
    out["relevancy_ms"] = cuda_ms(lambda: m.relevancy(index, q, keys), reps)
    out["retrieval_ms"] = cuda_ms(lambda: m.retrieval(rel, n), reps)
    out["apply_ms"] = cuda_ms(lambda: m.apply(q, keys, values, sel, scale), reps)

    def step():
        r = m.relevancy(index, q, keys)
        return m.apply(q, keys, values, m.retrieval(r, n), scale)

    out["step_ms"] = cuda_ms(step, reps)
    if path == "torch":  # its exact top-k syncs with the host (nonzero): a capture would fail, and a failed
        out["step_graph_ms"] = None  # capture can leave the CUDA context's generator unusable
        out["graph_error"] = "not captured: the torch path syncs with the host (nonzero)"
    else:
        try:
            out["step_graph_ms"] = graph_ms(step, reps)
        except Exception as e:
            out["step_graph_ms"] = None
            out["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    best = min(t for t in (out["step_ms"], out["step_graph_ms"]) if t is not None)
    stages = out["relevancy_ms"] + out["retrieval_ms"] + out["apply_ms"]
    out["memory_share"] = (out["relevancy_ms"] + out["retrieval_ms"]) / stages
    out["floor_bytes"] = floor_bytes(name, batch, n)
    out["floor_ms"] = out["floor_bytes"] / bw * 1e3
    out["x_floor"] = best / out["floor_ms"]
    # a decode step's index update: one more token (prepare of the last unit, in place)
    prev = Index(n - 1, {k: v[..., :m.num_units(n - 1), :] for k, v in index.arrays.items()},
                 {k: v for k, v in index.arrays.items()})
    if name != "dsa":
        out["prepare_one_token_ms"] = cuda_ms(lambda: m.prepare(keys, prev), reps)
    return out


def bench_dense(q, keys, values, batch: int, n: int, reps: int, bw: float) -> dict:
    q4 = q[:, :, None, :]

    def step():
        return torch.nn.functional.scaled_dot_product_attention(q4, keys, values, scale=DIM ** -0.5,
                                                                enable_gqa=True)

    out = {"method": "dense", "path": "sdpa", "batch": batch, "context": n, "step_ms": cuda_ms(step, reps)}
    try:
        out["step_graph_ms"] = graph_ms(step, reps)
    except Exception as e:
        out["step_graph_ms"] = None
        out["graph_error"] = f"{type(e).__name__}: {e}"
    out["floor_bytes"] = floor_bytes("dense", batch, n)
    out["floor_ms"] = out["floor_bytes"] / bw * 1e3
    out["x_floor"] = min(t for t in (out["step_ms"], out["step_graph_ms"]) if t is not None) / out["floor_ms"]
    return out


def bench_selection(n: int, k: int, rows: int, reps: int, gen: torch.Generator) -> dict:
    s = torch.randn((rows, n), generator=gen, device=DEV)
    out = {"rows": rows, "n": n, "k": k}
    fns = {"bucket": lambda: bucket_topk(s, k), "bucket_unsorted": lambda: bucket_topk(s, k, sort=False),
           "radix": lambda: radix_topk(s, k), "radix_unsorted": lambda: radix_topk(s, k, sort=False),
           "torch_topk": lambda: torch.topk(s, k, dim=1),
           "torch_topk_unsorted": lambda: torch.topk(s, k, dim=1, sorted=False)}
    for name, fn in fns.items():
        out[f"{name}_ms"] = cuda_ms(fn, reps)
    for name in ("bucket", "bucket_unsorted", "radix", "radix_unsorted", "torch_topk"):
        try:
            out[f"{name}_graph_ms"] = graph_ms(fns[name], reps)
        except Exception as e:
            out[f"{name}_graph_ms"] = None
            out[f"{name}_graph_error"] = f"{type(e).__name__}: {e}"
    tv, _ = torch.topk(s, k, dim=1)
    _, rv = radix_topk(s, k)
    _, bv = bucket_topk(s, k)
    out["same_values_as_torch_topk"] = bool(torch.equal(rv, tv) and torch.equal(bv, tv))
    try:
        import flashinfer  # noqa: F401

        fi = getattr(flashinfer, "top_k", None) or getattr(getattr(flashinfer, "sampling", None), "top_k", None)
        if fi is not None:
            out["flashinfer_top_k_ms"] = cuda_ms(lambda: fi(s, k), reps)
        else:
            out["flashinfer"] = f"flashinfer {flashinfer.__version__} has no top_k"
    except Exception as e:
        out["flashinfer"] = f"not run: {type(e).__name__}: {str(e)[:200]}"
    return out


def save(report: dict, path: Path) -> None:
    """Rewrite the report (through a temporary file: a crash mid-write keeps the last one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(stamp(report), indent=1) + "\n")
    tmp.replace(path)


def run(args) -> dict:
    start = time.time()
    gen = torch.Generator(device=DEV).manual_seed(args.seed)
    env = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "none (--device cpu)",
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version()}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    bw = copy_bandwidth(args.reps)
    report = {"env": env, "copy_bytes_per_s": bw,
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "steps": [], "selection": [], "errors": [], "skipped": []}
    print(f"# {env['gpu']}  torch {env['torch']}  triton {env['triton']}  copy {bw / 1e12:.2f} TB/s", flush=True)

    def late(what: dict) -> bool:
        if time.time() - start <= args.time_limit:
            return False
        report["skipped"].append({**what, "why": f"past --time-limit {args.time_limit:.0f} s"})
        save(report, args.out)
        return True

    for rows in args.select_rows:
        if late({"selection_rows": rows}):
            continue
        try:
            r = bench_selection(args.select_n, BUDGET, rows, args.reps, gen)
            report["selection"].append(r)
            print(f"select {BUDGET} of {args.select_n:,} x{rows}: bucket {r['bucket_ms'] * 1e3:.1f} us (graph "
                  f"{_us(r.get('bucket_graph_ms'))}, unsorted graph {_us(r.get('bucket_unsorted_graph_ms'))}), "
                  f"radix {r['radix_ms'] * 1e3:.1f} us (graph {_us(r.get('radix_graph_ms'))}), "
                  f"torch.topk {r['torch_topk_ms'] * 1e3:.1f} us (graph {_us(r.get('torch_topk_graph_ms'))})",
                  flush=True)
        except Exception as e:
            report["errors"].append({"selection_rows": rows, "error": f"{type(e).__name__}: {e}",
                                     "trace": traceback.format_exc()[-2000:]})
            print(f"select x{rows}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
        save(report, args.out)
    # the Triton path once per combination of the swept settings (one each by default)
    sweep = [replace(DEFAULT, block_n=bn, num_warps=nw, chunk=ch, programs=pg, select=sl)
             for bn, nw, ch, pg, sl in itertools.product(args.block_n, args.num_warps, args.chunk, args.programs,
                                                         args.select)]
    for n in args.contexts:
        for batch in args.batches:
            if late({"context": n, "batch": batch}):
                continue
            try:  # the case's inputs, all drawn before any of its captures, from the script's generator
                keys = torch.randn((batch, KV_HEADS, n, DIM), generator=gen, device=DEV, dtype=torch.bfloat16)
                values = torch.randn((batch, KV_HEADS, n, DIM), generator=gen, device=DEV, dtype=torch.bfloat16)
                q = torch.randn((batch, Q_HEADS, DIM), generator=gen, device=DEV, dtype=torch.bfloat16)
            except torch.OutOfMemoryError as e:
                report["errors"].append({"context": n, "batch": batch, "error": f"allocating the cache: {e}"})
                save(report, args.out)
                continue
            runs = [("dense", "sdpa", DEFAULT)] + [(m, p, st) for m in args.methods for p in args.paths
                                                   for st in (sweep if p == "triton" else [DEFAULT])]
            for name, path, settings in runs:
                if late({"method": name, "path": path, "context": n, "batch": batch}):
                    continue
                t0 = time.time()
                try:
                    r = (bench_dense(q, keys, values, batch, n, args.reps, bw) if name == "dense"
                         else bench_method(name, path, q, keys, values, batch, n, args.reps, bw, gen, settings))
                    r["seconds"] = time.time() - t0
                    report["steps"].append(r)
                    print(_line(r), flush=True)
                except Exception as e:
                    report["errors"].append({"method": name, "path": path, "context": n, "batch": batch,
                                             "error": f"{type(e).__name__}: {e}",
                                             "trace": traceback.format_exc()[-2000:]})
                    print(f"{name}/{path} N={n} B={batch}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                finally:
                    _free()
                save(report, args.out)
            del keys, values, q
            _free()
    report["seconds"] = time.time() - start
    return report


def _free() -> None:
    if DEV == "cuda":
        torch.cuda.empty_cache()


def _us(ms) -> str:
    return "n/a" if ms is None else f"{ms * 1e3:.1f} us"


def _path(r: dict) -> str:
    """The path, with the Triton settings that differ from the defaults (a sweep's rows apart)."""
    changed = {k: v for k, v in r.get("settings", {}).items() if v != getattr(DEFAULT, k)}
    return r["path"] + "".join(f" {k}={v}" for k, v in changed.items())


def _line(r: dict) -> str:
    best = min(t for t in (r["step_ms"], r.get("step_graph_ms")) if t is not None)
    text = (f"{r['method']:>10}/{_path(r):<6} N={r['context']:>8,} B={r['batch']}: step {r['step_ms'] * 1e3:8.1f} us "
            f"(graph {_us(r.get('step_graph_ms'))}), floor {r['floor_ms'] * 1e3:.1f} us, {best / r['floor_ms']:.2f}x")
    if "relevancy_ms" in r:
        text += (f"; relevancy {r['relevancy_ms'] * 1e3:.1f} retrieval {r['retrieval_ms'] * 1e3:.1f} apply "
                 f"{r['apply_ms'] * 1e3:.1f} us, memory share {100 * r['memory_share']:.0f}%")
    return text


def table(steps: list[dict]) -> str:
    """The steps as a markdown table (for RESULTS.md)."""
    lines = ["| method | path | context | batch | step us | graph us | floor us | x floor | rel / ret / apply us |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in steps:
        stages = ("-" if "relevancy_ms" not in r else
                  f"{r['relevancy_ms'] * 1e3:.1f} / {r['retrieval_ms'] * 1e3:.1f} / {r['apply_ms'] * 1e3:.1f}")
        lines.append(f"| {r['method']} | {_path(r)} | {r['context']:,} | {r['batch']} | {r['step_ms'] * 1e3:.1f} | "
                     f"{_us(r.get('step_graph_ms'))} | {r['floor_ms'] * 1e3:.1f} | {r['x_floor']:.2f} | {stages} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="32K and 128K, batch 1, fewer repetitions")
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 1 << 20])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--paths", nargs="+", default=["triton", "torch"], choices=["triton", "torch"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--block-n", type=int, nargs="+", default=[DEFAULT.block_n], help="Triton path: keys a "
                    "relevancy program (several: one run each, with every other swept setting)")
    ap.add_argument("--num-warps", type=int, nargs="+", default=[DEFAULT.num_warps])
    ap.add_argument("--chunk", type=int, nargs="+", default=[DEFAULT.chunk], help="most tokens a decode program")
    ap.add_argument("--programs", type=int, nargs="+", default=[DEFAULT.programs],
                    help="decode programs to aim for (1: splits by --chunk alone, as before)")
    ap.add_argument("--select", nargs="+", default=[DEFAULT.select], choices=["bucket", "radix"])
    ap.add_argument("--select-n", type=int, default=1 << 20)
    ap.add_argument("--select-rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--time-limit", type=float, default=540.0,
                    help="start no measurement after this many seconds (the JSON keeps what ran)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a check of the script on tiny shapes (TRITON_INTERPRET=1); its times mean nothing")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "attention_h200.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts, args.batches, args.reps, args.select_rows = [32768, 131072], [1], 10, [1]
    global DEV
    DEV = args.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("bench_attention: no CUDA device", file=sys.stderr)
        return 2
    report = run(args)
    save(report, args.out)
    print(table(report["steps"]))
    print(f"wrote {args.out} ({len(report['steps'])} steps, {len(report['errors'])} errors, "
          f"{len(report['skipped'])} skipped, {report['seconds']:.0f} s)")
    return 1 if report["errors"] or report["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
