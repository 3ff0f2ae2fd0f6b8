"""Concurrent answers: answers/s and p50/p99 latency at 1, 4, 8 and 16 clients, through the server's answer path
(``AnswerService``: the generation queue's worker threads, one decode session per request, the batcher stepping
every answer in flight together), with a chosen decode engine.

    python scripts/bench_concurrency.py --model /work/models/gemma-270m --engine reference --out conc.json
    python scripts/bench_concurrency.py --model DIR --engine fast --clients 1,8 --answers 16

The index is the demo's (corpora/demo, 206 Wikipedia pages, built into --workdir on first use); the questions are
about its pages. Each client is a closed loop: it asks its next question as soon as its answer arrives; every
level answers the same questions (``--answers`` of them, at least one per client), after one untimed warm-up
answer. ``mean_batch`` is the generation steps the engine steps advanced over the steps run; ``engine_s`` and
``batcher_host_s`` the batcher thread's seconds in the engine and on its own work (token choice, stop checks).
Greedy answers are the same at every level (checked: a level whose answers differ from one client's is an error).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a bare checkout

import numpy as np  # noqa: E402

from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402

QUESTIONS = [
    "Who wrote the novel Atlas Shrugged?", "Where was Aristotle born?", "What is albedo?",
    "Who was Achilles' mother?", "When did Alabama become a state?", "Who composed An American in Paris?",
    "What is the capital of Afghanistan?", "Which languages are Afro-Asiatic?", "Who founded anarcho-capitalism?",
    "What does International Atomic Time measure?", "When was Abraham Lincoln born?",
    "What is the axiom of choice?", "Who was Alexander the Great's teacher?", "What is altruism?",
    "Where is Anchorage, Alaska?", "What is the Academy Award for Best Production Design?",
]
EXEMPLAR = ("Question: Who wrote Pride and Prejudice?\nAnswer: Pride and Prejudice was written by Jane Austen. "
            "So the answer is Jane Austen.\n")


def demo_index(work: Path) -> Path:
    out = work / "demo-index"
    if not (out / "manifest.json").exists():
        files = sorted(str(p) for p in (REPO / "corpora" / "demo").glob("*.xml*.bz2"))
        subprocess.run([sys.executable, "-m", "ragserve", "index", *files, "--format", "mediawiki", "--out",
                        str(out), "--overwrite"], check=True, cwd=REPO)
    return out


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def run_level(answers, clients: int, questions: list[str], options: dict, method: str) -> dict:
    from ragserve.server.validation import AnswerRequest

    latencies: list[float] = [0.0] * len(questions)
    results: list[str | None] = [None] * len(questions)
    errors: list[str] = []
    start = threading.Barrier(clients)

    def client(c: int) -> None:
        start.wait()
        for i in range(c, len(questions), clients):
            t0 = time.perf_counter()
            try:
                out = answers.answer(AnswerRequest(question=questions[i], method=method, options=options),
                                     time.monotonic() + 3600)
                results[i] = out["output"]
            except Exception as e:  # reported, not raised: the other levels still run
                errors.append(f"{type(e).__name__}: {e}")
            latencies[i] = time.perf_counter() - t0

    g = answers.generator
    before = g.batching
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = g.batching
    steps = after["steps"] - before["steps"]
    return {"clients": clients, "answers": len(questions), "wall_s": round(wall, 3),
            "answers_per_s": round(len(questions) / wall, 4), "p50_s": round(percentile(latencies, 50), 3),
            "p99_s": round(percentile(latencies, 99), 3),
            "mean_batch": round((after["generation_steps"] - before["generation_steps"]) / steps, 2) if steps else 0,
            "engine_s": round(after["engine_s"] - before["engine_s"], 3),
            "batcher_host_s": round(after["host_s"] - before["host_s"], 3),
            "errors": errors, "outputs": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="generator directory (e.g. /work/models/gemma-270m)")
    ap.add_argument("--engine", default="auto", help="decode engine: auto, reference or fast (default auto)")
    ap.add_argument("--index", help="index directory (default: the demo's, built in --workdir)")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "ragserve-bench-concurrency"))
    ap.add_argument("--clients", default="1,4,8,16", help="client counts (default 1,4,8,16)")
    ap.add_argument("--answers", type=int, default=16, help="answers per level, at least one per client (default 16)")
    ap.add_argument("--method", default="single", help="RAG method (default single)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="answer budget (default 32)")
    ap.add_argument("--k", type=int, default=2, help="passages per retrieval (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    if not levels or min(levels) < 1 or args.answers < 1:
        print("bench_concurrency: --clients and --answers must be positive", file=sys.stderr)
        return 2

    import torch

    from ragserve.rag.generator import Generator
    from ragserve.retrieval.searcher import Searcher
    from ragserve.server.answering import AnswerService
    from ragserve.server.config import ServerConfig
    from ragserve.server.metrics import ServerMetrics

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    index = Path(args.index) if args.index else demo_index(work)
    exemplars = work / "one-exemplar.txt"
    exemplars.write_text(EXEMPLAR)
    most = max(levels)
    cfg = ServerConfig(max_pending_answers=most, concurrent_answers=most, request_timeout_s=3600)
    searcher = Searcher(index, backend="cpu")
    answers = AnswerService(args.model, searcher, cfg, ServerMetrics(), device=args.device, exemplars=str(exemplars),
                            load_generator=lambda model, device: Generator(model, device=device, engine=args.engine,
                                                                           threads=args.threads, max_slots=most))
    if not answers.wait_loaded():
        print(f"bench_concurrency: {answers.status()['error']}", file=sys.stderr)
        return 2
    options = {"k": args.k, "max_new_tokens": args.max_new_tokens}
    run_level(answers, 1, QUESTIONS[:1], options, args.method)  # warm-up: kernels compile, caches fill
    rows = []
    reference = None
    for clients in levels:
        questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(max(args.answers, clients))]
        row = run_level(answers, clients, questions, options, args.method)
        outputs = row.pop("outputs")
        if reference is None:
            reference = dict(zip(questions, outputs))
        elif any(reference.get(q, o) != o for q, o in zip(questions, outputs)):
            row["errors"].append("answers differ from the first level's")
        rows.append(row)
        print(f"{clients:>3} clients  {row['answers_per_s']:7.3f} answers/s  p50 {row['p50_s']:6.2f} s  "
              f"p99 {row['p99_s']:6.2f} s  mean batch {row['mean_batch']:5.2f}"
              + (f"  ERRORS {row['errors'][:2]}" if row["errors"] else ""), flush=True)
    one = next((r for r in rows if r["clients"] == 1), None)
    if one:
        for r in rows:
            r["speedup_vs_1"] = round(r["answers_per_s"] / one["answers_per_s"], 2)
            r["p99_over_1_client_p50"] = round(r["p99_s"] / one["p50_s"], 2)
    answers.close()
    searcher.close()
    out = {"bench": "concurrency", "model": args.model, "engine": answers.generator.batching["engine"],
           "method": args.method, "options": options, "torch_threads": args.threads, "device": args.device,
           "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
                       "torch": torch.__version__},
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=REPO).stdout.strip(),
           "levels": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(stamp(out), separators=(",", ":")) + "\n")
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
