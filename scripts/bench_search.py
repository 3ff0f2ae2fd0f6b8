#!/usr/bin/env python
"""BM25 engines side by side on one corpus and one query set: index speed, query latency, batch QPS, memory.

Every engine runs in fresh subprocesses (one to build its index, one to search it), so peak RSS is each engine's
own (``ru_maxrss`` of the process and of its largest child, e.g. ragserve's indexing workers). Per engine:
- index: seconds to build the on-disk index from the corpus file (docs/s) and CPU seconds of the process and its
  children (steadier than wall time on a shared machine); for pyserini the corpus is first
  rewritten as BEIR files, one per thread (not timed); bm25s* times tokenisation + ``index`` (in memory).
- single: each of the first ``--single`` queries alone, k=10, one thread (after ``--warmup`` untimed queries):
  p50 / p99 latency in ms, from query text to ranked ids, and the p50 of the calling thread's CPU time (every
  engine answers a single query in the calling thread, so this is its latency without the other jobs' load).
- batch: all queries in one call with the engine's own parallelism (2 threads), queries per second.
- agree@10: mean overlap of the engine's top-10 with ragserve's on the first 200 queries (the same Lucene BM25
  gives 1.0; other tokenizers or BM25 variants less).

    .venv/bin/python scripts/bench_search.py --corpus ../shared/data/beir-arguana/corpus.jsonl.gz \\
        --queries ../shared/data/beir-arguana/queries.jsonl.gz --name arguana
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.peers import engines as E  # noqa: E402

ORDER = ["ragserve", "pyserini", "bm25s", "bm25s-ours", "pisa", "tantivy", "rank-bm25"]
AGREE_QUERIES = 200


def _docs(corpus: Path):
    from indexer.readers import iter_documents

    return iter_documents([str(corpus)])


def _queries(path: Path) -> list[str]:
    from ragserve.topics import read_queries

    return [q.text for q in read_queries(path)]


def _percentile(xs: list[float], p: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(xs), p)) if xs else float("nan")


def _cpu_s() -> float:
    """CPU seconds of this process (all threads) and its finished children."""
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def worker(args: argparse.Namespace) -> dict:
    """One engine, one phase, in this process; returns the measurements."""
    eng = E.ENGINES[args.worker]()
    index_dir = args.workdir / f"{args.name}-{eng.name}"
    out: dict = {"engine": eng.name, "phase": args.phase, "load": os.getloadavg()[0]}
    if args.phase in ("build", "all"):
        shutil.rmtree(index_dir, ignore_errors=True)
        n = sum(1 for _ in _docs(args.corpus)) if eng.name != "ragserve" else None
        c0, t0 = _cpu_s(), time.perf_counter()
        extra = eng.build(_docs(args.corpus), index_dir, args.corpus)
        out["index_s"] = time.perf_counter() - t0
        out["index_cpu_s"] = _cpu_s() - c0
        out["docs"] = n
        out.update(extra)
        out["index_bytes"] = E.dir_bytes(index_dir)
        out["build_rss_mib"] = max(E.peak_rss_mib())
        gc.collect()
    if args.phase in ("search", "all"):
        queries = _queries(args.queries)
        cap = eng.max_queries or len(queries)
        warmup, n_single, n_agree = min(args.warmup, cap // 10), min(args.single, cap), min(AGREE_QUERIES, cap)
        t0 = time.perf_counter()
        eng.open(index_dir)
        out["open_s"] = time.perf_counter() - t0
        for q in queries[:warmup]:
            eng.search(q, args.k)
        lat, cpu = [], []
        single = queries[:n_single]
        for q in single:
            c0, t0 = time.thread_time(), time.perf_counter()
            eng.search(q, args.k)
            lat.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        out.update(single_queries=len(single), p50_ms=_percentile(lat, 50) * 1e3, p99_ms=_percentile(lat, 99) * 1e3,
                   mean_ms=sum(lat) / len(lat) * 1e3, cpu_p50_ms=_percentile(cpu, 50) * 1e3)
        if isinstance(eng, E.Pyserini):
            raw = []
            for q in single:
                t0 = time.perf_counter()
                eng.search_lucene(q, args.k)
                raw.append(time.perf_counter() - t0)
            out.update(lucene_p50_ms=_percentile(raw, 50) * 1e3, lucene_p99_ms=_percentile(raw, 99) * 1e3)
        if eng.name != "rank-bm25":
            eng.batch(queries[:args.warmup], args.k)
            t0 = time.perf_counter()
            eng.batch(queries, args.k)
            out["batch_qps"] = len(queries) / (time.perf_counter() - t0)
        out["top10"] = [eng.ids(eng.search(q, 10))[:10] for q in queries[:n_agree]]
        out["search_rss_mib"] = E.peak_rss_mib()[0]
    return out


def run_engine(args: argparse.Namespace, name: str) -> dict:
    res: dict = {"engine": name}
    phases = ["all"] if name == "rank-bm25" else ["build", "search"]
    for phase in phases:
        cmd = [sys.executable, __file__, "--worker", name, "--phase", phase, "--corpus", str(args.corpus),
               "--queries", str(args.queries), "--name", args.name, "--workdir", str(args.workdir),
               "--k", str(args.k), "--single", str(args.single), "--warmup", str(args.warmup)]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode != 0 or not lines:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            res["error"] = f"{phase} failed (exit {p.returncode}): {' | '.join(tail)}"
            break
        part = json.loads(lines[-1])
        res.update({k: v for k, v in part.items() if k not in ("phase", "load")})
        res[f"load_{phase}"] = part["load"]
        print(f"  {name} {phase}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    shutil.rmtree(args.workdir / f"{args.name}-{name}", ignore_errors=True)
    return res


def agreement(a: list[list[str]], b: list[list[str]]) -> float:
    pairs = [(x, y) for x, y in zip(a, b) if y]
    return sum(len(set(x) & set(y)) / len(y) for x, y in pairs) / len(pairs) if pairs else float("nan")


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def report(results: list[dict], args: argparse.Namespace) -> str:
    base = next((r for r in results if r["engine"] == "ragserve" and "error" not in r), None)
    rows = ["| engine | index s | index CPU s | docs/s | index MiB | build peak RSS MiB | p50 ms | p99 ms "
            "| CPU p50 ms | batch QPS | search peak RSS MiB | agree@10 | p50 / ragserve | QPS ragserve / engine |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in results:
        if "error" in r:
            notes.append(f"- {r['engine']}: not measured ({r['error']})")
            continue
        docs = r.get("docs") or (base or {}).get("docs_total")
        dps = docs / r["index_s"] if docs and r.get("index_s") else None
        agree = agreement(r["top10"], base["top10"]) if base else None
        p50_ratio = r["p50_ms"] / base["p50_ms"] if base else None
        qps_ratio = base["batch_qps"] / r["batch_qps"] if base and r.get("batch_qps") else None
        rows.append(f"| {r['engine']} | {fmt(r.get('index_s'), '.1f')} | {fmt(r.get('index_cpu_s'), '.1f')} "
                    f"| {fmt(dps, ',.0f')} | {fmt(r.get('index_bytes', 0) / 2**20, ',.0f')} "
                    f"| {fmt(r.get('build_rss_mib'), ',.0f')} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} "
                    f"| {r['cpu_p50_ms']:.3f} | {fmt(r.get('batch_qps'), ',.0f')} "
                    f"| {fmt(r.get('search_rss_mib'), ',.0f')} | {fmt(agree, '.3f')} | {fmt(p50_ratio, '.2f')} "
                    f"| {fmt(qps_ratio, '.2f')} |")
        if r["engine"] == "pyserini":
            notes.append(f"- pyserini: Lucene's IndexSearcher alone (no pyserini wrapper): p50 "
                         f"{r['lucene_p50_ms']:.3f} ms, p99 {r['lucene_p99_ms']:.3f} ms")
    loads = ", ".join(f"{r['engine']} {r.get('load_build', r.get('load_all', 0)):.1f}/{r.get('load_search', 0):.1f}"
                      for r in results if "error" not in r)
    notes.append(f"- 1-minute load average at the start of build/search: {loads}")
    return "\n".join(rows + [""] + notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="JSONL corpus (BEIR or id/title/text), .gz allowed")
    ap.add_argument("--queries", type=Path, required=True, help="queries (TSV id<TAB>text or BEIR/JSONL)")
    ap.add_argument("--name", default="bench", help="label for this corpus")
    ap.add_argument("--engines", default=",".join(ORDER), help=f"comma-separated subset of {','.join(ORDER)}")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ragserve-bench"))
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--single", type=int, default=1000, help="queries timed one by one")
    ap.add_argument("--warmup", type=int, default=100, help="untimed queries first (JIT, caches)")
    ap.add_argument("--rank-bm25-max-docs", type=int, default=50_000, help="skip rank-bm25 above this corpus size")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per engine phase")
    ap.add_argument("--json", type=Path, help="write all measurements here")
    ap.add_argument("--worker", choices=ORDER, help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=["build", "search", "all"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    for p in (args.corpus, args.queries):
        if not p.is_file():
            ap.error(f"{p}: no such file")
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        ap.error(f"unknown engines: {', '.join(unknown)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    docs_total = sum(1 for _ in _docs(args.corpus))
    nq = len(_queries(args.queries))
    print(f"{args.name}: {docs_total:,} documents, {nq:,} queries, k={args.k}, {E.cpu_count()} cores", file=sys.stderr)
    results = []
    for name in ["ragserve"] + [n for n in names if n != "ragserve"]:
        ok, why = E.available(name)
        if not ok:
            results.append({"engine": name, "error": f"does not import here: {why}"})
        elif name == "rank-bm25" and docs_total > args.rank_bm25_max_docs:
            why = f"skipped: O(N) per query, corpus over {args.rank_bm25_max_docs:,} docs"
            results.append({"engine": name, "error": why})
        else:
            results.append(run_engine(args, name))
    for r in results:
        if r["engine"] == "ragserve":
            r["docs_total"] = docs_total
            r["docs"] = docs_total
    table = report(results, args)
    print(f"\n{args.name}: {docs_total:,} passages, {nq:,} queries, k={args.k}, single-query latency over "
          f"{min(args.single, nq)} queries\n")
    print(table)
    if args.json:  # compact: each engine's agree@10 instead of its 200 top-10 lists
        base = next((r for r in results if r["engine"] == "ragserve" and "error" not in r), None)
        for r in results:
            if "top10" in r:
                r["agree10"] = agreement(r["top10"], base["top10"]) if base else None
        kept = [{k: v for k, v in r.items() if k != "top10"} for r in results]
        args.json.write_text(json.dumps(kept, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
