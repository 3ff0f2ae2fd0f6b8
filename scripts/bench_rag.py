"""Where the time goes in RAG: every method over HotpotQA dev questions with a tiny random Llama, per
retrieval backend, split into the memory-pipeline stages prepare / relevancy / retrieval / apply.

    python scripts/bench_rag.py --data dev_subsampled.jsonl --limit 100 --backends cpu,gpu --device cuda

Self-contained: it builds the closed-corpus BM25 index of the file's paragraphs (all questions), a tiny
2-layer Llama (hidden 64) and a tiny BERT cross-encoder (for two-stage) with tokenizers trained on the same
text, in --workdir (a temporary directory by default). Each (backend, method) pair first answers
--warmup questions untimed (CUDA context, numba compilation), then the timed questions. Prints one table row
per pair; --json writes the summaries. With a random model the answers are noise: the figures are the
cost of the loops, not answer quality.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a bare checkout

from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "hotpotqa-dev500-ircot" / "dev_subsampled.jsonl"
ALL_METHODS = ("none", "single", "fixed-sentence", "fixed-length", "flare", "dragin", "two-stage")
STAGES = ("prepare", "relevancy", "retrieval", "apply")


def build_artefacts(examples, work: Path) -> tuple[Path, Path, Path]:
    from ragserve.rag.corpus import build_dataset_index
    from ragserve.rag.prompts import PROMPTS_DIR
    from tools.tiny_models import build_tiny_cross_encoder, build_tiny_lm

    index, lm, ce = work / "index", work / "tiny-llama", work / "tiny-ce"
    if not (index / "manifest.json").exists():
        build_dataset_index(examples, index, overwrite=True)
    texts = [e.question for e in examples] + [f"{p.title} {p.text}" for e in examples for p in e.paragraphs]
    texts += [f.read_text() for f in sorted(PROMPTS_DIR.glob("*.txt"))]
    if not (lm / "config.json").exists():
        build_tiny_lm(lm, texts)
    if not (ce / "config.json").exists():
        build_tiny_cross_encoder(ce, texts)
    return index, lm, ce


def environment(device: str) -> dict:
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_model(),
           "cpus": __import__("os").cpu_count(), "generator_device": device}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="HotpotQA dev (IRCoT JSONL or original JSON)")
    ap.add_argument("--limit", type=int, default=100, help="timed questions per (backend, method)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed questions first")
    ap.add_argument("--backends", default="cpu,gpu", help="comma-separated retrieval backends")
    ap.add_argument("--methods", default=",".join(ALL_METHODS))
    ap.add_argument("--device", default="auto", help="generator and reranker device")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--max-new-tokens", type=int, default=100, help="answer budget (DRAGIN's HotpotQA: 100)")
    ap.add_argument("--workdir", help="keep index and models here (reused when present)")
    ap.add_argument("--json", help="write the summaries here")
    args = ap.parse_args()

    from ragserve.rag.datasets import read_dataset
    from ragserve.rag.dragin import PUBLISHED
    from ragserve.rag.evaluate import evaluate, summarize
    from ragserve.rag.generator import Generator
    from ragserve.rag.methods import build_method
    from ragserve.rag.prompts import PromptBuilder, load_exemplars
    from ragserve.retrieval.rerank import CrossEncoder, RerankingSearcher
    from ragserve.kernels.contract import SearchError
    from ragserve.retrieval.searcher import Searcher

    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(ALL_METHODS)
    if unknown:
        ap.error(f"unknown methods: {', '.join(sorted(unknown))}")
    examples = read_dataset(args.data)
    need = args.warmup + args.limit
    if len(examples) < need:
        ap.error(f"{args.data} has {len(examples)} questions; --warmup + --limit needs {need}")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-rag-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    index, lm, ce = build_artefacts(examples, work)
    print(f"# artefacts in {work} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)

    generator = Generator(str(lm), device=args.device, threads=args.threads)
    reranker = CrossEncoder(str(ce), device=generator.device)
    prompts = PromptBuilder(load_exemplars("multihop.txt"))
    hp = PUBLISHED["hotpotqa"]
    env = environment(generator.device)
    results = []
    for backend in [b for b in args.backends.split(",") if b]:
        try:
            searcher = Searcher(index, backend=backend)
        except (SearchError, RuntimeError) as e:
            print(f"# backend {backend} unavailable here: {e}", file=sys.stderr)
            continue
        for name in methods:
            retriever = RerankingSearcher(searcher, reranker, depth=100) if name == "two-stage" else searcher
            method = build_method(name, generator, prompts, retriever, k=3, max_new_tokens=args.max_new_tokens,
                                  threshold=hp["threshold"], keep=hp["keep"])
            for ex in examples[:args.warmup]:
                method.answer(ex.question)
            out = work / f"rows-{backend}-{name}.jsonl"
            out.unlink(missing_ok=True)
            start = time.perf_counter()
            rows = evaluate(examples[args.warmup:need], method, out, {"method": name, "dataset": Path(args.data).name})
            wall = time.perf_counter() - start
            s = summarize(rows)
            s.update(backend=searcher.backend_name, method=name, wall_seconds=wall)
            results.append(s)
            print(f"# {backend} {name}: {wall:.1f} s", file=sys.stderr, flush=True)
        searcher.close()

    head = ("backend", "method", "n", "ret/q", "tok/q", "s/q", "prep ms/q", "rel ms/q", "retr ms/q", "apply ms/q",
            "prep%", "rel%", "retr%", "apply%", "retrieval share%")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in results:
        n = s["questions"]
        st, sh = s["stage_seconds"], s["stage_shares"]
        cells = [s["backend"], s["method"], str(n), f"{s['retrievals_per_question']:.2f}",
                 f"{s['tokens_per_question']:.1f}", f"{s['seconds_per_question']:.3f}",
                 *(f"{1000 * st[k] / n:.2f}" for k in STAGES), *(f"{100 * sh[k]:.1f}" for k in STAGES),
                 f"{100 * s['retrieval_share']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    print(f"# {json.dumps(env)}")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(stamp({"environment": env, "args": vars(args), "results": results}),
                                              indent=2))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
