"""``ragserve eval``: run a RAG method over a QA dataset (one JSON line per question, resumable, summary
table), and ``ragserve eval build-index``: a closed-corpus index from a dataset's own paragraphs."""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from ragserve.cli import CliError, output_path
from ragserve.commands import add_backend_arg, check_backend
from ragserve.model_path import model_path_problem
from ragserve.rag.names import EVAL_METHOD_NAMES

FORMAT_CHOICES = ("auto", "hotpotqa", "hotpotqa-ircot", "2wiki", "strategyqa", "iirc", "nq-open", "musique")
NO_INDEX = ("none", "oracle")  # methods that retrieve nothing


def _first(*values):
    """The first value that is not None."""
    return next(v for v in values if v is not None)


def _family(fmt: str) -> str:
    return "hotpotqa" if fmt.startswith("hotpotqa") else fmt


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate a RAG method on a QA dataset (or: eval build-index, eval report)",
        usage="ragserve eval --dataset FILE --method M [--model PATH] [--index DIR] [--out JSONL] [options]\n"
              "       ragserve eval build-index --dataset FILE --out DIR [options]\n"
              "       ragserve eval report ROWS.jsonl [ROWS.jsonl ...] --out report.html",
        description="Answer each question of a dataset with a RAG method over a BM25 index, writing one JSON "
                    "line per question to --out as it goes (rerunning resumes after the ids already there), "
                    "then print EM/F1/precision/recall, supporting-passage recall, retrievals and tokens per "
                    "question and the time share of each memory-pipeline stage. "
                    "'ragserve eval build-index' indexes a dataset's own paragraphs (closed corpus); "
                    "'ragserve eval report' turns the --out files of runs into one HTML page.")
    p.add_argument("--dataset", metavar="FILE", help="dataset file in its native format")
    p.add_argument("--format", default="auto", choices=FORMAT_CHOICES, help="dataset format (default: detect)")
    p.add_argument("--method", choices=EVAL_METHOD_NAMES, help="RAG method")
    p.add_argument("--model", metavar="PATH", help="causal LM: a local directory, an installed short name "
                                                   "(gemma-270m) or a hub id in the local cache")
    p.add_argument("--index", metavar="DIR", help="index (needed by every method but 'none', unless --memory)")
    add_backend_arg(p)
    p.add_argument("--device", default="auto", help="generator device: auto, cpu, cuda, cuda:0 ...")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--limit", type=int, help="first N questions only")
    p.add_argument("--out", metavar="JSONL", help="per-question results (appended; resumes)")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no per-question progress lines")
    g = p.add_argument_group("prompt and generation")
    g.add_argument("--prompt-file", metavar="FILE",
                   help="few-shot exemplars (default: the model's profile in ragserve/prompts/profiles.json, else "
                        "ragserve/prompts/ by dataset)")
    g.add_argument("--fewshot", type=int, help="use only the first N exemplars")
    g.add_argument("--passage-words", type=int, default=150, help="words of each passage in the prompt")
    g.add_argument("--max-new-tokens", type=int,
                   help="answer token budget (default: the model's profile, else DRAGIN's per dataset: 100, "
                        "2wiki 64, iirc 128)")
    g.add_argument("--answer-max-tokens", type=int, default=24, help="tokens when asking for a missing answer")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--attention", metavar="M", help="sparse attention for decode steps: dense, dsa, quest, lserve, "
                                                    "seer-topk, seer-threshold (default: the model's own)")
    g.add_argument("--attention-budget", type=int, metavar="K", help="tokens each decode step attends (default 2048)")
    g.add_argument("--step-compile", default="auto", choices=["auto", "on", "off"],
                   help="compile the fast engine's static decode step (torch.compile): auto (on CUDA with "
                    "Triton), on, off (default auto)")
    g.add_argument("--step-shapes", default="bucketed", choices=["bucketed", "fixed"],
                   help="the static decode step's shapes: bucketed (the slots and cache columns in use, rounded "
                   "up to powers of two) or fixed (every slot and column: an answer's bits never depend on "
                   "the others decoding beside it, at the cost of reading every cache) (default bucketed)")
    r = p.add_argument_group("retrieval")
    r.add_argument("-k", "--k", dest="k", type=int,
                   help="passages per retrieval (default: the method's: 3; bridge 2)")
    r.add_argument("--query-max-tokens", type=int, default=64, help="query length budget in model tokens")
    r.add_argument("--reranker", "--rerank", dest="reranker", metavar="MODEL",
                   help="re-score the first stage's top-N with a model (two-stage; any method): a cross-encoder, "
                        "or a sentence encoder (bi-encoder)")
    r.add_argument("--rerank-depth", type=int, default=100, help="first-stage candidates for the reranker (default 100)")
    r.add_argument("--reranker-device", default="auto", help="device of the reranker (default auto)")
    from ragserve.commands.retrieval_options import add_retriever_args

    add_retriever_args(p, rerank=False)
    mem = p.add_argument_group("memory as context (training-free)")
    mem.add_argument("--memory", action="store_true",
                     help="read each question's own paragraphs as one long input, segment by segment, into a "
                          "memory bank, and retrieve from that memory instead of an index")
    mem.add_argument("--memory-model", metavar="DIR", help="sentence encoder of the memory (needed with --memory)")
    mem.add_argument("--segment-tokens", type=int, default=128, help="encoder tokens per segment (default 128)")
    mem.add_argument("--memory-capacity", type=int, default=65536,
                     help="segments held before the oldest is evicted (default 65536)")
    mem.add_argument("--memory-k", type=int, default=5, help="earlier segments each segment recalls (default 5)")
    mem.add_argument("--memory-backend", default="cpu", choices=["cpu", "gpu", "fpga-sim"],
                     help="device of the memory bank's recall (default cpu)")
    m = p.add_argument_group("method hyperparameters")
    m.add_argument("--interval", type=int, default=32, help="fixed-length: tokens between retrievals")
    m.add_argument("--sentence-max-tokens", type=int, default=64, help="fixed-sentence: longest sentence")
    m.add_argument("--theta", type=float,
                   help="flare: retrieve if a token prob < theta (default: the model's profile, else 0.8)")
    m.add_argument("--beta", type=float, default=0.4, help="flare: mask query tokens with prob < beta")
    m.add_argument("--look-ahead", type=int, default=64, help="flare: look-ahead sentence token cap")
    m.add_argument("--threshold", type=float,
                   help="dragin: RIND threshold (default: the model's profile, else DRAGIN's per dataset)")
    m.add_argument("--keep", type=int, help="dragin: QFS query words (default: DRAGIN's per dataset)")
    p.set_defaults(func=run)

    sub = p.add_subparsers(dest="eval_action", metavar="ACTION", prog="ragserve eval",  # not the usage block
                           help="optional: build-index or report (without one, eval runs a method)")
    b = sub.add_parser("build-index", help="index a dataset's own paragraphs (closed corpus)",
                       description="Write the distinct context paragraphs of a dataset to a JSONL corpus "
                                   "(BEIR fields _id/title/text) and build a BM25 index of it.")
    b.add_argument("--dataset", metavar="FILE", required=True, help="dataset file in its native format")
    b.add_argument("--format", default="auto", choices=FORMAT_CHOICES, help="dataset format (default: detect)")
    b.add_argument("--out", metavar="DIR", required=True, help="index directory to create")
    b.add_argument("--corpus", metavar="JSONL", help="corpus file to write (default: <DIR>.corpus.jsonl)")
    b.add_argument("--limit", type=int, help="paragraphs of the first N questions only")
    b.add_argument("--overwrite", action="store_true", help="replace an existing index at --out")
    b.add_argument("--workers", type=int, default=0, help="analysis processes (0: one per core)")
    b.set_defaults(func=run_build_index)
    rp = sub.add_parser("report", help="one self-contained HTML page from evaluation rows",
                        description="Read the per-question JSONL files of 'ragserve eval --out' (one or more "
                                    "runs, any methods) and write one HTML file (inline SVG and CSS, no "
                                    "script): EM and F1 per method with 95%% confidence intervals, EM against "
                                    "retrievals per question, stage-time shares, the slowest and the wrong "
                                    "answers with their passages.")
    rp.add_argument("rows", nargs="+", metavar="ROWS.jsonl", help="per-question results of ragserve eval --out")
    rp.add_argument("--out", required=True, metavar="HTML", help="report file to write")
    rp.add_argument("--examples", type=int, default=6,
                    help="slowest answers shown, and wrong answers shown per method (default 6)")
    rp.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from ragserve.rag.report import ReportError, write_report

    if args.examples < 0:
        raise CliError(f"--examples must be at least 0, got {args.examples}")
    out = output_path(args.out, "report")
    try:
        done = write_report(args.rows, out, args.examples)
    except ReportError as e:
        raise CliError(str(e)) from e
    print(f"wrote {out}: {done['rows']} answers by {', '.join(done['methods'])} ({done['bytes']:,} bytes)")
    return 0


def _read(args: argparse.Namespace):
    from ragserve.rag.datasets import DatasetError, read_dataset, sniff_format

    try:
        fmt = sniff_format(args.dataset) if args.format == "auto" and Path(args.dataset).is_file() else args.format
        return fmt, read_dataset(args.dataset, fmt, args.limit)
    except (DatasetError, OSError) as e:
        raise CliError(str(e)) from e


def run_build_index(args: argparse.Namespace) -> int:
    from indexer.options import BuildError
    from ragserve.rag.corpus import build_dataset_index
    from ragserve.rag.datasets import DatasetError

    if args.corpus:
        output_path(args.corpus, "corpus file")
    fmt, examples = _read(args)
    try:
        manifest = build_dataset_index(examples, args.out, args.corpus, overwrite=args.overwrite,
                                       workers=args.workers, progress=sys.stderr.isatty())
    except (BuildError, DatasetError, OSError) as e:
        raise CliError(str(e)) from e
    st = manifest["stats"]
    print(f"indexed {st['num_docs']} paragraphs of {len(examples)} {fmt} questions into {args.out}")
    return 0


def _retriever(args: argparse.Namespace):
    from ragserve.commands.retrieval_options import open_retriever
    from ragserve.rag.generator import GeneratorError
    from ragserve.retrieval.rerank import RerankingSearcher, load_reranker
    from ragserve.kernels.contract import SearchError

    if args.memory:
        return _memory(args)
    check_backend(args.backend)
    searcher = open_retriever(args)
    if not args.reranker:
        return searcher
    try:
        return RerankingSearcher(searcher, load_reranker(args.reranker, device=args.reranker_device,
                                                         index=searcher.index), depth=args.rerank_depth)
    except (SearchError, GeneratorError, RuntimeError) as e:
        raise CliError(str(e)) from e


def _memory(args: argparse.Namespace):
    from ragserve.kernels.contract import SearchError
    from ragserve.memory.bank import MemoryBankError
    from ragserve.memory.reader import MemoryContext, MemoryOptions
    from ragserve.retrieval.embedder import Embedder, EmbedderError

    if not args.memory_model:
        raise CliError("--memory needs --memory-model DIR (a sentence encoder, e.g. from 'ragserve models install minilm')")
    if args.reranker or args.retriever != "bm25" or args.index:
        raise CliError("--memory retrieves from the memory of each question's context: drop --index, --retriever "
                       "and --rerank")
    try:
        opts = MemoryOptions(segment_tokens=args.segment_tokens, capacity=args.memory_capacity, k=args.memory_k,
                             backend=args.memory_backend)
        opts.check()
        return MemoryContext(Embedder(args.memory_model, device=args.embed_device), opts)
    except (EmbedderError, MemoryBankError, SearchError) as e:
        raise CliError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    missing = [f"--{n}" for n in ("dataset", "method", "model", "out") if not getattr(args, n)]
    if missing:
        raise CliError(f"missing {', '.join(missing)} (or use 'ragserve eval build-index')")
    if args.method not in NO_INDEX and not args.index and not args.memory:
        raise CliError(f"method {args.method!r} needs --index (or --memory)")
    if args.memory and args.method in NO_INDEX:
        raise CliError("--memory needs a method that retrieves")
    if args.limit is not None and args.limit < 0:
        raise CliError("--limit must be >= 0")
    if args.attention_budget is not None and args.attention is None:
        raise CliError("--attention-budget needs --attention")
    for model in (args.model, args.reranker):
        if model and (problem := model_path_problem(model)):  # before seconds of imports and loading
            raise CliError(problem)
    from ragserve.rag.base import MethodError
    from ragserve.rag.dragin import PUBLISHED
    from ragserve.rag.engine import engine_options
    from ragserve.rag.evaluate import EvalError, evaluate, format_summary, summarize
    from ragserve.rag.generator import Generator, GeneratorError
    from ragserve.rag.methods import build_method
    from ragserve.rag.profiles import profile_for
    from ragserve.rag.prompts import DEFAULT_EXEMPLARS, PromptBuilder, PromptError, load_exemplars

    output_path(args.out, "results file")
    if args.summary_json:
        output_path(args.summary_json, "summary file")
    fmt, examples = _read(args)
    if args.memory and examples and not any(ex.paragraphs for ex in examples):
        raise CliError(f"--memory reads each question's own paragraphs, and this {fmt} dataset has none")
    published = PUBLISHED.get(_family(fmt), PUBLISHED["hotpotqa"])
    try:
        generator = Generator(args.model, device=args.device, temperature=args.temperature, threads=args.threads,
                              attention=args.attention, budget=args.attention_budget,
                              engine_options=engine_options(args.step_compile, args.step_shapes))
        # settings chosen for this model on training questions; flags given on the command line win
        profile = profile_for(generator.model.config, _family(fmt))
        prompts = PromptBuilder(load_exemplars(args.prompt_file or profile.get("prompt") or DEFAULT_EXEMPLARS[fmt]),
                                yes_no=fmt == "strategyqa", fewshot=args.fewshot, passage_words=args.passage_words)
        retriever = _retriever(args) if args.method not in NO_INDEX else None
        method = build_method(
            args.method, generator, prompts, retriever, k=args.k,
            max_new_tokens=args.max_new_tokens or profile.get("max_new_tokens") or published["max_new_tokens"],
            query_max_tokens=args.query_max_tokens,
            answer_max_tokens=args.answer_max_tokens, interval=args.interval,
            sentence_max_tokens=args.sentence_max_tokens,
            theta=_first(args.theta, profile.get("flare_theta"), 0.8), beta=args.beta,
            look_ahead=args.look_ahead,
            threshold=_first(args.threshold, profile.get("dragin_threshold"), published["threshold"]),
            keep=args.keep or published["keep"])
    except (PromptError, GeneratorError, MethodError) as e:
        raise CliError(str(e)) from e

    run_info = {"method": args.method, "dataset": Path(args.dataset).name}
    context = (lambda ex: [(p.title, p.text) for p in ex.paragraphs]) if args.memory else None
    total = len(examples)

    counter = itertools.count(1)

    def progress(row: dict, resumed: bool) -> None:
        n = next(counter)
        if not args.quiet:
            tag = " (resumed)" if resumed else f" {row['seconds']:.2f}s"
            print(f"[{n}/{total}] {row['id']} em={row['em']:.0f} f1={row['f1']:.2f} "
                  f"retrievals={row['retrievals']} tokens={row['tokens']}{tag}", file=sys.stderr, flush=True)

    try:
        rows = evaluate(examples, method, args.out, run_info, progress, context)
    except EvalError as e:
        raise CliError(str(e)) from e
    summary = summarize(rows)
    print(format_summary(args.method, summary))
    if args.summary_json:
        with open(args.summary_json, "w", encoding="utf-8") as f:
            searcher = getattr(retriever, "searcher", retriever)  # the BM25 stage under a reranker
            json.dump({**run_info, "format": fmt, "backend": getattr(searcher, "backend_name", None),
                       "retriever": "memory" if args.memory else args.retriever,
                       "reranker": args.reranker, "model": args.model, "prompt": prompts.source, "k": method.k,
                       "flare_theta": getattr(method, "theta", None),
                       "dragin_threshold": getattr(method, "threshold", None), **summary}, f, indent=2)
    return 0
