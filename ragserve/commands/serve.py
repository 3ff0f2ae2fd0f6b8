"""``ragserve serve``: the HTTP search and question-answering server (flask under waitress)."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from ragserve.cli import CliError
from ragserve.commands import add_backend_arg, check_backend, check_cuda
from ragserve.model_path import model_path_problem

ENV_API_KEY = "RAGSERVE_API_KEY"
WAITRESS_BODY_SLACK = 1 << 20


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve search and answers over HTTP (JSON API, web page, metrics)",
                       description="Start the HTTP server: POST /v1/search, POST /v1/answer, GET /metrics, "
                                   "a web page at /. Binds to 127.0.0.1 unless --host says otherwise; a "
                                   "non-loopback bind needs an API key. SIGTERM finishes in-flight requests.")
    p.add_argument("--index", required=True, metavar="DIR", help="index directory (ragserve index)")
    p.add_argument("--model", metavar="PATH", help="generator: a model directory, an installed short name (gemma-270m: "
                                                   "'ragserve models install gemma-270m') or a hub id in the local "
                                                   "cache; without it /v1/answer is off")
    add_backend_arg(p)
    p.add_argument("--xclbin", help="FPGA bitstream for --backend fpga")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--api-key", metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' (default: ${ENV_API_KEY} if set)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="server processes sharing the port, each with its own index, backend and warm-up "
                        "(default 1: this process serves); /readyz is ready once all have warmed up")
    p.add_argument("--threads", type=int, default=16,
                   help="HTTP worker threads (default 16); a waiting answer holds one, so keep it above "
                        "--max-pending-answers")
    p.add_argument("--search-slots", type=int, default=0,
                   help="cpu backend: searches run at once (default: one per core; with --ray: shard-group "
                        "fan-outs at once, default max(4, groups)); a device backend runs one launch at a time, "
                        "batching the searches that arrive together")
    p.add_argument("--queue-wait-ms", type=float, default=1.0,
                   help="device backends, under load: how long a launch waits for more searches to join "
                        "(default 1 ms; a lone search never waits)")
    p.add_argument("--queue-max-batch", type=int, default=64,
                   help="device backends: most queries batched into one launch (default 64)")
    lv = p.add_argument_group("live index (indexer/FORMAT.md, 'Live index')")
    lv.add_argument("--writes", action="store_true",
                    help="take writes: POST /v1/documents adds or replaces, DELETE /v1/documents deletes (behind the "
                         "API key when one is set); a plain index becomes a live one")
    lv.add_argument("--refresh-interval", type=float, default=1.0, metavar="S",
                    help="seconds until a write is searchable (default 1.0); without --writes, how often a live "
                         "index is checked for commits of another writer")
    lv.add_argument("--merge-max-segments", type=int, default=6, metavar="N",
                    help="with --writes: merge adjacent segments in the background above this many (default 6)")
    gen = p.add_argument_group("generation (with --model)")
    gen.add_argument("--device", default="auto", help="generator device: auto (cuda if available), cpu, cuda[:N]")
    gen.add_argument("--exemplars", default="multihop.txt",
                     help="few-shot exemplar file, a path or a name in ragserve/prompts (default multihop.txt)")
    gen.add_argument("--reranker", "--rerank", dest="reranker", metavar="MODEL",
                     help="reranker of the two-stage method: a cross-encoder or a sentence encoder (bi-encoder)")
    gen.add_argument("--rerank-depth", type=int, default=100, help="first-stage hits the reranker rescores (default 100)")
    gen.add_argument("--memory-model", metavar="DIR",
                     help="sentence encoder that reads a request's long 'context' into memory (memory as context)")
    gen.add_argument("--segment-tokens", type=int, default=128, help="memory: encoder tokens per segment (default 128)")
    gen.add_argument("--memory-capacity", type=int, default=65536,
                     help="memory: segments held before the oldest is evicted (default 65536)")
    gen.add_argument("--memory-k", type=int, default=5, help="memory: earlier segments each segment recalls (default 5)")
    gen.add_argument("--memory-backend", default="cpu", choices=["cpu", "gpu", "fpga-sim"],
                     help="memory bank's device (default cpu)")
    gen.add_argument("--max-new-tokens", type=int, default=256,
                     help="largest token option (max_new_tokens, look_ahead, ...) a client may ask for (default 256)")
    gen.add_argument("--attention", metavar="M", help="sparse attention for decode steps: dense, dsa, quest, lserve, "
                                                      "seer-topk, seer-threshold (default: the model's own)")
    gen.add_argument("--attention-budget", type=int, metavar="K", help="tokens each decode step attends (default 2048)")
    gen.add_argument("--step-compile", default="auto", choices=["auto", "on", "off"],
                     help="compile the fast engine's static decode step (torch.compile): auto (on CUDA with "
                      "Triton), on, off (default auto)")
    gen.add_argument("--step-shapes", default="bucketed", choices=["bucketed", "fixed"],
                     help="the static decode step's shapes: bucketed (the slots and cache columns in use, rounded "
                     "up to powers of two) or fixed (every slot and column: an answer's bits never depend on "
                     "the others decoding beside it, at the cost of reading every cache) (default bucketed)")
    gen.add_argument("--prefill-lanes", type=int, default=1, metavar="N",
                     help="prompts prefilled at once, each on a thread of its own with an equal share of torch's "
                          "threads: on a CPU, with several answers in flight, every core works (one prompt uses "
                          "a core at about half its matmul rate); default 1: one prompt at a time")
    from ragserve.commands.retrieval_options import add_retriever_args

    add_retriever_args(p, rerank=False)
    mem = p.add_argument_group("memory bank (/v1/memory)")
    mem.add_argument("--memory", metavar="DIR",
                     help="serve this persisted memory bank at /v1/memory (ragserve memory ...); a new DIR is made "
                          "with --memory-model and --memory-capacity; --memory-backend runs its recall")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-query-chars", type=int, default=2000, help="longest query or question (default 2000)")
    lim.add_argument("--max-batch", type=int, default=64, help="most queries in one search batch (default 64)")
    lim.add_argument("--max-k", type=int, default=100, help="largest k a client may ask for (default 100)")
    lim.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)")
    lim.add_argument("--request-timeout", type=float, default=60.0,
                     help="seconds a request may wait for the backend or the generator, then 504 (default 60)")
    lim.add_argument("--max-pending-answers", type=int, default=8,
                     help="answers queued or running on the generator before 503 (default 8)")
    lim.add_argument("--concurrent-answers", type=int, default=8, metavar="N",
                     help="answers generated at once, their decode steps batched into one forward pass; the "
                          "other pending answers wait (default 8)")
    lim.add_argument("--attention-max-budget", type=int, default=131072, metavar="K",
                     help="largest attention budget a /v1/answer request may set (default 131072)")
    lim.add_argument("--shutdown-grace", type=float, default=30.0,
                     help="seconds to finish in-flight requests after SIGTERM (default 30)")
    ray = p.add_argument_group("Ray (needs ragserve[ray]; the index on a file system every node sees)")
    ray.add_argument("--ray", metavar="ADDRESS",
                     help="serve on Ray Serve at the cluster ADDRESS (local: start one here): shard groups on Ray "
                          "actors with --backend, the same API; the generator as its own deployment")
    ray.add_argument("--ray-groups", type=int, default=0, metavar="N",
                     help="shard groups, one actor each (default: as many as the cluster holds, at most one a shard)")
    ray.add_argument("--ray-group-cpus", type=float, default=1.0, help="CPUs a group's actor reserves (default 1)")
    ray.add_argument("--ray-group-gpus", type=float, default=0.0,
                     help="GPUs a group's actor reserves with --backend gpu (e.g. 0.25: four share a GPU)")
    ray.add_argument("--ray-replicas", type=int, default=1, help="HTTP ingress replicas (default 1)")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace):
    from ragserve.retrieval.contract import MAX_K
    from ragserve.server.config import ServerConfig
    from ragserve.server.workers import MAX_WORKERS

    if not 1 <= args.max_k <= MAX_K:
        raise CliError(f"--max-k must be between 1 and {MAX_K}, got {args.max_k}")
    if args.prefill_lanes < 1:
        raise CliError(f"--prefill-lanes must be >= 1, got {args.prefill_lanes}")
    if args.threads <= args.max_pending_answers:
        # Each queued answer holds an HTTP thread while it waits; searches must still find a free one.
        raise CliError(f"--threads ({args.threads}) must be larger than --max-pending-answers "
                       f"({args.max_pending_answers})")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise CliError(f"--workers must be between 1 and {MAX_WORKERS}, got {args.workers}")
    if args.workers > 1 and args.ray:
        raise CliError("--workers runs local processes; on Ray use --ray-replicas")
    if args.memory and (args.workers > 1 or args.ray):
        raise CliError("--memory is held by one process: it runs without --workers and --ray")
    if args.writes and (args.workers > 1 or args.ray):
        raise CliError("--writes needs one writer process: it runs without --workers and --ray")
    if not 0 < args.refresh_interval <= 3600 or args.merge_max_segments < 2:
        raise CliError("--refresh-interval must be between 0 and 3600 seconds and --merge-max-segments at least 2")
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be between 0 and 65535, got {args.port}")
    if args.search_slots < 0 or args.shutdown_grace < 0:
        raise CliError("--search-slots and --shutdown-grace must not be negative")
    if not 0 <= args.queue_wait_ms <= 1000 or args.queue_max_batch < 1:
        raise CliError("--queue-wait-ms must be between 0 and 1000 and --queue-max-batch at least 1")
    api_key = args.api_key if args.api_key is not None else os.environ.get(ENV_API_KEY) or None
    try:
        return ServerConfig(max_query_chars=args.max_query_chars, max_batch=args.max_batch, max_k=args.max_k,
                            max_body_bytes=args.max_body_bytes, request_timeout_s=args.request_timeout,
                            max_pending_answers=args.max_pending_answers,
                            concurrent_answers=args.concurrent_answers, api_key=api_key,
                            max_attention_budget=args.attention_max_budget)
    except ValueError as e:
        raise CliError(str(e)) from e


def run(args: argparse.Namespace) -> int:
    from ragserve.server.auth import is_loopback_host
    from ragserve.server.workers import WorkerInfo

    cfg = _config(args)
    if cfg.api_key is None and not is_loopback_host(args.host):
        raise CliError(f"refusing to bind to non-loopback address {args.host!r} without an API key "
                       f"(pass --api-key or set {ENV_API_KEY})")
    if args.workers > 1:
        return _serve_workers(args, cfg)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.ray:
        _check_startup(args)
        if args.retriever != "bm25" or args.memory_model:
            raise CliError("--ray serves BM25 shards: --retriever dense/hybrid and --memory-model run without it")
        return _serve_on_ray(args, cfg)

    def announce(event: dict) -> None:
        print(_listening_line(args, event), file=sys.stderr, flush=True)

    return _serve_process(args, cfg, WorkerInfo(), threading.Event(), None, announce)


def _listening_line(args: argparse.Namespace, event: dict) -> str:
    workers = f", {args.workers} workers" if args.workers > 1 else ""
    return "\n".join(
        # Tests and scripts read this line to find the port when --port 0 was given.
        f"ragserve serve: listening on http://{f'[{host}]' if ':' in host else host}:{port} (index {args.index}, "
        f"backend {event['backend']}, retriever {args.retriever}, model {args.model or 'none'}{workers}); /readyz "
        f"says when warmed up" for host, port in event["addresses"])


def _serve_workers(args: argparse.Namespace, cfg) -> int:
    """``--workers N``: bind here, fork the workers, supervise them (``ragserve.server.workers``)."""
    from ragserve.server.runner import bind_sockets
    from ragserve.server.workers import WorkerFailed, WorkerInfo, run_workers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(name)s %(levelname)s %(message)s")
    try:
        sockets = bind_sockets(args.host, args.port)
    except OSError as e:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e

    def worker_main(info: WorkerInfo, stop: threading.Event) -> int:
        logging.basicConfig(level=logging.INFO, force=True,
                            format=f"%(asctime)s worker {info.id} %(name)s %(levelname)s %(message)s")
        try:
            return _serve_process(args, cfg, info, stop, sockets, lambda event: info.send(event="listening", **event))
        except CliError as e:
            raise WorkerFailed(str(e), 2) from None

    try:
        return run_workers(args.workers, sockets, worker_main, lambda event: print(
            _listening_line(args, event), file=sys.stderr, flush=True), args.shutdown_grace)
    except WorkerFailed as e:
        if e.status == 2:
            raise CliError(str(e)) from None
        print(f"ragserve serve: {e}", file=sys.stderr, flush=True)
        return e.status


def _check_startup(args: argparse.Namespace) -> None:
    """Settings that would only fail later, in the background: refuse to start instead."""
    _check_attention(args)
    for model in (args.model, args.reranker, args.memory_model):
        if model and (problem := model_path_problem(model)):
            raise CliError(problem)
    check_cuda([f"{option} {value}" for option, value, used in (
        ("--device", args.device, args.model), ("--embed-device", args.embed_device, True),
        ("--memory-backend", args.memory_backend, args.memory_model)) if used and value.startswith(("cuda", "gpu"))])


def _serve_process(args: argparse.Namespace, cfg, worker, stop: threading.Event, sockets: list | None,
                   on_listening) -> int:
    """Open the index and serve on this process until stopped: the whole server (``--workers 1``) or one worker.
    ``on_listening({"addresses", "backend"})`` once the sockets accept."""
    from indexer.reader import InvalidIndexError
    from ragserve.commands.retrieval_options import retrieval_config
    from ragserve.kernels.contract import SearchError
    from ragserve.retrieval.embedder import EmbedderError
    from ragserve.retrieval.factory import RetrieverSet
    from ragserve.retrieval.queue import QueueSettings
    from ragserve.server.app import create_app
    from ragserve.server.metrics import ServerMetrics
    from ragserve.server.runner import serve
    from ragserve.server.warmup import Warmup

    _check_startup(args)
    opts = {"xclbin": args.xclbin} if args.xclbin else {}
    check_backend(args.backend)
    live, maintenance = _open_live(args)
    try:
        queue = QueueSettings(max_wait_ms=args.queue_wait_ms, max_batch=args.queue_max_batch,
                              parallel=args.search_slots)
        # the BM25 searcher's queue settings ride with the backend options (Searcher takes them by name)
        searcher = RetrieverSet.open(live or args.index, retrieval_config(args, {**opts, "queue": queue}))
    except (InvalidIndexError, SearchError, EmbedderError, RuntimeError) as e:
        if live is not None:
            live.close()
        raise CliError(str(e)) from e
    try:
        memory = _memory_store(args) if args.memory else None
    except BaseException:
        searcher.close()
        raise
    metrics = ServerMetrics()
    try:
        answers = _answer_service(args, cfg, searcher, metrics) if args.model else None
    except BaseException:
        searcher.close()
        if memory is not None:
            memory.close()
        raise
    warmup = Warmup(searcher, answers)
    writes = None
    if live is not None:
        from ragserve.server.documents import LiveWrites

        writes = LiveWrites(live, args.refresh_interval)
        maintenance.start()
    app = create_app(searcher, cfg, answers=answers, metrics=metrics, warmup=warmup, worker=worker, writes=writes,
                     memory=memory,
                     search_slots=max(1, args.search_slots or os.cpu_count() or 1) if live is not None else 1)

    def announce(addresses: list[tuple[str, int]]) -> None:
        on_listening({"addresses": addresses, "backend": searcher.backend_name})
        warmup.start(on_failure=lambda _error: stop.set(), on_ready=worker.mark_warm)

    try:
        # waitress refuses (plain-text 413) bodies so large they are not worth buffering; smaller ones over
        # the limit reach flask, which answers with the JSON error. send_bytes=1: write each chunk as soon
        # as the app yields it, so server-sent events are not held back. A worker's parent relays SIGINT.
        rc = serve(app, args.host, args.port, args.threads, args.shutdown_grace, announce, stop=stop,
                   sockets=sockets, stop_signals=(signal.SIGTERM,) if sockets else (signal.SIGTERM, signal.SIGINT),
                   max_request_body_size=cfg.max_body_bytes + WAITRESS_BODY_SLACK, send_bytes=1,
                   channel_timeout=300)
    except OSError as e:  # port in use, address not available
        raise CliError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    finally:
        warmup.cancel()
        if answers is not None:
            answers.close()
        if maintenance is not None:
            maintenance.stop()
        if memory is not None:
            memory.close()
        searcher.close()
        if live is not None:
            live.close()
    if warmup.error:
        raise CliError(warmup.error)
    return rc


def _memory_store(args: argparse.Namespace):
    """The persisted memory bank of --memory, its encoder loaded now (a bad one fails the start, not a request)."""
    from pathlib import Path

    from ragserve.memory.store import SETTINGS, MemoryStore, MemoryStoreError
    from ragserve.retrieval.embedder import EmbedderError

    new = not (Path(args.memory) / SETTINGS).is_file()
    if new and not args.memory_model:
        raise CliError(f"--memory {args.memory} is a new memory bank: give its sentence encoder with --memory-model")
    try:
        store = MemoryStore(args.memory, args.memory_model, backend=args.memory_backend,
                            capacity=args.memory_capacity if new else None, embed_device=args.embed_device)
    except (MemoryStoreError, EmbedderError) as e:
        raise CliError(str(e)) from None
    try:
        store.embedder  # noqa: B018 - loaded (and checked against the bank) before the port opens
    except EmbedderError as e:
        store.close()
        raise CliError(str(e)) from None
    return store


def _open_live(args: argparse.Namespace):
    """(the live index, its maintenance thread, not started) for --writes or a live index; (None, None) else."""
    from indexer.reader import InvalidIndexError
    from indexer.segments import LiveIndex, LiveIndexError, MergePolicy, is_live
    import ragserve.retrieval.live_dense  # noqa: F401 - writes the segments' dense parts, where there are any
    from ragserve.server.documents import LiveMaintenance

    if not args.writes and not is_live(args.index):
        return None, None
    if args.ray:
        raise CliError("a live index is served without --ray")
    try:
        live = LiveIndex(args.index, writable=args.writes, policy=MergePolicy(max_segments=args.merge_max_segments),
                         dense_model=args.dense_model)
    except (LiveIndexError, InvalidIndexError) as e:
        raise CliError(str(e)) from None
    return live, LiveMaintenance(live, args.refresh_interval)


def _serve_on_ray(args: argparse.Namespace, cfg) -> int:
    from indexer.reader import InvalidIndexError
    from ragserve.distributed import RayUnavailable

    if args.ray_groups < 0 or args.ray_replicas < 1 or args.ray_group_cpus < 0 or args.ray_group_gpus < 0:
        raise CliError("--ray-groups, --ray-group-cpus and --ray-group-gpus must not be negative, "
                       "--ray-replicas at least 1")
    try:
        from ragserve.distributed.serve import serve_on_ray

        return serve_on_ray(args, cfg)
    except (RayUnavailable, InvalidIndexError, ValueError) as e:
        raise CliError(str(e)) from e


def _answer_service(args: argparse.Namespace, cfg, searcher, metrics):
    from ragserve.rag.batcher import BatchSettings
    from ragserve.rag.engine import engine_options
    from ragserve.server.answering import AnswerService

    from ragserve.kernels.contract import SearchError
    from ragserve.memory.reader import MemoryOptions
    from ragserve.retrieval.embedder import EmbedderError, read_encoder_config

    if args.max_new_tokens < 1 or args.rerank_depth < 1:
        raise CliError("--max-new-tokens and --rerank-depth must be at least 1")
    memory = MemoryOptions(segment_tokens=args.segment_tokens, capacity=args.memory_capacity, k=args.memory_k,
                           backend=args.memory_backend)
    try:
        memory.check()
        if args.memory_model:
            read_encoder_config(args.memory_model)  # not a sentence encoder: say so now, not at the first request
        return AnswerService(args.model, searcher, cfg, metrics, device=args.device, exemplars=args.exemplars,
                             reranker=args.reranker, rerank_depth=args.rerank_depth,
                             max_new_tokens=args.max_new_tokens, attention=args.attention,
                             attention_budget=args.attention_budget, memory_model=args.memory_model,
                             memory_options=memory,
                             engine_options=engine_options(args.step_compile, args.step_shapes),
                             batch=BatchSettings(prefill_lanes=args.prefill_lanes) if args.prefill_lanes > 1 else None)
    except (OSError, ValueError, SearchError, EmbedderError) as e:
        raise CliError(str(e)) from e


def _check_attention(args: argparse.Namespace) -> None:
    """Bad --attention settings fail at start, not when the model has loaded in the background."""
    from ragserve.attention import AttentionError, get_method

    if args.attention is None:
        if args.attention_budget is not None:
            raise CliError("--attention-budget needs --attention")
        return
    opts = {} if args.attention_budget is None else {"budget": args.attention_budget}
    try:
        get_method(args.attention, **opts).check_budget()
    except AttentionError as e:
        raise CliError(str(e)) from e
