"""One query at a time through each layer of the production path, side by side on the same queries: what the
searcher, the CLI and the HTTP server add around the backend's own call, per stage, in microseconds.

    python scripts/bench_search_paths.py --index IDX --queries QUERIES --backend cpu --threads 1 --core 1 \
        -k 10 --n 300 --repeat 5 --out paths.json
    python scripts/bench_search_paths.py --index /tmp/synth/dpr21m --queries /tmp/synth/msmarco.tsv --backend gpu \
        -k 10 --n 300 --out paths.json        # the H200 (--device cpu: a dry run on torch's CPU device)

Paths, each query through every one of them in turn, in a random order each time (the first call of a query finds
its postings out of the caches, the next ones in them: a fixed order would favour the paths after the backend's):
- ``backend``: the backend's call on the query analysed beforehand (what ``bench_gpu.py`` times: the GPU's
  single-query CUDA graph), no stage times asked;
- ``queue``: the same through the searcher's queue (``DeviceQueue`` / ``ParallelCalls``);
- ``searcher``: ``Searcher.search(text, k, with_text=False, times=...)`` and each hit's id read: query text to
  ranked ids, the production path of the CLI's run files, the RAG loops and the peers' benchmark;
- ``searcher+text``: the same with the passages (title, text) read, as a prompt or ``/v1/search`` reads them;
- ``cli``: ``ragserve search QUERY``'s work for one query (the search and its printed lines, not the process);
- ``http``: ``POST /v1/search`` through the server's WSGI app in this process, from the request's environ to
  its JSON body (Flask, the validation, the search service and its metrics, the passages; no socket, no client).
Components, timed alone in the same shuffle: ``prepare`` (``Searcher.analyze``), ``hits`` (a backend result to
hits with ids) and ``hits+text``. The searcher path's stage times (``StageTimes``) are reported as well.

Every call is timed by the wall clock and by the calling thread's CPU clock; on a shared machine the CPU clock
leaves out the time other jobs hold the core (a GPU call's wait counts only as far as the host spins on it).
Each query's figure is its median over ``--repeat``; p50 / p99 over the queries. "Over backend" is each query's
path minus its own backend call. ``--code DIR`` imports ragserve from another checkout (before / after on one
machine; paths that checkout lacks are left out).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# --code checkouts are put before it later, so ragserve still comes from the one measured
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402


def _commit(code: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", required=True, help="any topics format ragserve.topics reads")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="cpu backend: threads (0: one per core)")
    ap.add_argument("--device", help="gpu backend: its device (cpu: a dry run on torch's CPU device)")
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--n", type=int, default=300, help="queries timed (each through every path)")
    ap.add_argument("--repeat", type=int, default=3, help="passes over the queries (each query's median)")
    ap.add_argument("--warmup", type=int, default=20, help="queries run through every path first, not timed")
    ap.add_argument("--core", type=int, help="pin this process to one core")
    ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1],
                    help="checkout to import ragserve from (default: this one)")
    ap.add_argument("--out", type=Path, help="compact JSON of the figures")
    a = ap.parse_args(argv)
    if a.core is not None:
        os.sched_setaffinity(0, {a.core})
    code = a.code.resolve()
    sys.path.insert(0, str(code))
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import numpy as np

    from ragserve.kernels.contract import StageTimes
    from ragserve.retrieval.searcher import MAX_K, Searcher
    from ragserve.server.app import create_app
    from ragserve.server.config import ServerConfig
    from ragserve.topics import read_queries
    from werkzeug.test import EnvironBuilder

    try:
        from ragserve.commands.search import format_hits
    except ImportError:  # a checkout from before format_hits: no cli path
        format_hits = None

    opts: dict = {}
    if a.backend == "cpu" and a.threads:
        opts["threads"] = a.threads
    if a.device:
        opts["device"] = a.device
    load0 = os.getloadavg()
    s = Searcher(a.index, backend=a.backend, **opts)
    ix = s.index
    k, k1, b = a.k, ix.k1, ix.b
    texts = [q.text for q in read_queries(a.queries) if q.text.strip()][:a.warmup + a.n]
    analysed = [s.analyze(t) for t in texts]
    tops = [s.backend.search_terms([q], k, k1, b)[0] for q in analysed]
    app = create_app(s, ServerConfig(max_k=MAX_K))
    # Requests as the WSGI server hands them to the app: the environ built beforehand, so that the client's side
    # (Werkzeug's test client builds and parses as much as the server does) is left out.
    base_env = EnvironBuilder(path="/v1/search", method="POST", content_type="application/json").get_environ()
    bodies = [json.dumps({"query": t, "k": k}).encode() for t in texts]
    # The server's metrics listen to the searcher's queue: only while a request goes through the server, as the
    # other paths run without a server.
    server_listeners = list(s.queue._listeners)
    s.queue._listeners.clear()
    stage_log: list[StageTimes] = []

    def searcher(i: int) -> None:
        times = StageTimes()
        for h in s.search(texts[i], k, with_text=False, times=times):
            h.id
        stage_log.append(times)

    def with_text(hits) -> None:
        for h in hits:
            h.id, h.title, h.text

    def http(i: int) -> None:
        env = {**base_env, "wsgi.input": io.BytesIO(bodies[i]), "CONTENT_LENGTH": str(len(bodies[i]))}
        status = []
        s.queue._listeners[:] = server_listeners
        try:
            out = app(env, lambda st, headers, exc_info=None: status.append(st))
            body = b"".join(out)
            out.close()  # as the WSGI server does: the request's metrics are recorded on close
        finally:
            s.queue._listeners.clear()
        if not status[0].startswith("200"):
            raise SystemExit(f"/v1/search answered {status[0]}: {body[:200]!r}")

    paths = {
        "backend": lambda i: s.backend.search_terms([analysed[i]], k, k1, b),
        "queue": lambda i: s.queue.run([analysed[i]], k, k1, b),
        "searcher": searcher,
        "searcher+text": lambda i: with_text(s.search(texts[i], k, times=StageTimes())),
        **({"cli": lambda i: format_hits(s.search(texts[i], k))} if format_hits else {}),
        "http": http,
    }
    parts = {
        "prepare": lambda i: s.analyze(texts[i]),
        "hits": lambda i: [h.id for h in s.hits(tops[i], False)],
        "hits+text": lambda i: with_text(s.hits(tops[i], True)),
    }
    calls = {**paths, **parts}
    names = list(calls)
    n = len(texts) - a.warmup
    if n < 1:
        raise SystemExit(f"{a.queries}: fewer than {a.warmup + 1} queries")
    for i in range(a.warmup):
        for fn in calls.values():
            fn(i)
    wall = {p: np.zeros((a.repeat, n)) for p in names}
    cpu = {p: np.zeros((a.repeat, n)) for p in names}
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    order = np.random.default_rng(0)
    t_start = time.perf_counter()
    stage_log.clear()
    for rep in range(a.repeat):
        for qi in range(n):
            i = a.warmup + qi
            for j in order.permutation(len(names)):
                p = names[j]
                fn = calls[p]
                c0, t0 = cpu_clock(), clock()
                fn(i)
                t1, c1 = clock(), cpu_clock()
                wall[p][rep, qi] = (t1 - t0) / 1e3
                cpu[p][rep, qi] = (c1 - c0) / 1e3
    stage_us = np.array([[t.prepare, t.relevancy, t.retrieval] for t in stage_log]) * 1e6
    elapsed = time.perf_counter() - t_start
    load1 = os.getloadavg()

    def summary(v: np.ndarray) -> dict:
        return {"p50_us": round(float(np.percentile(v, 50)), 1), "p99_us": round(float(np.percentile(v, 99)), 1)}

    report: dict = {
        "index": str(a.index), "queries": str(a.queries), "backend": s.backend_name, "describe": s.backend.describe(),
        "k": k, "n": n, "repeat": a.repeat, "commit": _commit(code), "code": str(code),
        "host": {"cpu": cpu_model(), "cpus": os.cpu_count(), "pinned_core": a.core,
                 "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in load1]},
        "seconds": round(elapsed, 1), "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
        "paths": {}, "components": {},
    }
    med_w = {p: np.median(wall[p], axis=0) for p in names}
    med_c = {p: np.median(cpu[p], axis=0) for p in names}
    for p in names:
        entry = {"wall": summary(med_w[p]), "cpu": summary(med_c[p])}
        if p in paths and p != "backend":
            entry["over_backend"] = {"wall": summary(med_w[p] - med_w["backend"]),
                                     "cpu": summary(med_c[p] - med_c["backend"])}
        report["paths" if p in paths else "components"][p] = entry
    report["searcher_stages_p50_us"] = dict(zip(("prepare", "relevancy", "retrieval"),
                                                (round(float(x), 1) for x in np.median(stage_us, axis=0))))

    print(f"{report['backend']} backend, k = {k}, {n} queries x {a.repeat}; {cpu_model()}, "
          f"{os.cpu_count()} cpus, load {load0[0]:.1f} -> {load1[0]:.1f}; commit {report['commit']}")
    print(f"{'':14} {'wall p50':>9} {'p99':>9} {'over p50':>9} {'p99':>9} | {'cpu p50':>9} {'p99':>9} "
          f"{'over p50':>9} {'p99':>9}   (us)")
    for group in ("paths", "components"):
        for p, e in report[group].items():
            o = e.get("over_backend")
            ow = f"{o['wall']['p50_us']:9.1f} {o['wall']['p99_us']:9.1f}" if o else " " * 19
            oc = f"{o['cpu']['p50_us']:9.1f} {o['cpu']['p99_us']:9.1f}" if o else " " * 19
            print(f"{p:14} {e['wall']['p50_us']:9.1f} {e['wall']['p99_us']:9.1f} {ow} | "
                  f"{e['cpu']['p50_us']:9.1f} {e['cpu']['p99_us']:9.1f} {oc}")
    st = report["searcher_stages_p50_us"]
    print(f"searcher stage times p50 (us): prepare {st['prepare']}, relevancy {st['relevancy']}, "
          f"retrieval {st['retrieval']}")
    if a.out:
        a.out.write_text(json.dumps(stamp(report), separators=(",", ":")))
    s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
