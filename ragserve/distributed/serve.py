"""``ragserve serve --ray``: the same HTTP API on Ray Serve.

Three kinds of replica: the shard groups (``shards.ShardGroup`` actors, named and detached so every ingress
replica reaches the same ones; Ray restarts them from their files), the HTTP ingress (a Serve deployment that
runs the very flask app of ``ragserve.server.app`` over a ``DistributedSearcher``, so routes, validation and
errors are the local server's), and, with ``--model``, the generator in a deployment of its own, which the
ingress's answer service calls through ``RemoteGenerator``.
"""
from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import warnings
from typing import Any

from ray import serve
from starlette.applications import Starlette
from starlette.routing import Mount

from ragserve.distributed import connect
from ragserve.distributed.errors import RayUnavailable
from ragserve.distributed.shards import DistributedSearcher, GroupOptions
from ragserve.server.config import ServerConfig

with warnings.catch_warnings():  # deprecated in favour of a2wsgi, which would be one more dependency
    warnings.simplefilter("ignore")
    from starlette.middleware.wsgi import WSGIMiddleware

APP = "ragserve"
log = logging.getLogger("ragserve.server")
GENERATOR_CALLS = ("count_tokens", "truncate", "encode", "generate", "attention")


@serve.deployment(ray_actor_options={"num_cpus": 0})
class GeneratorDeployment:
    """The generator in its own replica (own device, own memory), called by every ingress replica."""

    def __init__(self, model: str, device: str) -> None:
        from ragserve.rag.generator import Generator

        self.generator = Generator(model, device=device)

    def attributes(self) -> dict:
        g = self.generator
        return {"name": g.name, "device": g.device, "dtype": str(g.dtype), "bos_id": g.bos_id,
                "max_positions": g.max_positions}

    def call(self, method: str, *args: Any) -> Any:
        if method not in GENERATOR_CALLS:
            raise ValueError(f"not a generator call: {method}")
        return getattr(self.generator, method)(*args)


class RemoteGenerator:
    """What the RAG methods use of a ``Generator``, answered by the generator deployment."""

    def __init__(self, handle) -> None:
        self._handle = handle
        attrs = handle.attributes.remote().result()
        self.name, self.device, self.dtype = attrs["name"], attrs["device"], attrs["dtype"]
        self.bos_id, self.max_positions = attrs["bos_id"], attrs["max_positions"]

    def _call(self, method: str, *args: Any) -> Any:
        return self._handle.call.remote(method, *args).result()

    def count_tokens(self, text: str) -> int:
        return self._call("count_tokens", text)

    def truncate(self, text: str, max_tokens: int) -> str:
        return self._call("truncate", text, max_tokens)

    def encode(self, text: str):
        return self._call("encode", text)

    def generate(self, prompt: str, max_new_tokens: int, stop: str = "line"):
        return self._call("generate", prompt, max_new_tokens, stop)

    def attention(self, ids: list[int]):
        return self._call("attention", ids)


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress()
class HttpIngress:
    """The flask app of the local server over the shard groups, behind Serve's HTTP proxy."""

    def __init__(self, index: str, address: str, plan: list[list[int]], options: GroupOptions, name: str,
                 config: ServerConfig, search_slots: int, timeout_s: float, generator=None,
                 answer_options: dict | None = None) -> None:
        from ragserve.server.app import create_app
        from ragserve.server.metrics import ServerMetrics

        self.searcher = DistributedSearcher(index, ray=address, groups=plan, options=options, name=name,
                                            timeout_s=timeout_s)
        metrics = ServerMetrics()
        self.answers = None
        if generator is not None:
            from ragserve.server.answering import AnswerService

            self.answers = AnswerService(answer_options["model"], self.searcher, config, metrics,
                                         device=answer_options["device"], exemplars=answer_options["exemplars"],
                                         reranker=answer_options["reranker"],
                                         rerank_depth=answer_options["rerank_depth"],
                                         max_new_tokens=answer_options["max_new_tokens"],
                                         load_generator=lambda model, device: RemoteGenerator(generator))
        self.flask_app = create_app(self.searcher, config, answers=self.answers, metrics=metrics,
                              search_slots=search_slots)

    def __serve_build_asgi_app__(self):
        # Starlette answers the ASGI lifespan events Serve sends; every path goes to the flask app.
        return Starlette(routes=[Mount("/", app=WSGIMiddleware(self.flask_app))])


def free_port(host: str) -> int:
    """A port free on ``host`` now (Serve's proxy needs a number; ``--port 0`` picks one this way)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_on_ray(args: argparse.Namespace, config: ServerConfig) -> int:
    """Deploy the API on the cluster at ``args.ray``, announce it, run until SIGTERM/SIGINT, then take it down."""
    ray = connect(args.ray)
    if _serve_running(ray):
        # Serve has one HTTP proxy configuration per cluster: another application's host and port would not be
        # the ones asked for here.
        raise RayUnavailable("Ray Serve already runs on this cluster; ragserve serve --ray starts and stops its "
                             "own (shut the other one down, or use another cluster)")
    port = args.port or free_port(args.host)
    name = f"ragserve-{port}"
    backend = args.backend if args.backend != "auto" else ("gpu" if args.ray_group_gpus > 0 else "cpu")
    options = GroupOptions(backend=backend, num_cpus=args.ray_group_cpus, num_gpus=args.ray_group_gpus,
                           backend_options={"xclbin": args.xclbin} if args.xclbin else {},
                           resources={"fpga": 1.0} if backend == "fpga" else {})
    # The groups start (files checked) before the API is deployed, so a bad index fails here, not in a replica.
    searcher = DistributedSearcher(args.index, ray=args.ray, groups=args.ray_groups or None, options=options,
                                   name=name, timeout_s=args.request_timeout)
    try:
        serve.start(http_options={"host": args.host, "port": port})
        generator, answer_options = None, None
        if args.model:
            gpus = 1 if args.device.startswith("cuda") else 0
            generator = GeneratorDeployment.options(ray_actor_options={"num_cpus": 0, "num_gpus": gpus}).bind(
                args.model, args.device)
            answer_options = {"model": args.model, "device": args.device, "exemplars": args.exemplars,
                              "reranker": args.reranker, "rerank_depth": args.rerank_depth,
                              "max_new_tokens": args.max_new_tokens}
        slots = args.search_slots or max(4, len(searcher.plan))
        app = HttpIngress.options(num_replicas=args.ray_replicas, max_ongoing_requests=args.threads).bind(
            str(searcher.index.path.resolve()), args.ray, searcher.plan, options, name, config, slots,
            args.request_timeout, generator, answer_options)
        serve.run(app, name=APP, route_prefix="/", blocking=False)
        host = f"[{args.host}]" if ":" in args.host else args.host
        # The same line as the local server: tests and scripts read the port from it.
        print(f"ragserve serve: listening on http://{host}:{port} (index {args.index}, backend {backend} on "
              f"Ray: {len(searcher.plan)} shard groups, model {args.model or 'none'})", file=sys.stderr, flush=True)
        _wait_for_signal()
        return 0
    finally:
        try:
            serve.shutdown()  # this command's Serve instance (checked free at the start), proxies included
        finally:
            searcher.shutdown()
            ray.shutdown()


def _serve_running(ray) -> bool:
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        return True
    except ValueError:
        return False


def _wait_for_signal() -> None:
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(0.2):
            pass
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    log.info("shutting down the Ray Serve application")
