"""One place that turns ``--retriever bm25|dense|hybrid`` and its settings into a retriever over an index.

Every retriever is a ``ragserve.retrieval.contract.Retriever``, so the CLI, the RAG loops and the server take any
of them. The dense side runs on the GPU when the
backend is ``gpu`` (or ``auto`` finds one), else on the CPU through faiss; BM25 runs on the backend named.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from indexer.reader import IndexReader
from indexer.segments import LiveIndex, is_live, open_live
from ragserve.kernels.contract import SearchError, StageTimes
from ragserve.kernels.registry import resolve_backend_name
from ragserve.retrieval.dense import DenseIndex, DenseOptions, DenseSearcher
from ragserve.retrieval.embedder import Embedder, EmbedderError
from ragserve.retrieval.hybrid import FusionOptions, HybridSearcher
from ragserve.retrieval.contract import Hit, Retriever
from ragserve.retrieval.live import LiveSearcher
from ragserve.retrieval.live_dense import LiveDenseSearcher, LiveHybridSearcher
from ragserve.retrieval.searcher import Searcher

RETRIEVERS = ("bm25", "dense", "hybrid")


@dataclass(frozen=True)
class RetrievalConfig:
    retriever: str = "bm25"
    backend: str = "cpu"
    backend_options: dict = field(default_factory=dict)
    dense_model: str | None = None  # query encoder; default: the model the dense part records
    embed_device: str = "auto"
    dense: DenseOptions = field(default_factory=DenseOptions)
    fusion: FusionOptions = field(default_factory=FusionOptions)


def dense_model_path(index: IndexReader, given: str | None) -> str:
    """The query encoder's directory: ``given``, or the one the dense part was built with."""
    if given:
        return given
    enc = DenseIndex(index).encoder
    if not Path(enc["path"]).is_dir():
        raise EmbedderError(f"the dense part of {index.path} was built with {enc['name']!r} from {enc['path']}, "
                            f"which is not there; pass the model directory (--dense-model DIR)")
    return enc["path"]


def load_embedder(index: IndexReader, cfg: RetrievalConfig) -> Embedder:
    return Embedder(dense_model_path(index, cfg.dense_model), device=cfg.embed_device)


def _dense_backend(backend: str) -> str:
    return "gpu" if resolve_backend_name(backend) == "gpu" else "cpu"


def _dense_searcher(reader: IndexReader, embedder: Embedder, cfg: RetrievalConfig) -> DenseSearcher:
    """On the gpu backend the backend's own ``device`` option (``--device cpu``: its kernels on the CPU) holds."""
    device = cfg.backend_options.get("device")
    return DenseSearcher(reader, embedder, backend=_dense_backend(cfg.backend), options=cfg.dense,
                         device=device if isinstance(device, str) else None)


def live_query_embedder(live: LiveIndex, cfg: RetrievalConfig) -> Embedder:
    """The query encoder of a live index's dense part: ``cfg.dense_model``, or the one it records."""
    dense = live.settings.get("dense")
    if dense is None:
        raise SearchError(f"the live index {live.path} has no dense part (its index had none when it took its first "
                          f"write); --retriever {cfg.retriever} needs one: search it with --retriever bm25")
    path = cfg.dense_model or dense["encoder"]["path"]
    if not Path(path).is_dir():
        raise EmbedderError(f"the dense part of {live.path} was built with {dense['encoder']['name']!r} from {path}, "
                            f"which is not there; pass the model directory (--dense-model DIR)")
    return Embedder(path, device=cfg.embed_device)


def open_live_searcher(index, cfg: RetrievalConfig, embedder: Embedder | None = None) -> Retriever:
    """The retriever ``cfg.retriever`` names over a live index (a ``LiveIndex`` or its directory): BM25 over its
    segments, or dense and hybrid over their dense parts where it has them. One opened here is closed with it."""
    options = {k: v for k, v in cfg.backend_options.items() if k != "queue"}  # no queue: see LiveSearcher
    if cfg.retriever == "bm25":
        return LiveSearcher(index, backend=cfg.backend, **options)
    owns = not isinstance(index, LiveIndex)
    live = open_live(index) if owns else index
    try:
        dense = LiveDenseSearcher(live, embedder or live_query_embedder(live, cfg), cfg.dense, owns_live=owns)
    except BaseException:
        if owns:
            live.close()
        raise
    if cfg.retriever == "dense":
        return dense
    return LiveHybridSearcher(LiveSearcher(live, backend=cfg.backend, **options), dense, cfg.fusion)


def open_retriever(index: str | Path | IndexReader, cfg: RetrievalConfig,
                   embedder: Embedder | None = None) -> Retriever:
    """The retriever ``cfg.retriever`` names over ``index``; raises ``SearchError``, ``EmbedderError`` or
    ``InvalidIndexError`` (``DenseIndexError``) with one line saying what is wrong."""
    if cfg.retriever not in RETRIEVERS:
        raise SearchError(f"retriever must be one of {', '.join(RETRIEVERS)}, got {cfg.retriever!r}")
    if not isinstance(index, IndexReader) and is_live(index):
        return open_live_searcher(index, cfg, embedder)
    reader = index if isinstance(index, IndexReader) else IndexReader(index)
    if cfg.retriever == "bm25":
        return Searcher(reader, backend=cfg.backend, **cfg.backend_options)
    DenseIndex(reader)  # no dense part: say so before loading a model
    embedder = embedder or load_embedder(reader, cfg)
    dense = _dense_searcher(reader, embedder, cfg)
    if cfg.retriever == "dense":
        return dense
    return HybridSearcher(Searcher(reader, backend=cfg.backend, **cfg.backend_options), dense, cfg.fusion)


class RetrieverSet(Retriever):
    """The server's retrievers over one index: BM25 always; dense and hybrid too when a dense searcher is given
    (they share one query encoder and one copy of the embeddings). ``search_batch`` takes the retriever's name;
    the one named checks k, k1 and b against its own limits."""

    kind = "set"
    takes_bm25_params = True

    def __init__(self, bm25: Searcher, dense: DenseSearcher | None = None,
                 fusion: FusionOptions = FusionOptions(), default: str = "bm25") -> None:
        self.bm25 = bm25
        self.retrievers: dict = {"bm25": bm25}
        if dense is not None:
            self.retrievers["dense"] = dense
            hybrid = LiveHybridSearcher if isinstance(bm25, LiveSearcher) else HybridSearcher
            self.retrievers["hybrid"] = hybrid(bm25, dense, fusion)
        self.default = default
        self.get(default)
        self.index = bm25.index
        self.backend_name = bm25.backend_name
        self.backend = bm25.backend
        # BM25's execution queue (None for a sharded searcher): the server's search service batches through it
        self.queue = getattr(bm25, "queue", None)

    @classmethod
    def open(cls, index: str | Path | IndexReader | LiveIndex, cfg: RetrievalConfig) -> "RetrieverSet":
        """BM25 only for ``--retriever bm25``; all three for dense or hybrid (the index needs a dense part)."""
        if cfg.retriever not in RETRIEVERS:
            raise SearchError(f"retriever must be one of {', '.join(RETRIEVERS)}, got {cfg.retriever!r}")
        cfg.fusion.check()
        if isinstance(index, LiveIndex) or (not isinstance(index, IndexReader) and is_live(index)):
            bm25 = open_live_searcher(index, replace(cfg, retriever="bm25"))
            dense = None
            if cfg.retriever != "bm25":
                try:
                    dense = LiveDenseSearcher(bm25.live, live_query_embedder(bm25.live, cfg), cfg.dense)
                except BaseException:
                    bm25.close()
                    raise
            return cls(bm25, dense, cfg.fusion, cfg.retriever)
        reader = index if isinstance(index, IndexReader) else IndexReader(index)
        dense = None
        if cfg.retriever != "bm25":
            DenseIndex(reader)
            dense = _dense_searcher(reader, load_embedder(reader, cfg), cfg)
        bm25 = Searcher(reader, backend=cfg.backend, **cfg.backend_options)
        return cls(bm25, dense, cfg.fusion, cfg.retriever)

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @property
    def names(self) -> list[str]:
        return list(self.retrievers)

    def get(self, name: str | None = None):
        name = name or self.default
        if name not in self.retrievers:
            if name in RETRIEVERS:
                raise SearchError(f"retriever {name!r} is not loaded: this server serves {', '.join(self.names)} "
                                  f"(start it with --retriever dense or hybrid on an index with a dense part)")
            raise SearchError(f"retriever must be one of {', '.join(RETRIEVERS)}, got {name!r}")
        return self.retrievers[name]

    @property
    def can_miss_shards(self) -> bool:
        """A sharded BM25 searcher may answer without some shards (``partial``); dense search has no shards."""
        return getattr(self.bm25, "can_miss_shards", False)

    def analyze(self, query: str):
        return self.bm25.analyze(query)

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None, retriever: str | None = None, missing: set[int] | None = None,
                      deadline: float | None = None) -> list[list[Hit]]:
        """``missing`` and ``deadline`` are BM25's (a sharded searcher's missing shards, its queue's deadline);
        dense and hybrid search run on the caller's thread, so neither applies to them."""
        chosen = self.get(retriever)
        extra = {}
        if chosen is self.bm25:
            extra = {n: v for n, v in (("missing", missing), ("deadline", deadline)) if v is not None}
        return chosen.search_batch(queries, k=k, k1=k1, b=b, with_text=with_text, times=times, **extra)

    def describe(self) -> dict:
        return {"default": self.default, "available": self.names}

    def close(self) -> None:
        for name in ("bm25", "dense"):  # hybrid owns nothing of its own
            if name in self.retrievers:
                self.retrievers[name].close()
