#!/usr/bin/env python3
"""Bounded load test of a ``ragserve serve`` on this machine (loopback only).

N client threads, each with its own keep-alive connection, send requests back to back for a fixed time
(or request count) and record every latency. Reports requests/s, latency percentiles and errors (any
non-2xx status or connection failure). Either point it at a running server (``--url``) or let it start one
(``--index`` [``--model``], passed to ``ragserve serve``) and stop it with SIGTERM afterwards.

  python scripts/load_test.py --index IDX --queries Q.tsv --clients 32 --duration 60
  python scripts/load_test.py --index IDX --model LM --endpoint answer --queries Q.tsv --clients 4 \
      --duration 60 --options '{"k": 2, "max_new_tokens": 16}'
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import requests

MAX_CLIENTS = 256
MAX_DURATION_S = 600.0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, int(-(-q * len(sorted_values) // 100)) - 1))
    return sorted_values[i]


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}

    def add(self, seconds: float, error: str | None) -> None:
        with self.lock:
            self.latencies.append(seconds)
            if error is not None:
                self.errors[error] = self.errors.get(error, 0) + 1


def client(url: str, headers: dict, bodies: list[dict], start: int, stride: int, stop_at: float,
           budget: list[int], budget_lock: threading.Lock, stats: Stats) -> None:
    session = requests.Session()
    i = start
    while time.monotonic() < stop_at:
        with budget_lock:
            if budget[0] <= 0:
                return
            budget[0] -= 1
        body = bodies[i % len(bodies)]
        i += stride
        t0 = time.perf_counter()
        try:
            r = session.post(url, json=body, headers=headers, timeout=120)
            r.content  # the whole body counts
            error = None if 200 <= r.status_code < 300 else f"HTTP {r.status_code}"
        except requests.RequestException as e:
            error = type(e).__name__
        stats.add(time.perf_counter() - t0, error)
    session.close()


def run_load(url: str, endpoint: str, bodies: list[dict], clients: int, duration: float, max_requests: int,
             api_key: str | None = None) -> dict:
    """Drive ``clients`` threads against ``url`` + ``/v1/<endpoint>``; returns the summary."""
    host = urlsplit(url).hostname or ""
    from ragserve.server.auth import is_loopback_host
    if not is_loopback_host(host):
        raise SystemExit(f"load_test: refusing non-loopback target {host!r}; only this machine may be loaded")
    if not 1 <= clients <= MAX_CLIENTS or not 0 < duration <= MAX_DURATION_S or max_requests < 1:
        raise SystemExit(f"load_test: need 1..{MAX_CLIENTS} clients, 0 < duration <= {MAX_DURATION_S} s, "
                         "max requests >= 1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    stats = Stats()
    budget, budget_lock = [max_requests], threading.Lock()
    t0 = time.monotonic()
    stop_at = t0 + duration
    threads = [threading.Thread(target=client, args=(f"{url}/v1/{endpoint}", headers, bodies, c, clients, stop_at,
                                                     budget, budget_lock, stats), daemon=True)
               for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    lat = sorted(stats.latencies)
    ms = lambda s: round(s * 1000, 2)  # noqa: E731
    return {"endpoint": endpoint, "clients": clients, "seconds": round(elapsed, 2), "requests": len(lat),
            "errors": sum(stats.errors.values()), "error_kinds": stats.errors,
            "requests_per_s": round(len(lat) / elapsed, 1) if elapsed else 0.0,
            "p50_ms": ms(percentile(lat, 50)), "p90_ms": ms(percentile(lat, 90)), "p99_ms": ms(percentile(lat, 99)),
            "max_ms": ms(lat[-1]) if lat else None, "mean_ms": ms(sum(lat) / len(lat)) if lat else None}


def start_server(serve_args: list[str], timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    """``ragserve serve --port 0 ...``; returns the process and its URL once it is ready."""
    exe = Path(sys.executable).with_name("ragserve")
    proc = subprocess.Popen([str(exe), "serve", "--host", "127.0.0.1", "--port", "0", *serve_args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = None
    for line in proc.stderr:
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            url = m.group(1)
            break
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


def request_bodies(args: argparse.Namespace) -> list[dict]:
    from ragserve.topics import read_queries

    texts = [q.text[:args.truncate] if args.truncate else q.text for q in read_queries(args.queries)]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise SystemExit(f"load_test: no queries in {args.queries}")
    if args.endpoint == "search":
        return [{"query": t, "k": args.k} for t in texts]
    options = json.loads(args.options) if args.options else {}
    return [{"question": t, "method": args.method, "options": options} for t in texts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server on this machine, e.g. http://127.0.0.1:8080")
    target.add_argument("--index", help="start `ragserve serve --index INDEX` for the test")
    p.add_argument("--model", help="with --index: the generator model (needed for --endpoint answer)")
    p.add_argument("--serve-arg", action="append", default=[], help="extra `ragserve serve` argument (repeatable)")
    p.add_argument("--endpoint", choices=("search", "answer"), default="search")
    p.add_argument("--queries", required=True, help="queries or questions: any format ragserve.topics reads")
    p.add_argument("--truncate", type=int, default=0, help="cut each query to this many characters (0: keep)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=60.0, help="seconds (at most 600)")
    p.add_argument("--max-requests", type=int, default=10_000_000, help="stop after this many requests")
    p.add_argument("--k", type=int, default=10, help="search: hits per query")
    p.add_argument("--method", default="single", help="answer: RAG method")
    p.add_argument("--options", help="answer: JSON object of method options")
    p.add_argument("--api-key", default=os.environ.get("RAGSERVE_API_KEY"))
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = p.parse_args(argv)

    bodies = request_bodies(args)
    proc = None
    url = args.url
    if args.index:
        serve_args = ["--index", args.index, *(["--model", args.model] if args.model else []), *args.serve_arg]
        proc, url = start_server(serve_args)
    try:
        summary = run_load(url.rstrip("/"), args.endpoint, bodies, args.clients, args.duration, args.max_requests,
                           args.api_key)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            server_rc = proc.wait(60)
    if proc is not None:
        summary["server_exit"] = server_rc
    if args.json:
        print(json.dumps(summary))
    else:
        for k, v in summary.items():
            print(f"{k:>16}: {v}")
    return 0 if summary["errors"] == 0 and summary["requests"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
