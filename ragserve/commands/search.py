"""``ragserve search``: one query to the terminal, or a query file to a TREC run."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ragserve.cli import CliError, output_path
from ragserve.commands import add_backend_arg, check_backend

BATCH = 256  # queries per backend call in file mode


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search an index (one query, or a query file to a TREC run)",
                       description="Exact BM25 top-k search, or dense / hybrid retrieval (--retriever) on an "
                                   "index with a dense part, optionally re-scored by a model (--rerank). With "
                                   "--queries, writes a TREC run (qid Q0 docid rank score tag) with the corpus's "
                                   "own doc ids.")
    p.add_argument("query", nargs="?", help="query text (omit with --queries)")
    p.add_argument("--index", required=True, metavar="DIR", help="index directory (ragserve index)")
    p.add_argument("-k", type=int, default=10, help="hits per query (1..10000, default 10)")
    p.add_argument("--k1", type=float, default=None, help="BM25 k1 (default: the index's, 0.9)")
    p.add_argument("--b", type=float, default=None, help="BM25 b (default: the index's, 0.4)")
    add_backend_arg(p)
    p.add_argument("--json", action="store_true", help="print hits as JSON")
    p.add_argument("--queries", metavar="FILE", help="query file: TSV id<TAB>text, BEIR/JSONL queries, or text")
    p.add_argument("--output", metavar="RUN", help="TREC run file to write (default: stdout)")
    p.add_argument("--tag", default="ragserve", help="run tag (last column)")
    p.add_argument("--remove-query", action="store_true",
                   help="drop a hit whose doc id equals the query id (BEIR ArguAna convention)")
    p.add_argument("--xclbin", help="FPGA bitstream for --backend fpga")
    p.add_argument("--device", help="device of the backend: cuda:N for gpu (default cuda), an XRT device index for fpga")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="search on the Ray cluster at ADDRESS (local: start one here): shard groups on Ray actors, "
                        "each with --backend; the same hits (needs ragserve[ray])")
    p.add_argument("--ray-groups", type=int, default=0, metavar="N",
                   help="with --ray: shard groups, one actor each (default: as many as the cluster holds, "
                        "at most one per shard)")
    p.add_argument("--ray-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="with --ray: seconds a shard group has to answer a batch; one that misses it is asked "
                        "again and has as long once more before its shards count as unavailable (default 30)")
    from ragserve.commands.retrieval_options import add_retriever_args

    add_retriever_args(p)
    p.set_defaults(func=run)


def _searcher(args: argparse.Namespace):
    from ragserve.commands.retrieval_options import open_retriever

    opts: dict = {}
    if args.xclbin:
        opts["xclbin"] = args.xclbin
    if args.device:
        opts["device"] = int(args.device) if args.device.isdigit() else args.device
    if not args.device:
        check_backend(args.backend, device_option=True)
    if args.ray:
        if args.retriever != "bm25" or args.rerank:
            raise CliError("--ray searches BM25 shards: --retriever dense/hybrid and --rerank run without it")
        return _distributed_searcher(args, opts)
    return open_retriever(args, opts)


def _distributed_searcher(args: argparse.Namespace, opts: dict):
    from ragserve.distributed import RayUnavailable

    try:
        from ragserve.distributed.shards import DistributedSearcher, GroupOptions

        from ragserve.kernels.registry import resolve_backend_name

        if not args.ray_timeout > 0:
            raise CliError(f"--ray-timeout must be positive, got {args.ray_timeout:g}")
        backend = resolve_backend_name(args.backend)  # the actors reserve a GPU only for the gpu backend
        options = GroupOptions(backend=backend, backend_options=opts, num_gpus=1.0 if backend == "gpu" else 0.0)
        return DistributedSearcher(args.index, ray=args.ray, groups=args.ray_groups or None, options=options,
                                   timeout_s=args.ray_timeout)
    except (RayUnavailable, ValueError) as e:
        raise CliError(str(e)) from e


def run(args: argparse.Namespace) -> int:
    from ragserve.kernels.contract import ShardsUnavailable
    from ragserve.kernels.contract import SearchError
    from ragserve.retrieval.contract import MAX_K

    if (args.query is None) == (args.queries is None):
        raise CliError("give either a QUERY or --queries FILE")
    if not 1 <= args.k <= MAX_K:
        raise CliError(f"-k must be between 1 and {MAX_K}, got {args.k}")
    if args.query is not None and not args.query.strip():
        raise CliError("the query is empty")
    searcher = _searcher(args)
    try:
        if args.query is not None:
            hits = searcher.search(args.query, k=args.k, k1=args.k1, b=args.b)
            print(format_hits(hits, args.json))
            return 0
        return _run_file(args, searcher)
    except SearchError as e:
        raise CliError(str(e)) from e
    except ShardsUnavailable as e:  # with --ray: a replica is down (not bad input: exit 1)
        print(f"ragserve search: error: {e}", file=sys.stderr)
        return 1
    finally:
        searcher.close()


def format_hits(hits: list, as_json: bool = False) -> str:
    """What ``ragserve search QUERY`` prints for its hits: JSON, or a ranked list with each passage cut to 200
    characters."""
    if as_json:
        return json.dumps([h.to_dict() for h in hits], ensure_ascii=False, indent=1)
    if not hits:
        return "no document matches the query"
    lines = []
    for rank, h in enumerate(hits, 1):
        text = h.text if len(h.text) <= 200 else h.text[:200] + "..."
        title = f"  {h.title}" if h.title else ""  # BEIR ArguAna and others have no titles
        lines.append(f"{rank:3d}  {h.score:9.4f}  {h.id}{title}\n      {text}")
    return "\n".join(lines)


def _run_file(args: argparse.Namespace, searcher) -> int:
    from tqdm import tqdm

    from ragserve.topics import TopicsError, read_queries
    from ragserve.trec import write_run

    try:
        queries = read_queries(args.queries)
    except (OSError, TopicsError) as e:
        raise CliError(str(e)) from e
    try:
        out = open(output_path(args.output, "run file"), "w") if args.output else sys.stdout
    except OSError as e:
        raise CliError(f"cannot write the run file {args.output}: {e.strerror or e}") from None
    t0 = time.perf_counter()
    n_empty = 0
    try:
        with tqdm(total=len(queries), desc="searching", unit=" q", disable=not args.output) as bar:
            for i in range(0, len(queries), BATCH):
                batch = queries[i:i + BATCH]
                texts = [q.text if q.text.strip() else "" for q in batch]
                keep = [j for j, t in enumerate(texts) if t]
                n_empty += len(texts) - len(keep)
                k = args.k + 1 if args.remove_query else args.k
                hits = searcher.search_batch([texts[j] for j in keep], k=min(k, 10_000), k1=args.k1, b=args.b,
                                             with_text=False)
                results = []
                for j, hs in zip(keep, hits):
                    qid = batch[j].id
                    pairs = [(h.id, h.score) for h in hs if not (args.remove_query and h.id == qid)]
                    results.append((qid, pairs[:args.k]))
                write_run(out, results, args.tag)
                bar.update(len(batch))
    finally:
        if args.output:
            out.close()
    dt = time.perf_counter() - t0
    if args.output:
        print(f"{len(queries)} queries in {dt:.2f} s ({len(queries) / dt:.1f} q/s) -> {args.output}"
              + (f"; {n_empty} empty queries skipped" if n_empty else ""), file=sys.stderr)
    return 0
