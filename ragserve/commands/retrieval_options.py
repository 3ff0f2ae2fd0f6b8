"""The retriever options every command that searches shares (``search``, ``eval``, ``serve``), and the dense-build
options of ``index --dense`` and ``index-dense``: declared once, turned into a retriever or a build here."""
from __future__ import annotations

import argparse
import sys

from ragserve.cli import CliError


def add_retriever_args(p: argparse.ArgumentParser, rerank: bool = True) -> None:
    g = p.add_argument_group("retriever")
    g.add_argument("--retriever", default="bm25", choices=["bm25", "dense", "hybrid"],
                   help="bm25 (default), dense (the index's dense part) or hybrid (both, fused)")
    g.add_argument("--dense-model", metavar="DIR",
                   help="query encoder (default: the model the dense part was built with)")
    g.add_argument("--embed-device", default="auto", help="query encoder device: auto (default), cpu, cuda[:N]")
    g.add_argument("--fusion", default="rrf", choices=["rrf", "linear"],
                   help="hybrid: reciprocal-rank fusion (default) or normalised linear fusion")
    g.add_argument("--rrf-k", type=float, default=60.0, help="hybrid rrf: 1 / (rrf_k + rank) (default 60)")
    g.add_argument("--alpha", type=float, default=0.5, help="hybrid linear: weight of the dense scores (default 0.5)")
    g.add_argument("--fusion-depth", type=int, default=100, help="hybrid: hits taken from each retriever (default 100)")
    g.add_argument("--ef-search", type=int, default=128, help="dense on cpu, hnsw index: faiss efSearch (default 128)")
    g.add_argument("--nprobe", type=int, default=32, help="dense on cpu, ivfpq index: faiss nprobe (default 32)")
    if rerank:
        g.add_argument("--rerank", metavar="MODEL",
                       help="re-score the first stage's top --rerank-depth with a model: a sentence encoder "
                            "(bi-encoder) or a cross-encoder")
        g.add_argument("--rerank-depth", type=int, default=100, help="first-stage hits re-scored (default 100)")


def retrieval_config(args: argparse.Namespace, backend_options: dict | None = None):
    from ragserve.retrieval.dense import DenseOptions, FaissOptions
    from ragserve.retrieval.factory import RetrievalConfig
    from ragserve.retrieval.hybrid import FusionOptions

    return RetrievalConfig(
        retriever=args.retriever, backend=args.backend, backend_options=backend_options or {},
        dense_model=args.dense_model, embed_device=args.embed_device,
        dense=DenseOptions(faiss=FaissOptions(ef_search=args.ef_search, nprobe=args.nprobe)),
        fusion=FusionOptions(method=args.fusion, rrf_k=args.rrf_k, alpha=args.alpha, depth=args.fusion_depth))


def open_retriever(args: argparse.Namespace, backend_options: dict | None = None, rerank_device: str = "auto"):
    """The retriever the arguments ask for (wrapped in the reranker when --rerank is given); one line on error."""
    from indexer.reader import InvalidIndexError
    from ragserve.kernels.contract import SearchError
    from ragserve.retrieval.embedder import EmbedderError
    from ragserve.retrieval.factory import open_retriever as _open

    try:
        cfg = retrieval_config(args, backend_options)
        cfg.fusion.check()
        retriever = _open(args.index, cfg)
        if getattr(args, "rerank", None):
            from ragserve.retrieval.rerank import RerankingSearcher, load_reranker

            reranker = load_reranker(args.rerank, device=rerank_device, index=retriever.index)
            retriever = RerankingSearcher(retriever, reranker, depth=args.rerank_depth)
        return retriever
    except (InvalidIndexError, SearchError, EmbedderError) as e:  # a reranker's errors are SearchErrors
        raise CliError(str(e)) from None
    except RuntimeError as e:  # a backend that cannot start here (no GPU, no FPGA runtime)
        raise CliError(str(e)) from None


def add_dense_build_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("dense part")
    g.add_argument("--faiss", default="flat", choices=["flat", "hnsw", "ivfpq"],
                   help="faiss index: flat (exact inner product, default), hnsw or ivfpq (approximate, for "
                        "tens of millions of passages)")
    g.add_argument("--hnsw-m", type=int, default=32, help="hnsw: links per node (default 32)")
    g.add_argument("--ef-construction", type=int, default=80, help="hnsw: build beam width (default 80)")
    g.add_argument("--nlist", type=int, default=0, help="ivfpq: inverted lists (default: about 4 sqrt(N))")
    g.add_argument("--pq-m", type=int, default=0, help="ivfpq: sub-quantizers (default: dim / 8)")
    g.add_argument("--pq-bits", type=int, default=8, help="ivfpq: bits per sub-quantizer code (default 8)")
    g.add_argument("--embed-batch", type=int, default=0, help="passages per encoder batch (default 32 cpu, 256 gpu)")
    g.add_argument("--embed-device", default="auto", help="encoder device: auto (default), cpu, cuda[:N]")


def build_dense(args: argparse.Namespace, index_dir: str, model: str, overwrite: bool) -> dict:
    """Embed the index's passages with ``model`` and write its dense part, the memory it needs printed first."""
    from indexer.reader import IndexReader, InvalidIndexError
    from ragserve.retrieval.dense import DenseIndexError, FaissOptions, build_dense_index, describe_plan
    from ragserve.retrieval.embedder import Embedder, EmbedderError

    opts = FaissOptions(kind=args.faiss, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction, nlist=args.nlist,
                        pq_m=args.pq_m, pq_bits=args.pq_bits)
    try:
        opts.check()
        reader = IndexReader(index_dir)
        embedder = Embedder(model, device=args.embed_device, batch_size=args.embed_batch)
        if args.faiss != "flat":
            import faiss  # noqa: F401
        print(describe_plan(reader.num_docs, embedder.dim, opts), flush=True)
        return build_dense_index(index_dir, embedder, opts, progress=not args.quiet, overwrite=overwrite)
    except ImportError:
        raise CliError("the hnsw and ivfpq indexes need faiss (pip install faiss-cpu)") from None
    except (InvalidIndexError, DenseIndexError, EmbedderError) as e:
        raise CliError(str(e)) from None


def report_dense(m: dict, index_dir: str) -> None:
    print(f"dense part of {index_dir}: {m['num_docs']:,} passages embedded with {m['encoder']['name']} "
          f"({m['dim']} dims, fp16), faiss {m['faiss']['kind']}, {m['build_seconds']:.1f} s "
          f"({m['num_docs'] / max(m['build_seconds'], 1e-9):.1f} passages/s)", file=sys.stdout)
