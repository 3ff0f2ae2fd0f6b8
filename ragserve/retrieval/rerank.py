"""Two-stage retrieval: a first stage's top-N (BM25, dense or hybrid), then a real model rescores the (query,
passage) pairs and keeps the top k. The model is a cross-encoder (``AutoModelForSequenceClassification``) or a
bi-encoder (a sentence encoder: the inner product of the query's and each passage's embedding); ``load_reranker``
tells them apart.

A bi-encoder takes the passage embeddings from the index's dense part when it was built with the same model (the
stored fp16 vectors: what the encoder gave, rounded to fp16), otherwise it embeds the passages on the spot.

``RerankingSearcher`` is a ``Retriever`` wrapping a ``Retriever``. Model scoring is counted as relevancy time, the
final sort as retrieval time.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from indexer.reader import IndexReader
from ragserve.kernels.contract import SearchError, StageTimes
from ragserve.model_path import model_dir, model_path_problem
from ragserve.retrieval.contract import Hit, Retriever
from ragserve.retrieval.dense import DENSE_DIR, DenseIndex, passage_text
from ragserve.retrieval.embedder import Embedder, EmbedderError, read_encoder_config, resolve_device


class RerankerError(SearchError):
    """A model that cannot rerank here (no model directory, a failed load, bad settings, an unusable device)."""


class CrossEncoder:
    kind = "cross-encoder"

    def __init__(self, model: str, device: str = "auto", batch_size: int = 32, max_length: int = 256) -> None:
        if problem := model_path_problem(model):
            raise RerankerError(problem)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1 or max_length < 8:
            raise RerankerError("batch_size must be >= 1 and max_length >= 8")
        try:
            self.device = resolve_device(device)
        except EmbedderError as e:
            raise RerankerError(str(e)) from None
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir(model))
            self.model = AutoModelForSequenceClassification.from_pretrained(model_dir(model), dtype=dtype)
        except (OSError, ValueError) as e:
            raise RerankerError(f"cannot load a cross-encoder from {model!r}: {e}") from e
        self.model.to(self.device).eval()
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = min(max_length, limit) if limit else max_length
        self.batch_size = batch_size
        self.name = model

    @torch.inference_mode()
    def score(self, query: str, passages: list[str]) -> np.ndarray:
        """Relevance of each passage to the query (the positive-class logit; the only logit of a 1-label model)."""
        out = []
        for i in range(0, len(passages), self.batch_size):
            chunk = passages[i:i + self.batch_size]
            enc = self.tokenizer([query] * len(chunk), chunk, padding=True, truncation="only_second",
                                 max_length=self.max_length, return_tensors="pt").to(self.device)
            logits = self.model(**enc).logits
            out.append(logits[:, -1].float().cpu())
        return torch.cat(out).numpy() if out else np.zeros(0, np.float32)

    def rescore_batch(self, queries: list[str], hits: list[list[Hit]]) -> list[np.ndarray]:
        return [self.score(q, [f"{h.title}: {h.text}" if h.title else h.text for h in hs])
                for q, hs in zip(queries, hits)]


class BiEncoderReranker:
    kind = "bi-encoder"

    def __init__(self, embedder: Embedder, index: IndexReader | None = None) -> None:
        self.embedder = embedder
        self.name = embedder.info.name
        self.stored: np.ndarray | None = None
        if index is not None and (index.path / DENSE_DIR).is_dir():
            dense = DenseIndex(index)
            try:
                embedder.check_same_model(dense.encoder, "the dense part")
                self.stored = dense.embeddings
            except EmbedderError:
                pass  # another model's embeddings: embed the passages instead

    def passage_vectors(self, hits: list[Hit]) -> np.ndarray:
        if self.stored is not None:
            return np.asarray(self.stored[np.asarray([h.docid for h in hits], dtype=np.int64)], dtype=np.float32)
        return self.embedder.encode([passage_text(h.title, h.text) for h in hits])

    def rescore(self, query: str, hits: list[Hit]) -> np.ndarray:
        """The model's relevance of each hit to the query (f32), in the hits' order."""
        return self.rescore_batch([query], [hits])[0]

    def rescore_batch(self, queries: list[str], hits: list[list[Hit]]) -> list[np.ndarray]:
        qv = self.embedder.encode(queries)
        return [self.passage_vectors(hs) @ q if hs else np.zeros(0, np.float32) for q, hs in zip(qv, hits)]


def load_reranker(model: str, device: str = "auto", index: IndexReader | None = None):
    """A bi-encoder for a sentence-encoder directory (its stored embeddings in ``index``'s dense part reused when
    they are the same model's), else a cross-encoder."""
    try:
        read_encoder_config(model)
    except EmbedderError:
        return CrossEncoder(model, device=device)
    try:
        return BiEncoderReranker(Embedder(model, device=device), index)
    except EmbedderError as e:
        raise RerankerError(str(e)) from None


class RerankingSearcher(Retriever):
    """A first stage's top ``depth`` re-scored by a model: a retriever wrapping a retriever (k1 and b go to the
    first stage). Hit scores are the model's."""

    kind = "rerank"
    takes_bm25_params = True

    def __init__(self, searcher: Retriever, reranker, depth: int = 100) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= searcher.max_k:
            raise SearchError(f"rerank depth must be between 1 and {searcher.max_k} (the first stage's limit), "
                              f"got {depth!r}")
        self.searcher = searcher
        self.reranker = reranker
        self.depth = depth
        self.index = searcher.index
        self.backend_name = searcher.backend_name

    @property
    def max_k(self) -> int:
        return self.searcher.max_k

    def describe(self) -> dict:
        return {"retriever": "rerank", "model": self.reranker.name, "depth": self.depth,
                "first_stage": self.searcher.describe()}

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None) -> list[list[Hit]]:
        """The first stage's top-``depth`` then the model's top ``k``; hit scores are the model's, ties kept in
        the first stage's order."""
        kw = {"k1": k1, "b": b} if k1 is not None or b is not None else {}
        first = self.searcher.search_batch(queries, k=max(self.depth, k), times=times, **kw)
        t0 = time.perf_counter()
        scores = self.reranker.rescore_batch(queries, first)
        t1 = time.perf_counter()
        out = []
        for hs, sc in zip(first, scores):
            order = sorted(range(len(hs)), key=lambda i: (-sc[i], i))[:k]
            out.append([Hit(docid=hs[i].docid, id=hs[i].id, score=float(sc[i]), title=hs[i].title if with_text else "",
                            text=hs[i].text if with_text else "") for i in order])
        if times is not None:
            times.relevancy += t1 - t0
            times.retrieval += time.perf_counter() - t1
        return out

    def close(self) -> None:
        self.searcher.close()
