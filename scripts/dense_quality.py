"""Retrieval quality with a real embedding model: bm25, dense, hybrid and bm25 -> bi-encoder rerank, side by side.

    python scripts/dense_quality.py [--model DIR] [--workdir DIR] [--out benchmarks/raw/dense/dense_quality.json]

- BEIR ArguAna (../shared/data/beir-arguana): nDCG@10 and R@100 (trec_eval definitions, ``ragserve.ireval``),
  each query's own argument dropped from its hits (BEIR's ``ignore_identical_ids``, Anserini's -removeQuery).
- HotpotQA dev (../shared/data/hotpotqa-dev500-ircot), closed corpus of the questions' own paragraphs:
  supporting-paragraph recall@k (the share of a question's supporting titles among the top k, averaged).

Systems: ``bm25`` (exact Lucene BM25, k1 0.9 b 0.4), ``dense`` (the model, faiss exact inner product),
``hybrid`` (reciprocal-rank fusion of the two top-100s, k = 60; and normalised linear fusion, alpha 0.5) and
``bm25>rerank`` (BM25's top 100 re-scored by the model: the bi-encoder's inner products).
Indexes and dense parts are built once under --workdir and reused (embedding ArguAna's 8,674 passages takes
minutes on 2 cores). The model defaults to the bundled all-MiniLM-L6-v2 (``all_minilm_l6_v2``), unpacked there.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from indexer.reader import IndexReader  # noqa: E402
from indexer.options import BuildOptions  # noqa: E402
from indexer.writer import build_index  # noqa: E402
from ragserve.ireval import evaluate  # noqa: E402
from ragserve.retrieval.rerank import RerankingSearcher  # noqa: E402
from ragserve.retrieval.dense import DENSE_DIR, DenseIndex, DenseSearcher, build_dense_index  # noqa: E402
from ragserve.retrieval.embedder import Embedder  # noqa: E402
from ragserve.retrieval.hybrid import FusionOptions, HybridSearcher  # noqa: E402
from ragserve.retrieval.rerank import BiEncoderReranker  # noqa: E402
from ragserve.retrieval.searcher import Searcher  # noqa: E402
from tools.machine import cpu_model  # noqa: E402
from tools.provenance import stamp  # noqa: E402

DEPTH = 100
SUPPORT_K = (2, 5, 10, 20)
BATCH = 64


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def model_dir(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    target = Path(args.workdir) / "models" / "all-MiniLM-L6-v2"
    if not (target / "modules.json").is_file():
        import all_minilm_l6_v2

        all_minilm_l6_v2.extract_model(str(target.parent))
    return target


def ensure_index(corpus: Path, out: Path, embedder: Embedder) -> tuple[IndexReader, dict]:
    """The BM25 index and its dense part, built once; returns the reader and the embedding cost."""
    if not (out / "manifest.json").is_file():
        log(f"indexing {corpus}")
        build_index([corpus], out, BuildOptions(progress=False, overwrite=True))
    reader = IndexReader(out)
    cost = {}
    try:
        embedder.check_same_model(DenseIndex(reader).encoder, "dense part")
        log(f"reusing the dense part of {out}")
    except Exception:
        log(f"embedding {reader.num_docs:,} passages of {out.name}")
        t0 = time.perf_counter()
        build_dense_index(out, embedder, progress=sys.stderr.isatty(), overwrite=True)
        dt = time.perf_counter() - t0
        cost = {"passages": reader.num_docs, "seconds": dt, "passages_per_s": reader.num_docs / dt}
    m = json.loads((out / DENSE_DIR / "manifest.json").read_text())
    return reader, cost or {"passages": reader.num_docs, "seconds": m["build_seconds"],
                            "passages_per_s": reader.num_docs / m["build_seconds"], "from_manifest": True}


def systems(reader: IndexReader, embedder: Embedder) -> dict:
    bm25 = Searcher(reader, backend="cpu")
    dense = DenseSearcher(reader, embedder, backend="cpu")
    return {
        "bm25": bm25,
        "dense": dense,
        "hybrid": HybridSearcher(bm25, dense, FusionOptions(method="rrf", depth=DEPTH)),
        "hybrid-linear": HybridSearcher(bm25, dense, FusionOptions(method="linear", alpha=0.5, depth=DEPTH)),
        "bm25>rerank": RerankingSearcher(bm25, BiEncoderReranker(embedder, reader), depth=DEPTH),
    }


def run_all(retriever, texts: list[str], k: int) -> tuple[list, float]:
    t0 = time.perf_counter()
    out = []
    for i in range(0, len(texts), BATCH):
        out += retriever.search_batch(texts[i:i + BATCH], k=k, with_text=False)
    return out, time.perf_counter() - t0


def arguana(args: argparse.Namespace, embedder: Embedder) -> dict:
    from ragserve.topics import read_qrels, read_queries

    data = Path(args.data) / "beir-arguana"
    reader, cost = ensure_index(data / "corpus.jsonl.gz", Path(args.workdir) / "arguana", embedder)
    queries = read_queries(data / "queries.jsonl.gz")
    qrels = read_qrels(data / "qrels" / "test.tsv")
    queries = [q for q in queries if q.id in qrels]
    texts = [q.text for q in queries]
    out = {"embedding": cost, "queries": len(queries), "systems": {}}
    for name, r in systems(reader, embedder).items():
        if name == "bm25>rerank":
            # rerank BM25's top 100 after the query's own argument is dropped (the first stage BEIR scores)
            first, dt = run_all(r.searcher, texts, DEPTH + 1)
            first = [[h for h in hs if h.id != q.id][:DEPTH] for q, hs in zip(queries, first)]
            t0 = time.perf_counter()
            scores = []
            for i in range(0, len(texts), BATCH):
                scores += r.reranker.rescore_batch(texts[i:i + BATCH], first[i:i + BATCH])
            dt += time.perf_counter() - t0
            hits = [[(hs[j].id, float(sc[j])) for j in sorted(range(len(hs)), key=lambda j: (-sc[j], j))]
                    for hs, sc in zip(first, scores)]
        else:
            res, dt = run_all(r, texts, DEPTH + 1)
            hits = [[(h.id, h.score) for h in hs] for hs in res]
        run = {q.id: hs for q, hs in zip(queries, hits)}
        ev = evaluate(run, qrels, ["ndcg_cut_10", "recall_100"], remove_query=True)
        out["systems"][name] = {"ndcg@10": ev.mean["ndcg_cut_10"], "recall@100": ev.mean["recall_100"],
                                "seconds": dt}
        log(f"arguana {name}: nDCG@10 {ev.mean['ndcg_cut_10']:.4f} R@100 {ev.mean['recall_100']:.4f} ({dt:.1f} s)")
    return out


def hotpot(args: argparse.Namespace, embedder: Embedder) -> dict:
    from ragserve.rag.corpus import dataset_passages, write_corpus
    from ragserve.rag.datasets import read_dataset
    from ragserve.rag.metrics import support_recall

    examples = read_dataset(Path(args.data) / "hotpotqa-dev500-ircot" / "dev_subsampled.jsonl")
    corpus = write_corpus(dataset_passages(examples), Path(args.workdir) / "hotpot.corpus.jsonl")
    reader, cost = ensure_index(corpus, Path(args.workdir) / "hotpot", embedder)
    texts = [ex.question for ex in examples]
    out = {"embedding": cost, "questions": len(examples), "passages": reader.num_docs, "systems": {}}
    kmax = max(SUPPORT_K)
    for name, r in systems(reader, embedder).items():
        res, dt = run_all(r, texts, kmax)
        # titles come from the store (hits were fetched without text)
        titles = [[reader.document(h.docid)[0] for h in hs] for hs in res]
        row = {"seconds": dt}
        for k in SUPPORT_K:
            vals = [support_recall(t[:k], ex.supporting) for t, ex in zip(titles, examples)]
            row[f"support_recall@{k}"] = float(np.mean([v for v in vals if v is not None]))
        out["systems"][name] = row
        log(f"hotpotqa {name}: " + " ".join(f"R@{k} {row[f'support_recall@{k}']:.4f}" for k in SUPPORT_K))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="sentence-encoder directory (default: the bundled all-MiniLM-L6-v2)")
    ap.add_argument("--workdir", default="/tmp/ragserve-dense-quality")
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "dense_quality.json"))
    ap.add_argument("--device", default="cpu", help="embedding device (default cpu)")
    args = ap.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    import torch

    embedder = Embedder(str(model_dir(args)), device=args.device)
    t0 = time.perf_counter()
    report = {
        "model": embedder.info.to_dict(),
        "environment": {"cpu": cpu_model(), "cores": __import__("os").cpu_count(), "torch_threads": torch.get_num_threads(),
                        "embedding_device": embedder.device, "python": platform.python_version()},
        "command": "python scripts/dense_quality.py",
        "arguana": arguana(args, embedder),
        "hotpotqa": hotpot(args, embedder),
    }
    report["seconds"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(stamp(report), indent=1) + "\n")  # with the tree measured
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
