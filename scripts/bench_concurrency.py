"""Concurrent answers: answers/s and p50/p99 latency at 1, 4, 8 and 16 clients, through the server's answer path
(``AnswerService``: the generation queue's worker threads, one decode session per request, the batcher stepping
every answer in flight together), with a chosen decode engine.

    python scripts/bench_concurrency.py --model /work/models/gemma-270m --engine reference --out conc.json
    python scripts/bench_concurrency.py --model DIR --engine fast --clients 1,8 --answers 16

The index is the demo's (corpora/demo, 206 Wikipedia pages, built into --workdir on first use); the questions are
about its pages. Each client is a closed loop: it asks its next question as soon as its answer arrives; every
level answers the same questions (``--answers`` of them, at least one per client), after one untimed warm-up
answer (and, where the engine keeps a prefix cache, the cache emptied and one untimed answer to another question
before each level: the exemplars' chunks are cached as on a running server, but no level finds the whole prompts of
the questions an earlier level asked). ``mean_batch`` is the generation steps the engine steps advanced over the steps run; ``engine_s`` and
``batcher_host_s`` the batcher thread's seconds in the engine and on its own work (token choice, stop checks).
Greedy answers are the same at every level (checked: a level whose answers differ from one client's is an error).

``per_answer`` says where an answer's time goes: prompt positions prefilled (``reused``: copied from the engine's
prefix cache) and the batcher's seconds prefilling them, decode steps and their seconds (the batcher's seconds over
the level's answers: shared work divided out), and each request's mean seconds queued, retrieving and generating
(generating includes waiting for the batcher). ``floor`` is a true lower bound on the seconds an answer costs at
any concurrency: the FLOPs it must compute (the prefilled positions' linear layers and causal attention within the
sliding windows, the LM head once a prefill call and once a decode step) over torch's measured f32 matmul rate, the best
of runs on ``--floor-threads`` threads and on one, before and after the levels; ``floor.max_speedup`` is one client's seconds an answer over
that floor, the most any number of clients could gain on this machine.
"""
from __future__ import annotations

import argparse
import hashlib
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
WARM_UP = "What is the capital of France?"  # asked before each level, never within one
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


def matmul_flops(threads: int, repeats: int = 3) -> float:
    """torch's f32 matmul rate on ``threads`` threads (FLOP/s), the best of a few runs of prefill-shaped products
    (a 128-row chunk through a 640 x 2048 projection, as gemma-3-270m's MLP)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(128, 640), torch.randn(640, 2048)
        best = 0.0
        for _ in range(repeats):
            a @ b
            t0 = time.perf_counter()
            for _ in range(50):
                a @ b
            best = max(best, 2 * 128 * 640 * 2048 * 50 / (time.perf_counter() - t0))
        return best
    finally:
        torch.set_num_threads(previous)


def answer_flops(cfg, computed: float, context: float, prefills: float, steps: float) -> float:
    """FLOPs an answer needs at least: ``computed`` prompt positions (at mean position ``context``) through every
    linear layer and their causal attention (sliding layers over their window only), ``steps`` decode steps the
    same way, and the LM head once for each of ``prefills`` prefill calls and each decode step."""
    hidden, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = hidden * heads * hd * 2 + hidden * kv * hd * 2 + 3 * hidden * inter
    linear = 2 * per_layer * cfg.num_hidden_layers
    window = int(getattr(cfg, "sliding_window", 0) or 0)
    kinds = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    attend = sum(4 * heads * hd * (min(context, window) if k == "sliding_attention" and window else context)
                 for k in kinds)
    head = 2 * hidden * cfg.vocab_size
    return (computed + steps) * (linear + attend) + (prefills + steps) * head


def run_level(answers, clients: int, questions: list[str], options: dict, method: str) -> dict:
    from ragserve.server.validation import AnswerRequest

    latencies: list[float] = [0.0] * len(questions)
    timings: list[dict] = []
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
                timings.append(out["timing"])
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
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after if k != "engine"}
    n = len(questions)

    def mean(key: str) -> float:
        return round(sum(t.get(key, 0.0) for t in timings) / max(1, len(timings)), 3)

    per_answer = {
        "prefill_positions": round(d.get("prefill_tokens", 0) / n, 1),
        "prefill_reused": round(d.get("prefill_reused", 0) / n, 1),
        "prefill_s": round(d.get("prefill_s", 0.0) / n, 3),
        "decode_steps": round(d["generation_steps"] / n, 1),
        "decode_s": round((d["engine_s"] - d.get("prefill_s", 0.0)) / n, 3),
        "host_s": round(d["host_s"] / n, 3),
        "queue_s": mean("queue"),
        "retrieval_s": round(mean("prepare") + mean("relevancy") + mean("retrieval"), 3),
        "generation_s": mean("apply"),
    }
    return {"clients": clients, "answers": len(questions), "wall_s": round(wall, 3),
            "answers_per_s": round(len(questions) / wall, 4), "p50_s": round(percentile(latencies, 50), 3),
            "p99_s": round(percentile(latencies, 99), 3),
            "mean_batch": round((after["generation_steps"] - before["generation_steps"]) / steps, 2) if steps else 0,
            "engine_s": round(after["engine_s"] - before["engine_s"], 3),
            "batcher_host_s": round(after["host_s"] - before["host_s"], 3),
            "per_answer": per_answer, "load_avg": round(os.getloadavg()[0], 2), "errors": errors,
            "outputs": results}


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
    ap.add_argument("--prefill-lanes", type=int, default=1,
                    help="prompts prefilled at once, on threads of their own (BatchSettings; default 1)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--exemplars", help="exemplar file (default: one short exemplar without passages)")
    ap.add_argument("--floor-threads", type=int, default=2, help="threads of the matmul rate of the floor "
                                                                 "(default 2: the dev VM's cores)")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    if not levels or min(levels) < 1 or args.answers < 1:
        print("bench_concurrency: --clients and --answers must be positive", file=sys.stderr)
        return 2

    import torch

    from ragserve.rag.batcher import BatchSettings
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
    if args.exemplars:
        exemplars = Path(args.exemplars)
    most = max(levels)
    cfg = ServerConfig(max_pending_answers=most, concurrent_answers=most, request_timeout_s=3600)
    searcher = Searcher(index, backend="cpu")
    answers = AnswerService(args.model, searcher, cfg, ServerMetrics(), device=args.device, exemplars=str(exemplars),
                            load_generator=lambda model, device: Generator(
                                model, device=device, engine=args.engine, threads=args.threads, max_slots=most,
                                batch=BatchSettings(prefill_lanes=args.prefill_lanes)))
    if not answers.wait_loaded():
        print(f"bench_concurrency: {answers.status()['error']}", file=sys.stderr)
        return 2
    options = {"k": args.k, "max_new_tokens": args.max_new_tokens}
    rates = [matmul_flops(args.floor_threads), matmul_flops(1)]  # a busy box can run 2 threads slower than 1
    run_level(answers, 1, [WARM_UP], options, args.method)  # warm-up: kernels compile, caches fill
    rows = []
    reference = None
    cache = getattr(answers.generator.engine, "prefix_cache", None)
    for clients in levels:
        if cache is not None:
            cache.clear()
            run_level(answers, 1, [WARM_UP], options, args.method)
        questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(max(args.answers, clients))]
        row = run_level(answers, clients, questions, options, args.method)
        outputs = row.pop("outputs")
        row["outputs_sha1"] = hashlib.sha1(json.dumps(outputs).encode()).hexdigest()[:12]  # across runs and commits
        if reference is None:
            reference = dict(zip(questions, outputs))
        elif any(reference.get(q, o) != o for q, o in zip(questions, outputs)):
            row["errors"].append("answers differ from the first level's")
        rows.append(row)
        print(f"{clients:>3} clients  {row['answers_per_s']:7.3f} answers/s  p50 {row['p50_s']:6.2f} s  "
              f"p99 {row['p99_s']:6.2f} s  mean batch {row['mean_batch']:5.2f}"
              + (f"  ERRORS {row['errors'][:2]}" if row["errors"] else ""), flush=True)
    rates += [matmul_flops(args.floor_threads), matmul_flops(1)]
    one = next((r for r in rows if r["clients"] == 1), None)
    if one:
        for r in rows:
            r["speedup_vs_1"] = round(r["answers_per_s"] / one["answers_per_s"], 2)
            r["p99_over_1_client_p50"] = round(r["p99_s"] / one["p50_s"], 2)
    floor = None
    if one:
        pa = one["per_answer"]
        computed = pa["prefill_positions"] - pa["prefill_reused"]
        # the computed positions' mean context is at least half the prompt: a lower bound
        prefill = answer_flops(answers.generator.model.config, computed, pa["prefill_positions"] / 2, 1, 0)
        decode = answer_flops(answers.generator.model.config, 0, pa["prefill_positions"], 0, pa["decode_steps"])
        rate = max(rates)
        floor = {"matmul_gflops": round(rate / 1e9, 1), "matmul_gflops_runs": [round(r / 1e9, 1) for r in rates],
                 "threads": args.floor_threads, "prefill_gflop": round(prefill / 1e9, 1),
                 "decode_gflop": round(decode / 1e9, 1), "prefill_floor_s": round(prefill / rate, 3),
                 "answer_floor_s": round((prefill + decode) / rate, 3),
                 "one_client_s": round(1 / one["answers_per_s"], 3),
                 "max_speedup": round(1 / one["answers_per_s"] / ((prefill + decode) / rate), 2)}
        print(f"floor: {floor['prefill_gflop']} GFLOP prefill + {floor['decode_gflop']} GFLOP decode an answer at "
              f"{floor['matmul_gflops']} GFLOP/s ({args.floor_threads} threads) = {floor['answer_floor_s']} s; one "
              f"client takes {floor['one_client_s']} s: at most {floor['max_speedup']}x at any concurrency", flush=True)
    answers.close()
    searcher.close()
    out = {"bench": "concurrency", "model": args.model, "engine": answers.generator.batching["engine"],
           "method": args.method, "options": options, "exemplars": args.exemplars or "one short exemplar",
           "engine_describe": getattr(answers.generator.engine, "describe", lambda: None)(), "floor": floor, "torch_threads": args.threads, "prefill_lanes": args.prefill_lanes, "device": args.device,
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
