"""``ragserve eval-run``: score a TREC run file against qrels (nDCG@10, Recall@100, MRR@10 by default)."""
from __future__ import annotations

import argparse
import json

from ragserve.cli import CliError
from ragserve.ireval import DEFAULT_METRICS, EvalError, evaluate
from ragserve.topics import TopicsError, read_qrels
from ragserve.trec import RunError, read_run


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval-run", help="evaluate a TREC run against qrels (trec_eval -c definitions)",
        description="Evaluate a TREC run file against TREC or BEIR qrels. Every qrels query is averaged; one "
                    "missing from the run scores 0 (trec_eval -c). Ties are ranked as trec_eval ranks them.")
    p.add_argument("run", help="run file: 'qid Q0 docid rank score tag' lines (.gz allowed)")
    p.add_argument("--qrels", required=True, help="qrels: TREC 'qid 0 docid rel' or BEIR TSV with header")
    p.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS), metavar="M",
                   help="ndcg_cut_K, recall_K, recip_rank[_K], P_K (default: %(default)s)")
    p.add_argument("--remove-query", action="store_true",
                   help="drop hits whose docid equals the query id (Anserini -removeQuery; BEIR ArguAna)")
    p.add_argument("--per-query", action="store_true", help="also print one row per query")
    p.add_argument("--json", action="store_true", help="print the result as JSON (with per-query values)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        qrels = read_qrels(args.qrels)
        result = evaluate(read_run(args.run), qrels, args.metrics, remove_query=args.remove_query)
    except (TopicsError, RunError, EvalError) as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
        return 0
    width = max(len(m) for m in result.metrics)
    if args.per_query:
        for qid, values in result.per_query.items():
            for m in result.metrics:
                print(f"{m:<{width}}  {qid}  {values[m]:.4f}")
    for m in result.metrics:
        print(f"{m:<{width}}  all  {result.mean[m]:.4f}")
    print(f"{'num_q':<{width}}  all  {len(result.per_query)}")
    if result.missing:
        print(f"note: {len(result.missing)} qrels queries have no run entries (scored 0)")
    if result.ignored:
        print(f"note: {len(result.ignored)} run queries are not in the qrels (ignored)")
    return 0
