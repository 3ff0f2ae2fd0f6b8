"""The real-generator evaluation table from ``ragserve eval`` outputs: every method on the SAME questions (the
questions every given run has answered, in dataset order), as a markdown table and one compact JSON of the
per-question rows (id, prediction, EM, F1, supporting-passage recall, retrievals, generated tokens, seconds).

    python scripts/rag_real_table.py --runs oracle=dev-oracle.jsonl none=dev-none.jsonl ... \\
        --dataset hotpotqa-dev500-ircot --json benchmarks/raw/rag_real/hotpotqa_dev.json

F1 and F1 / oracle carry a 95% interval from a paired bootstrap over the shared questions (the same resampled
questions for every row, so the ratio to the oracle keeps its pairing); ``--same-as single`` adds the share of
predictions equal to that run's; ``--own-n`` also prints each run over all the questions it answered, for runs
that went further than the shared set.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragserve.rag.evaluate import summarize  # noqa: E402

KEEP = ("id", "prediction", "em", "f1", "support_recall", "retrievals", "tokens", "seconds")
HEAD = ("| method | n | EM | F1 (95% CI) | F1 / oracle (95% CI) | supporting recall | retrievals/q | "
        "generated tokens/q | s/q |")


def load(path: str) -> list[dict]:
    return [json.loads(l) for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]


def common_rows(runs: dict[str, list[dict]]) -> tuple[list[str], dict[str, list[dict]]]:
    """The ids every run answered, in the first run's order, and each run's rows for them."""
    ids = [r["id"] for r in next(iter(runs.values()))]
    shared = set.intersection(*({r["id"] for r in rows} for rows in runs.values()))
    ids = [i for i in ids if i in shared]
    by_id = {m: {r["id"]: r for r in rows} for m, rows in runs.items()}
    return ids, {m: [by_id[m][i] for i in ids] for m in runs}


def bootstrap(rows: dict[str, list[dict]], oracle: str | None, resamples: int = 2000,
              seed: int = 0) -> dict[str, dict]:
    """95% percentile intervals of each run's mean F1 (percent) and of its ratio to the oracle's, resampling the
    shared questions with replacement, the same draw for every run."""
    n = len(next(iter(rows.values())))
    if n == 0:
        return {m: {} for m in rows}
    rng = random.Random(seed)
    f1 = {m: [r["f1"] for r in rs] for m, rs in rows.items()}
    means: dict[str, list[float]] = {m: [] for m in rows}
    ratios: dict[str, list[float]] = {m: [] for m in rows}
    for _ in range(resamples):
        draw = [rng.randrange(n) for _ in range(n)]
        ref = sum(f1[oracle][i] for i in draw) if oracle in f1 else 0.0
        for m, v in f1.items():
            s = sum(v[i] for i in draw)
            means[m].append(100.0 * s / n)
            if ref > 0:
                ratios[m].append(s / ref)

    def interval(xs: list[float]) -> list[float] | None:
        if not xs:
            return None
        xs = sorted(xs)
        return [xs[int(0.025 * (len(xs) - 1))], xs[int(0.975 * (len(xs) - 1))]]

    return {m: {"f1_ci": interval(means[m]), "f1_over_oracle_ci": interval(ratios[m])} for m in rows}


def agreement(rows: dict[str, list[dict]], ref: str) -> dict[str, float]:
    """Share of each run's predictions equal to run ``ref``'s on the same question."""
    base = [r["prediction"] for r in rows[ref]]
    return {m: sum(r["prediction"] == b for r, b in zip(rs, base)) / max(1, len(base)) for m, rs in rows.items()}


def table(summaries: dict[str, dict], oracle: str | None, ci: dict[str, dict] | None = None,
          same: dict[str, float] | None = None, same_label: str = "") -> str:
    head = HEAD + (f" same as {same_label} |" if same is not None else "")
    cols = head.count("|") - 1
    lines = [head, "|" + "---|" * cols]
    ref = summaries[oracle]["f1"] if oracle in summaries else None
    for m, s in summaries.items():
        c = (ci or {}).get(m, {})
        f1 = f"{s['f1']:.1f}"
        if c.get("f1_ci"):
            f1 += f" ({c['f1_ci'][0]:.1f}-{c['f1_ci'][1]:.1f})"
        share = f"{100 * s['f1'] / ref:.0f}%" if ref else "-"
        if ref and c.get("f1_over_oracle_ci") and m != oracle:
            lo, hi = c["f1_over_oracle_ci"]
            share += f" ({100 * lo:.0f}-{100 * hi:.0f}%)"
        sup = "-" if s["support_recall"] is None else f"{s['support_recall']:.1f}"
        line = (f"| {m} | {s['questions']} | {s['em']:.1f} | {f1} | {share} | {sup} | "
                f"{s['retrievals_per_question']:.2f} | {s['tokens_per_question']:.1f} | "
                f"{s['seconds_per_question']:.1f} |")
        if same is not None:
            line += f" {100 * same[m]:.0f}% |"
        lines.append(line)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, metavar="LABEL=JSONL")
    ap.add_argument("--dataset", required=True, help="dataset name for the JSON")
    ap.add_argument("--oracle", default="oracle", help="label of the oracle run (the F1 reference)")
    ap.add_argument("--same-as", metavar="LABEL", help="add the share of predictions equal to this run's")
    ap.add_argument("--own-n", action="store_true",
                    help="also print each run over all the questions it answered (its own n)")
    ap.add_argument("--settings", default="{}", help="JSON object of the run settings, kept in the output")
    ap.add_argument("--json", type=Path, help="compact JSON of the summaries and per-question rows")
    args = ap.parse_args()
    runs = {}
    for spec in args.runs:
        label, _, path = spec.partition("=")
        if not path:
            ap.error(f"--runs takes LABEL=JSONL, got {spec!r}")
        runs[label] = load(path)
    if args.same_as is not None and args.same_as not in runs:
        ap.error(f"--same-as {args.same_as!r} is not one of the runs' labels")
    ids, rows = common_rows(runs)
    summaries = {m: summarize(r) for m, r in rows.items()}
    ci = bootstrap(rows, args.oracle)
    same = agreement(rows, args.same_as) if args.same_as else None
    print(table(summaries, args.oracle, ci, same, args.same_as or ""))
    own = {m: summarize(r) for m, r in runs.items()}
    if args.own_n:
        print("\nEach run over all the questions it answered (not the same questions when n differs):\n")
        print(table(own, None))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"dataset": args.dataset, "questions": len(ids), "settings": json.loads(args.settings),
               "summaries": {m: {**{k: v for k, v in s.items() if k not in ("stage_seconds",)}, **ci[m],
                                 **({"same_as_" + args.same_as: same[m]} if same else {})}
                             for m, s in summaries.items()},
               "own_n": {m: len(r) for m, r in runs.items()},
               "rows": {m: [{k: r[k] for k in KEEP} for r in rs] for m, rs in rows.items()}}
        args.json.write_text(json.dumps(out, separators=(",", ":"), ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
