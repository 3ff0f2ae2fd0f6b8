"""The real-generator evaluation table from ``ragserve eval`` outputs: every method on the SAME questions (the
questions every given run has answered, in dataset order), as a markdown table and one compact JSON of the
per-question rows (id, prediction, EM, F1, supporting-passage recall, retrievals, generated tokens, seconds).

    python scripts/rag_real_table.py --runs oracle=dev-oracle.jsonl none=dev-none.jsonl ... \\
        --dataset hotpotqa-dev500-ircot --json benchmarks/raw/rag_real/hotpotqa_dev.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragserve.rag.evaluate import summarize  # noqa: E402

KEEP = ("id", "prediction", "em", "f1", "support_recall", "retrievals", "tokens", "seconds")


def load(path: str) -> list[dict]:
    return [json.loads(l) for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]


def common_rows(runs: dict[str, list[dict]]) -> tuple[list[str], dict[str, list[dict]]]:
    """The ids every run answered, in the first run's order, and each run's rows for them."""
    ids = [r["id"] for r in next(iter(runs.values()))]
    shared = set.intersection(*({r["id"] for r in rows} for rows in runs.values()))
    ids = [i for i in ids if i in shared]
    return ids, {m: [next(r for r in rows if r["id"] == i) for i in ids] for m, rows in runs.items()}


def table(summaries: dict[str, dict], oracle: str | None) -> str:
    head = "| method | n | EM | F1 | F1 / oracle | supporting recall | retrievals/q | generated tokens/q | s/q |"
    lines = [head, "|" + "---|" * 9]
    ref = summaries[oracle]["f1"] if oracle in summaries else None
    for m, s in summaries.items():
        share = f"{100 * s['f1'] / ref:.0f}%" if ref else "-"
        sup = "-" if s["support_recall"] is None else f"{s['support_recall']:.1f}"
        lines.append(f"| {m} | {s['questions']} | {s['em']:.1f} | {s['f1']:.1f} | {share} | {sup} | "
                     f"{s['retrievals_per_question']:.2f} | {s['tokens_per_question']:.1f} | "
                     f"{s['seconds_per_question']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, metavar="LABEL=JSONL")
    ap.add_argument("--dataset", required=True, help="dataset name for the JSON")
    ap.add_argument("--oracle", default="oracle", help="label of the oracle run (the F1 reference)")
    ap.add_argument("--settings", default="{}", help="JSON object of the run settings, kept in the output")
    ap.add_argument("--json", type=Path, help="compact JSON of the summaries and per-question rows")
    args = ap.parse_args()
    runs = {}
    for spec in args.runs:
        label, _, path = spec.partition("=")
        runs[label] = load(path)
    ids, rows = common_rows(runs)
    summaries = {m: summarize(r) for m, r in rows.items()}
    print(table(summaries, args.oracle))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"dataset": args.dataset, "questions": len(ids), "settings": json.loads(args.settings),
               "summaries": {m: {k: v for k, v in s.items() if k not in ("stage_seconds",)}
                             for m, s in summaries.items()},
               "rows": {m: [{k: r[k] for k in KEEP} for r in rs] for m, rs in rows.items()}}
        args.json.write_text(json.dumps(out, separators=(",", ":"), ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
