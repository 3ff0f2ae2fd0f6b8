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

Realistic mode (``--realistic N``): N passages spelled with real Wikipedia vocabulary (``tools/peers/realcorpus``)
queried with held-out real questions (NQ-open test, MS MARCO dev), at k = 10, 100 and 1000:
- each engine builds its index in its own process on every core (timed, as above; ``--reuse`` keeps indexes
  built by an earlier run, with their times);
- then ONE process pinned to one core opens every engine and times them interleaved: for each repetition and
  each k, the questions are cut into runs of ``--run-length``; every engine variant (``engines.Engine.variants``)
  answers a run, one variant after the other in an order rotated per run, the variants of one engine apart (a
  variant never answers the questions whose postings its sibling has just read). Within a run an engine answers
  consecutive different questions, as a search server would (its code stays in the core's caches, each new
  question's postings mostly not), and runs are short, so the load of a shared machine falls on all alike;
  per question the median over repetitions, then percentiles; wall time and the calling thread's CPU time;
- in the same process, ragserve's pruned top-k is checked against its exhaustive run (docids and f32 score
  bits) on every query at every k, and its work is counted per query (postings scored, scanned, probed) against
  the exhaustive run's, overall and per query class (short: <= 3 terms, long: >= 8 terms, common-term: a term
  in >= 5% of the passages).
Peers missing here are reported, not installed (``tools/peers/install_peers.sh`` installs PISA and tantivy apart).

    RAGSERVE_PEERS_SITE=/tmp/peers .venv/bin/python scripts/bench_search.py --realistic 1000000 \\
        --json benchmarks/raw/search/realistic_1m.json
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

from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402
from tools.peers import engines as E  # noqa: E402

ORDER = ["ragserve", "pyserini", "bm25s", "bm25s-ours", "pisa", "tantivy", "rank-bm25"]
AGREE_QUERIES = 200
REALISTIC_ENGINES = "ragserve,bm25s,pyserini,pisa,tantivy"
QUERY_SETS = ("nq", "msmarco")


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


# ---- realistic mode ---------------------------------------------------------------------------------------------

def _realistic_corpus(args: argparse.Namespace) -> tuple[Path, dict]:
    """The realistic corpus of ``args.realistic`` passages, generated once into the work folder (not timed)."""
    from tools.peers import realcorpus

    corpus = args.workdir / f"realistic-{args.realistic}-seed{args.seed}.jsonl"
    facts_path = corpus.with_name(corpus.name + ".facts.json")
    if not corpus.is_file() or not facts_path.is_file():
        t0 = time.perf_counter()
        facts = realcorpus.write_corpus(corpus, args.realistic, seed=args.seed)
        facts["generate_s"] = round(time.perf_counter() - t0, 1)
        facts_path.write_text(json.dumps(facts, indent=1))
        print(f"  corpus: {args.realistic:,} passages in {facts['generate_s']} s", file=sys.stderr, flush=True)
    return corpus, json.loads(facts_path.read_text())


def _build_engine(args: argparse.Namespace, name: str, corpus: Path) -> dict:
    """Build one engine's index in its own process (all cores); kept for the search phase."""
    meta = args.workdir / f"{corpus.stem}-{name}.build.json"
    index_dir = args.workdir / f"{corpus.stem}-{name}"
    if args.reuse and meta.is_file() and index_dir.exists():
        return json.loads(meta.read_text())
    cmd = [sys.executable, __file__, "--worker", name, "--phase", "build", "--corpus", str(corpus),
           "--queries", str(corpus), "--name", corpus.stem, "--workdir", str(args.workdir)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"engine": name, "error": f"build failed (exit {p.returncode}): {' | '.join(tail)}"}
    res = json.loads(lines[-1])
    print(f"  {name} build: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    meta.write_text(json.dumps(res))
    return res


def _summary(ms: "np.ndarray") -> dict:
    import numpy as np

    return {"p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def interleaved_worker(args: argparse.Namespace) -> dict:
    """The search phase of the realistic mode, in this process pinned to one core (module doc)."""
    import numpy as np

    from tools.peers import realcorpus

    os.sched_setaffinity(0, {args.core})
    corpus = Path(args.corpus)
    ks = [int(k) for k in args.ks.split(",")]
    names = [n for n in args.engines.split(",") if n]
    queries = {qs: realcorpus.questions(qs, args.per_set) for qs in QUERY_SETS}
    engines = {}
    for name in names:
        eng = E.ENGINES[name]()
        t0 = time.perf_counter()
        eng.open(args.workdir / f"{corpus.stem}-{name}")
        engines[name] = eng
        print(f"  {name} open: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    # Variants of one engine share its data in the caches: order them apart (each engine's first variant, then
    # each one's second, ...), so that no variant answers questions whose postings its sibling has just read.
    by_engine = [[(label, name, prep, run) for label, prep, run in eng.variants()] for name, eng in engines.items()]
    entries = [v[i] for i in range(max(map(len, by_engine))) for v in by_engine if i < len(v)]
    prepared = {label: {qs: [prep(q) for q in queries[qs]] for qs in QUERY_SETS} for label, _, prep, _ in entries}
    t0 = time.perf_counter()
    for label, _, _, run in entries:  # JIT compilers (numba, the JVM's) and caches
        for k in ks:
            for qs in QUERY_SETS:
                for p in prepared[label][qs][:args.warmup]:
                    run(p, k)
    print(f"  warm-up: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    lat = {label: {qs: np.zeros((len(ks), args.repeat, len(queries[qs]))) for qs in QUERY_SETS}
           for label, _, _, _ in entries}
    cpu = {label: {qs: np.zeros((len(ks), args.repeat, len(queries[qs]))) for qs in QUERY_SETS}
           for label, _, _, _ in entries}
    t0 = time.perf_counter()
    for rep in range(args.repeat):
        for ki, k in enumerate(ks):
            for qs in QUERY_SETS:
                for c0 in range(0, len(queries[qs]), args.run_length):
                    rot = (c0 // args.run_length + rep) % len(entries)
                    for label, _, _, run in entries[rot:] + entries[:rot]:
                        for qi in range(c0, min(c0 + args.run_length, len(queries[qs]))):
                            p = prepared[label][qs][qi]
                            c1 = time.thread_time()
                            t1 = time.perf_counter()
                            run(p, k)
                            lat[label][qs][ki, rep, qi] = time.perf_counter() - t1
                            cpu[label][qs][ki, rep, qi] = time.thread_time() - c1
        print(f"  repetition {rep + 1}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    out: dict = {"ks": ks, "repeat": args.repeat, "warmup": args.warmup, "core": args.core,
                 "run_length": args.run_length,
                 "queries": {qs: len(v) for qs, v in queries.items()},
                 "labels": [e[0] for v in by_engine for e in v],
                 "engine_of": {e[0]: e[1] for e in entries}, "search": {}}
    per_query = {}  # label -> set -> [k, query] median ms
    out["cpu"] = {}  # the same from the calling thread's CPU time: every engine answers in the calling thread,
    # so this is its time without the waits that other jobs of a shared machine impose
    for label in lat:
        per_query[label] = {qs: np.median(lat[label][qs], axis=1) * 1e3 for qs in QUERY_SETS}
        out["search"][label] = {qs: {str(k): _summary(per_query[label][qs][ki]) for ki, k in enumerate(ks)}
                                for qs in QUERY_SETS}
        med = {qs: np.median(cpu[label][qs], axis=1) * 1e3 for qs in QUERY_SETS}
        out["cpu"][label] = {qs: {str(k): _summary(med[qs][ki]) for ki, k in enumerate(ks)} for qs in QUERY_SETS}
    if "ragserve" in engines:
        out.update(_ragserve_checks(engines["ragserve"], queries, prepared, ks, per_query))
    agree = {}
    if "ragserve" in engines:
        base = {qs: [engines["ragserve"].ids(engines["ragserve"].search(q, 10))[:10]
                     for q in queries[qs][:AGREE_QUERIES]] for qs in QUERY_SETS}
        for name, eng in engines.items():
            top = {qs: [eng.ids(eng.search(q, 10))[:10] for q in queries[qs][:AGREE_QUERIES]] for qs in QUERY_SETS}
            agree[name] = {qs: agreement(top[qs], base[qs]) for qs in QUERY_SETS}
    out["agree_at_10"] = agree
    return out


def _ragserve_checks(eng, queries: dict, prepared: dict, ks: list[int], per_query: dict) -> dict:
    """Pruned against exhaustive on every query and k (docids and score bits), the work counts, and the query
    classes with every engine's p50 in each."""
    import numpy as np

    from ragserve.kernels.cpu.backend import CpuBackend, CpuTuning

    searcher = eng.searcher
    ix = searcher.index
    pruned = searcher.backend
    full = CpuBackend(ix, threads=1, prune=False, tuning=CpuTuning(resident=False))  # no second copy in memory
    df = np.asarray(ix.df)
    label = "ragserve (analysed query)"
    checks = {"compared": 0, "mismatches": 0, "mismatched": []}
    classes: dict = {}
    for qs in QUERY_SETS:
        terms = prepared[label][qs]
        cls = {"all": [], "short": [], "long": [], "common-term": []}
        for qi, t in enumerate(terms):
            cls["all"].append(qi)
            if 0 < len(t) <= 3:
                cls["short"].append(qi)
            if len(t) >= 8:
                cls["long"].append(qi)
            if len(t) and int(df[t.term_ids].max()) >= 0.05 * ix.doc_count:
                cls["common-term"].append(qi)
        stats = {}
        for ki, k in enumerate(ks):
            rows = []
            for qi, t in enumerate(terms):
                a, st = pruned.search_with_stats(t, k, ix.k1, ix.b)
                b, st_full = full.search_with_stats(t, k, ix.k1, ix.b)
                checks["compared"] += 1
                if not a.same_as(b):
                    checks["mismatches"] += 1
                    checks["mismatched"].append([qs, qi, k])
                rows.append([st[n] for n in _STATS] + [st_full["scored"], st_full["flushed"]])
            stats[k] = np.asarray(rows, dtype=np.float64)
        for c, members in cls.items():
            idx = np.asarray(members, dtype=np.int64)
            entry = {"queries": len(members)}
            if len(members):
                entry["terms_mean"] = float(np.mean([len(terms[i]) for i in members]))
                entry["p50_ms"] = {lab: {str(k): float(np.median(per_query[lab][qs][ki][idx])) for ki, k in enumerate(ks)}
                                   for lab in per_query}
                entry["work_mean"] = {str(k): dict(zip(_STATS + ["exhaustive_scored", "exhaustive_flushed"],
                                                       (float(x) for x in stats[k][idx].mean(axis=0))))
                                      for k in ks}
            classes.setdefault(qs, {})[c] = entry
    return {"exactness": checks, "classes": classes}


_STATS = ["scored", "scanned", "probes", "candidates", "windows", "skipped_windows", "skipped_postings", "flushed",
          "pushes"]


def realistic_table(res: dict) -> str:
    """Markdown: p50 ms per engine variant at each k for each query set, and the build time."""
    ks = res["search"]["ks"]
    lines = []
    for qs in QUERY_SETS:
        n = res["search"]["queries"][qs]
        head = "| engine (one core, %d %s questions, %s passages) | " % (n, {"nq": "NQ-open", "msmarco": "MS MARCO dev"}[qs],
                                                                       f"{res['corpus']['docs']:,}")
        head += " | ".join(f"p50 ms k={k}" for k in ks) + " | " + " | ".join(f"CPU p50 ms k={k}" for k in ks)
        head += " | index build s (CPU s) |"
        lines += [head, "|---" * (2 * len(ks) + 2) + "|"]
        for label in res["search"]["labels"]:
            r = res["search"]["search"][label][qs]
            c = res["search"]["cpu"][label][qs]
            b = res["builds"].get(res["search"]["engine_of"][label], {})
            build = (f"{b['index_s']:.1f} ({b['index_cpu_s']:.1f})"
                     if "index_s" in b and label == res["search"]["engine_of"][label] else "")
            lines.append(f"| {label} | " + " | ".join(f"{r[str(k)]['p50_ms']:.3f}" for k in ks) + " | "
                         + " | ".join(f"{c[str(k)]['p50_ms']:.3f}" for k in ks) + f" | {build} |")
        lines.append("")
    ex = res["search"].get("exactness")
    if ex:
        lines.append(f"ragserve pruned = exhaustive (docids and f32 score bits): {ex['compared'] - ex['mismatches']}"
                     f" of {ex['compared']} (query, k) pairs; mismatches: {ex['mismatches']}")
    return "\n".join(lines)


def realistic_main(args: argparse.Namespace) -> int:
    import platform

    args.workdir.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    corpus, facts = _realistic_corpus(args)
    res: dict = {"corpus": facts, "machine": {"cpu": cpu_model(), "cores": E.cpu_count(),
                                              "python": platform.python_version(),
                                              "load_at_start": os.getloadavg()},
                 "builds": {}, "missing": {}}
    usable = []
    for name in names:
        ok, why = E.available(name)
        if not ok:
            res["missing"][name] = why
            continue
        b = _build_engine(args, name, corpus)
        res["builds"][name] = b
        if "error" in b:
            res["missing"][name] = b["error"]
        else:
            usable.append(name)
    cmd = [sys.executable, __file__, "--interleaved-worker", "--corpus", str(corpus), "--workdir", str(args.workdir),
           "--engines", ",".join(usable), "--ks", args.ks, "--repeat", str(args.repeat), "--per-set",
           str(args.per_set), "--warmup", str(args.warmup), "--core", str(args.core), "--queries", str(corpus),
           "--run-length", str(args.run_length)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"search phase failed (exit {p.returncode})", file=sys.stderr)
        return 1
    res["search"] = json.loads(lines[-1])
    res["machine"]["load_at_end"] = os.getloadavg()
    table = realistic_table(res)
    print(table)
    for name, why in res["missing"].items():
        print(f"- {name}: not measured ({why})")
    if args.json:
        args.json.write_text(json.dumps(stamp(res), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, help="JSONL corpus (BEIR or id/title/text), .gz allowed")
    ap.add_argument("--queries", type=Path, help="queries (TSV id<TAB>text or BEIR/JSONL)")
    ap.add_argument("--realistic", type=int, metavar="N", help="realistic mode: N generated passages (module doc)")
    ap.add_argument("--seed", type=int, default=0, help="realistic corpus seed")
    ap.add_argument("--reuse", action="store_true", help="realistic mode: keep indexes built by an earlier run")
    ap.add_argument("--ks", default="10,100,1000", help="realistic mode: the k values")
    ap.add_argument("--repeat", type=int, default=3, help="realistic mode: timed passes over the queries")
    ap.add_argument("--per-set", type=int, default=500, help="realistic mode: questions of each set")
    ap.add_argument("--core", type=int, default=1, help="realistic mode: the core the search phase runs on")
    ap.add_argument("--run-length", type=int, default=10, help="realistic mode: questions an engine answers in a row")
    ap.add_argument("--interleaved-worker", action="store_true", help=argparse.SUPPRESS)
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

    if args.interleaved_worker:
        print(json.dumps(interleaved_worker(args)))
        return 0
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.realistic is not None:
        if args.realistic < 1:
            ap.error("--realistic needs a positive number of passages")
        if args.engines == ",".join(ORDER):
            args.engines = REALISTIC_ENGINES
        return realistic_main(args)
    if args.corpus is None or args.queries is None:
        ap.error("--corpus and --queries are required (or --realistic N)")
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
        args.json.write_text(json.dumps(stamp({"engines": kept}), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
