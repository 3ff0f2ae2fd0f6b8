"""Writes to an index with a dense part (all-MiniLM-L6-v2, flat): what embedding costs a live index, and what the
one-token-count batching rule (``Embedder.encode``) costs against the padded batches it replaced.

    nice -n 10 .venv/bin/python scripts/bench_live_dense.py --model DIR --base 100 --adds 100 \
        --json benchmarks/raw/live/live_dense.json

On ArguAna passages (``../shared/data/beir-arguana``): a base index of ``--base`` passages with a flat dense part;
``--adds`` more passages written as one request and made searchable by one refresh (the embedding, the segment
and its dense part, the commit), timed; the same passages embedded by ``Embedder.encode`` (one token count a batch)
and by padded length-sorted batches (the rule before it), side by side, the two interleaved ``--passes`` times;
dense search latency (single queries, k = 10) over the live index (base + one delta) and over a fresh build of the
same documents, with a check that the two rank alike.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from indexer.readers import iter_documents  # noqa: E402
from indexer.segments import LiveIndex  # noqa: E402
from indexer.options import BuildOptions  # noqa: E402
from indexer.writer import build_index_from_documents  # noqa: E402
from ragserve.retrieval.dense import DenseSearcher, build_dense_index, passage_text  # noqa: E402
from ragserve.retrieval.embedder import Embedder  # noqa: E402
from ragserve.retrieval.live_dense import LiveDenseSearcher  # noqa: E402
from ragserve.topics import read_queries  # noqa: E402
from tools.machine import cpu_model  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "beir-arguana"


def padded(e: Embedder, texts: list[str]) -> np.ndarray:
    """The rule before: longest first, ``batch_size`` a batch, each padded to its longest text."""
    out = np.empty((len(texts), e.dim), np.float32)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    for i in range(0, len(texts), e.batch_size):
        idx = order[i:i + e.batch_size]
        out[idx] = e._batch([texts[j] for j in idx])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="all-MiniLM-L6-v2 directory")
    ap.add_argument("--base", type=int, default=100)
    ap.add_argument("--adds", type=int, default=100)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--workdir", default="/tmp/ragserve-bench-live-dense")
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    docs = [d for _, d in zip(range(args.base + args.adds), iter_documents([DATA / "corpus.jsonl.gz"]))]
    base, adds = docs[:args.base], docs[args.base:]
    e = Embedder(args.model, device="cpu")
    opts = BuildOptions(progress=False, workers=1)
    build_index_from_documents(base, work / "idx", opts)
    build_dense_index(work / "idx", e)
    out: dict = {"machine": cpu_model(), "base": args.base, "adds": args.adds,
                 "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                          text=True).stdout.strip()}

    texts = [passage_text(d.title, d.text) for d in adds]
    rule, old = [], []
    for _ in range(args.passes):  # interleaved: the shared machine's load drifts
        t = time.perf_counter()
        a = e.encode(texts)
        rule.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = padded(e, texts)
        old.append(time.perf_counter() - t)
    out["embed_token_count_pps"] = args.adds / min(rule)
    out["embed_padded_pps"] = args.adds / min(old)
    out["padded_rows_differing_f16"] = int((a.astype(np.float16) != b.astype(np.float16)).any(1).sum())
    print(f"embedding: {out['embed_token_count_pps']:.1f} passages/s by token count, {out['embed_padded_pps']:.1f} "
          f"padded", file=sys.stderr, flush=True)

    live = LiveIndex(work / "idx")
    t = time.perf_counter()
    live.add(adds)
    out["ack_s"] = time.perf_counter() - t
    t = time.perf_counter()
    live.refresh()
    out["refresh_s"] = time.perf_counter() - t
    out["refresh_pps"] = args.adds / out["refresh_s"]
    print(f"refresh of {args.adds} adds: {out['refresh_s']:.1f} s", file=sys.stderr, flush=True)

    build_index_from_documents(docs, work / "fresh", opts)
    build_dense_index(work / "fresh", e)
    queries = [q.text for q in read_queries(DATA / "queries.jsonl.gz")[:args.queries]]
    fresh, ld = DenseSearcher(work / "fresh", e), LiveDenseSearcher(live, e)
    qv = e.encode(queries)
    snap = live.snapshot()
    lat = {"fresh": [], "live": []}
    same = True
    for i in range(qv.shape[0]):
        t = time.perf_counter()
        f = fresh.search_vectors(qv[i:i + 1], 10)[0]
        lat["fresh"].append(time.perf_counter() - t)
        t = time.perf_counter()
        g = ld.search_vectors_in(snap, qv[i:i + 1], 10)[0].top
        lat["live"].append(time.perf_counter() - t)
        same &= np.array_equal(f.docids, g.docids) and np.array_equal(f.scores.view(np.uint32), g.scores.view(np.uint32))
    out["search_ms_median"] = {k: 1000 * statistics.median(v) for k, v in lat.items()}
    out["live_equals_fresh"] = bool(same)
    live.close()
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
