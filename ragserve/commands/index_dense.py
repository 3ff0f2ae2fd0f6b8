"""``ragserve index-dense DIR --model MODEL``: add a dense part (passage embeddings + faiss index) to an index."""
from __future__ import annotations

import argparse

from ragserve.commands.retrieval_options import add_dense_build_args, build_dense, report_dense


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index-dense", help="embed an index's passages with a sentence encoder (dense part)",
                       description="Embed every stored passage of an existing index with a sentence-transformers "
                                   "model directory and store the fp16 embeddings and a faiss index beside the "
                                   "BM25 layout (DIR/dense/). The memory the index needs is printed first; an "
                                   "interrupted build leaves the index as it was.")
    p.add_argument("index", metavar="DIR", help="index directory (ragserve index)")
    p.add_argument("--model", required=True, metavar="MODEL", help="sentence encoder directory "
                   "(e.g. models/all-MiniLM-L6-v2 from 'ragserve models install minilm')")
    add_dense_build_args(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing dense part")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report_dense(build_dense(args, args.index, args.model, overwrite=args.overwrite), args.index)
    return 0
