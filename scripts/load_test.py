#!/usr/bin/env python3
"""Load test of a ``ragserve serve`` on this machine (loopback only): queries/s and latency at several client counts.

For each client count (``--clients 1 8 32 128``), client processes run that many threads in all, each with its
own keep-alive connection, sending requests back to back: ``--warmup`` seconds unrecorded, then ``--duration``
seconds recorded (requests started in that window). Reports requests/s, queries/s (a search request carries
``--batch`` queries), latency p50/p90/p99/max, errors (any non-2xx status or connection failure) and, from the
server's ``/metrics`` over the same window, how its search queue batched: launches, queries and requests per
launch, mean queue wait. Prints a table, and the compact JSON report with ``--json`` (one line on stdout) or
``--out FILE``; the report names the backend, the index size, this machine's CPU and the commit.

Either point it at a running server (``--url``) or let it start one (``--index``, ``--backend``, [``--model``];
its HTTP threads default to the largest client count + 8, so every client's request reaches the app at once)
and stop it with SIGTERM afterwards.

  python scripts/load_test.py --index IDX --backend cpu --queries Q.tsv --clients 1 8 32 128 --duration 20
  python scripts/load_test.py --url http://127.0.0.1:8080 --endpoint answer --queries Q.tsv --clients 4 \\
      --duration 60 --options '{"k": 2, "max_new_tokens": 16}'

On the GPU, over the 21M-passage synthetic index of ``scripts/bench_gpu.py`` (S=../shared/data, D: the folder
of ``scripts/gpu_bench_inputs.py``; ``bench_gpu.py --synth dpr21m ... --workdir /tmp/synth`` leaves the index
and the mapped queries, /tmp/synth/dpr21m.msmarco.tsv, there already):

  python scripts/gpu_bench_inputs.py $D
  python scripts/synth_layout.py write /tmp/synth/dpr21m --docs 21000000 --workers 16
  python scripts/synth_layout.py queries /tmp/synth/dpr21m --reference $D/idx/ref \\
      --topics $S/msmarco-passage-queries/topics.msmarco-passage.dev-subset.txt --out /tmp/synth/msmarco.tsv
  python scripts/load_test.py --index /tmp/synth/dpr21m --backend gpu --queries /tmp/synth/msmarco.tsv \\
      --clients 1 8 32 128 --duration 20 --k 10 --out load_gpu_21m.json

Several server processes (``--workers N``: ``ragserve serve --workers``, each worker with its own copy of the
index on the GPU; check that N copies fit its memory), one query a request and 32 a request; ``--procs 4`` runs
the clients in 4 processes (default: a quarter of the cores):

  for W in 1 4 8; do for B in 1 32; do
    python scripts/load_test.py --index /tmp/synth/dpr21m --backend gpu --queries /tmp/synth/msmarco.tsv \\
        --workers $W --batch $B --procs 4 --clients 1 8 32 128 --duration 10 --warmup 2 --k 10 \\
        --out load_gpu_21m_w${W}_b${B}.json
  done; done
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time
from array import array
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402

MAX_CLIENTS = 256
MAX_DURATION_S = 600.0
PREWARM_SEARCHES = 20  # sequential searches before the first level: kernel compilation, caches
MAX_METRICS_TRIES = 200  # /metrics requests to reach every worker of a --workers server


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, int(-(-q * len(sorted_values) // 100)) - 1))
    return sorted_values[i]


# -- the clients (each process: threads with one keep-alive connection each) ----------------------------------
def _client(host: str, port: int, path: str, headers: dict, bodies: list[bytes], first: int, stride: int,
            go: float, warm_until: float, stop_at: float, lat: array, errors: dict, lock: threading.Lock) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    i = first
    mine = array("d")
    errs: dict[str, int] = {}
    while time.monotonic() < go:
        time.sleep(0.001)
    while True:
        t0 = time.monotonic()
        if t0 >= stop_at:
            break
        body = bodies[i % len(bodies)]
        i += stride
        try:
            conn.request("POST", path, body, headers)
            resp = conn.getresponse()
            resp.read()  # the whole body counts
            error = None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
        except (OSError, http.client.HTTPException) as e:
            error = type(e).__name__
            conn.close()  # reconnects on the next request
        if t0 >= warm_until:
            mine.append(time.monotonic() - t0)
            if error is not None:
                errs[error] = errs.get(error, 0) + 1
    conn.close()
    with lock:
        lat.extend(mine)
        for k, v in errs.items():
            errors[k] = errors.get(k, 0) + v


def _client_process(url: str, headers: dict, bodies: list[bytes], threads: int, first: int, stride: int,
                    start: mp.Barrier, warmup: float, duration: float, out: mp.Queue) -> None:
    u = urlsplit(url)
    lat, errors, lock = array("d"), {}, threading.Lock()
    start.wait()
    go = time.monotonic() + 0.05  # every thread is running before the first request
    warm_until, stop_at = go + warmup, go + warmup + duration
    ts = [threading.Thread(target=_client, args=(u.hostname, u.port, u.path, headers, bodies, first + t, stride, go,
                                                 warm_until, stop_at, lat, errors, lock))
          for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((lat.tobytes(), errors))


# -- the server's view ---------------------------------------------------------------------------------------
QUEUE_SERIES = ("ragserve_search_launch_queries_count", "ragserve_search_launch_queries_sum",
                "ragserve_search_launch_requests_sum", "ragserve_search_queue_wait_seconds_sum",
                "ragserve_search_queue_wait_seconds_count")


def queue_counters(url: str, headers: dict, workers: int = 1) -> dict[str, float]:
    """The search queue's cumulative counters from ``/metrics``, summed over the server's ``workers`` (each
    keeps its own; a new connection reaches any of them, so ask until each has answered). Empty if the server
    has none or some worker never answered."""
    seen: dict[str, dict[str, float]] = {}
    for _ in range(MAX_METRICS_TRIES if workers > 1 else 1):
        try:
            text = requests.get(url + "/metrics", headers=headers, timeout=30).text
        except requests.RequestException:
            return {}
        worker = re.search(r'^ragserve_info\{.*worker="(\d+)"', text, re.M)
        out = {}
        for name in QUEUE_SERIES:
            m = re.search(rf"^{name} (\S+)$", text, re.M)
            if m:
                out[name] = float(m.group(1))
        seen[worker.group(1) if worker else "1"] = out
        if len(seen) == workers:
            return {name: sum(w.get(name, 0.0) for w in seen.values()) for name in QUEUE_SERIES
                    if any(name in w for w in seen.values())}
    return {}


def queue_summary(before: dict, after: dict) -> dict:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in QUEUE_SERIES}
    launches = d["ragserve_search_launch_queries_count"]
    waits = d["ragserve_search_queue_wait_seconds_count"]

    def per(total: str, n: float, scale: float = 1.0, digits: int = 2) -> float | None:
        return round(d[total] / n * scale, digits) if n else None

    return {"launches": int(launches),
            "queries_per_launch": per("ragserve_search_launch_queries_sum", launches),
            "requests_per_launch": per("ragserve_search_launch_requests_sum", launches),
            "queue_wait_ms_mean": per("ragserve_search_queue_wait_seconds_sum", waits, 1e3, 3)}


# -- one level -----------------------------------------------------------------------------------------------
def run_level(url: str, endpoint: str, headers: dict, bodies: list[bytes], queries_per_request: int, clients: int,
              procs: int, warmup: float, duration: float, server_workers: int = 1) -> dict:
    ctx = mp.get_context("spawn")
    procs = max(1, min(procs, clients))
    start, out = ctx.Barrier(procs + 1), ctx.Queue()
    shares = [clients // procs + (p < clients % procs) for p in range(procs)]
    firsts = [sum(shares[:p]) for p in range(procs)]
    workers = [ctx.Process(target=_client_process, args=(f"{url}/v1/{endpoint}", headers, bodies, shares[p],
                                                         firsts[p], clients, start, warmup, duration, out),
                           daemon=True)
               for p in range(procs)]
    for w in workers:
        w.start()
    start.wait(120)
    time.sleep(0.05 + warmup)
    before = queue_counters(url, headers, server_workers)
    time.sleep(duration)
    after = queue_counters(url, headers, server_workers)
    lat, errors = array("d"), {}
    for _ in workers:
        raw, errs = out.get(timeout=duration + 300)
        lat.frombytes(raw)
        for k, v in errs.items():
            errors[k] = errors.get(k, 0) + v
    for w in workers:
        w.join(30)
    lat_s = sorted(lat)
    ms = lambda s: round(s * 1000, 3)  # noqa: E731
    n = len(lat_s)
    level = {"clients": clients, "seconds": duration, "requests": n, "queries": n * queries_per_request,
             "errors": sum(errors.values()), "error_kinds": errors,
             "requests_per_s": round(n / duration, 1), "queries_per_s": round(n * queries_per_request / duration, 1),
             "p50_ms": ms(percentile(lat_s, 50)), "p90_ms": ms(percentile(lat_s, 90)),
             "p99_ms": ms(percentile(lat_s, 99)), "max_ms": ms(lat_s[-1]) if n else None,
             "mean_ms": ms(sum(lat_s) / n) if n else None}
    if before and after:
        level["server_queue"] = queue_summary(before, after)
    return level


# -- setup ---------------------------------------------------------------------------------------------------
def start_server(serve_args: list[str], timeout: float = 900.0) -> tuple[subprocess.Popen, str]:
    """``ragserve serve --port 0 ...`` of this checkout; returns the process and its URL once it is ready."""
    proc = subprocess.Popen([sys.executable, "-m", "ragserve", "serve", "--host", "127.0.0.1", "--port", "0",
                             *serve_args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    url = None
    for line in proc.stderr:
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            url = m.group(1)
            break
        sys.stderr.write(line)  # why it did not start, if it does not
    if url is None:
        proc.wait()
        raise SystemExit("load_test: the server did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep the pipe drained
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if requests.get(url + "/readyz", timeout=5).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("load_test: the server never became ready")


def request_bodies(args: argparse.Namespace) -> list[bytes]:
    from ragserve.topics import read_queries

    texts = [q.text[:args.truncate] if args.truncate else q.text for q in read_queries(args.queries)]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise SystemExit(f"load_test: no queries in {args.queries}")
    if args.endpoint == "search":
        if args.batch == 1:
            bodies = [{"query": t, "k": args.k} for t in texts]
        else:
            bodies = [{"queries": [texts[(i + j) % len(texts)] for j in range(args.batch)], "k": args.k}
                      for i in range(0, len(texts), args.batch)]
    else:
        options = json.loads(args.options) if args.options else {}
        bodies = [{"question": t, "method": args.method, "options": options} for t in texts]
    return [json.dumps(b).encode() for b in bodies]


def machine() -> dict:
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "commit": commit}


def table(report: dict) -> str:
    rows = [f"{'clients':>7} {'requests':>9} {'req/s':>9} {'queries/s':>10} {'p50 ms':>9} {'p90 ms':>9} "
            f"{'p99 ms':>9} {'errors':>6} {'q/launch':>8} {'wait ms':>8}"]
    for lv in report["levels"]:
        sq = lv.get("server_queue", {})
        qpl = sq.get("queries_per_launch")
        wait = sq.get("queue_wait_ms_mean")
        rows.append(f"{lv['clients']:>7} {lv['requests']:>9} {lv['requests_per_s']:>9.1f} {lv['queries_per_s']:>10.1f} "
                    f"{lv['p50_ms']:>9.2f} {lv['p90_ms']:>9.2f} {lv['p99_ms']:>9.2f} {lv['errors']:>6} "
                    f"{'-' if qpl is None else f'{qpl:.2f}':>8} {'-' if wait is None else f'{wait:.3f}':>8}")
    m = report["meta"]
    rows.append(f"backend {m['backend']}, {m.get('workers', 1)} worker(s), {m['index_docs']} docs, {m['endpoint']} "
                f"k={m['k']} batch={m['batch']}; "
                f"clients on {m['cpu']} ({m['cores']} cores), commit {m['commit']}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server on this machine, e.g. http://127.0.0.1:8080")
    target.add_argument("--index", help="start `ragserve serve --index INDEX` for the test")
    p.add_argument("--backend", help="with --index: the server's backend (cpu, gpu, fpga-sim, ...)")
    p.add_argument("--model", help="with --index: the generator model (needed for --endpoint answer)")
    p.add_argument("--server-threads", type=int, default=0,
                   help="with --index: HTTP threads of the server (default: the largest client count + 8)")
    p.add_argument("--workers", type=int, default=1,
                   help="with --index: server processes (`ragserve serve --workers`, default 1)")
    p.add_argument("--serve-arg", action="append", default=[], help="extra `ragserve serve` argument (repeatable)")
    p.add_argument("--endpoint", choices=("search", "answer"), default="search")
    p.add_argument("--queries", required=True, help="queries or questions: any format ragserve.topics reads")
    p.add_argument("--truncate", type=int, default=0, help="cut each query to this many characters (0: keep)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128], help="client counts, one level each")
    p.add_argument("--procs", type=int, default=0,
                   help="client processes (default: a quarter of the cores, at least 1)")
    p.add_argument("--warmup", type=float, default=2.0, help="unrecorded seconds at the start of each level")
    p.add_argument("--duration", type=float, default=20.0, help="recorded seconds per level (at most 600)")
    p.add_argument("--k", type=int, default=10, help="search: hits per query")
    p.add_argument("--batch", type=int, default=1, help="search: queries per request")
    p.add_argument("--method", default="single", help="answer: RAG method")
    p.add_argument("--options", help="answer: JSON object of method options")
    p.add_argument("--api-key", default=os.environ.get("RAGSERVE_API_KEY"))
    p.add_argument("--json", action="store_true", help="print the report as one JSON line (after the table)")
    p.add_argument("--out", type=Path, help="write the report (compact JSON) here")
    args = p.parse_args(argv)
    if not all(1 <= c <= MAX_CLIENTS for c in args.clients) or not 0 < args.duration <= MAX_DURATION_S \
            or args.warmup < 0 or args.batch < 1 or args.procs < 0:
        p.error(f"need 1..{MAX_CLIENTS} clients, 0 < duration <= {MAX_DURATION_S} s, warmup >= 0, batch >= 1")
    if args.endpoint == "answer" and args.batch != 1:
        p.error("--batch applies to searches only")

    bodies = request_bodies(args)
    proc, url = None, args.url
    if args.index:
        threads = args.server_threads or max(args.clients) + 8
        serve_args = ["--index", args.index, "--threads", str(threads), "--workers", str(args.workers),
                      *(["--backend", args.backend] if args.backend else []),
                      *(["--model", args.model] if args.model else []), *args.serve_arg]
        proc, url = start_server(serve_args)
    url = url.rstrip("/")
    from ragserve.server.auth import is_loopback_host

    if not is_loopback_host(urlsplit(url).hostname or ""):
        raise SystemExit(f"load_test: refusing non-loopback target {url!r}; only this machine may be loaded")
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    try:
        info = requests.get(url + "/v1/info", headers=headers, timeout=30).json()
        workers = info.get("server", {}).get("workers", 1)
        for body in bodies[:PREWARM_SEARCHES] if args.endpoint == "search" else []:
            requests.post(f"{url}/v1/search", data=body, headers=headers, timeout=600)
        procs = args.procs or max(1, (os.cpu_count() or 1) // 4)
        levels = []
        for clients in args.clients:
            levels.append(run_level(url, args.endpoint, headers, bodies,
                                    args.batch if args.endpoint == "search" else 1, clients, procs,
                                    args.warmup, args.duration, workers))
    finally:
        server_rc = None
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            server_rc = proc.wait(120)
    backend = info.get("backend", {})
    report = {"meta": {"url": url, "endpoint": args.endpoint, "backend": backend.get("name"),
                       "queue": backend.get("queue"), "workers": workers,
                       "index_docs": info.get("index", {}).get("manifest", {}).get("stats", {}).get("num_docs"),
                       "model": (info.get("model") or {}).get("name"),
                       "k": args.k, "batch": args.batch, "warmup_s": args.warmup, "duration_s": args.duration,
                       "client_procs": procs, **machine(), "argv": sys.argv,
                       "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
              "levels": levels, "requests": sum(lv["requests"] for lv in levels),
              "errors": sum(lv["errors"] for lv in levels)}
    if server_rc is not None:
        report["server_exit"] = server_rc
    print(table(report), flush=True)
    text = json.dumps(stamp(report), separators=(",", ":"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.json:
        print(text)
    return 0 if report["errors"] == 0 and all(lv["requests"] > 0 for lv in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
