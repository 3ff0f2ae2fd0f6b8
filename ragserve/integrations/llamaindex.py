"""A LlamaIndex retriever over a ragserve index (``pip install 'ragserve[llamaindex]'``)::

    from ragserve.integrations.llamaindex import RagserveRetriever

    retriever = RagserveRetriever(index="indexes/arguana", k=10)            # in this process
    retriever = RagserveRetriever(url="http://127.0.0.1:8080", api_key=KEY)  # a running ragserve serve
    nodes = retriever.retrieve("nuclear power is safe")

Each ``NodeWithScore`` has the retriever's score (e.g. the f32 BM25 score) and a ``TextNode`` whose ``id_`` is the
corpus's document id, whose text is the passage and whose ``metadata`` holds ``id``, ``score``, ``rank``,
``title`` and ``docid``.
"""
from __future__ import annotations

from pathlib import Path

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"ragserve.integrations.llamaindex needs llama-index-core: pip install "
                      f"'ragserve[llamaindex]' ({e})") from e

from ragserve.integrations.hits import RetrievalError, SearchSettings, open_hits

__all__ = ["RagserveRetriever", "RetrievalError"]


class RagserveRetriever(BaseRetriever):
    """Exactly one of ``index`` (a directory, searched here with ``backend``) or ``url`` (a server)."""

    def __init__(self, index: str | Path | None = None, *, url: str | None = None, api_key: str | None = None,
                 k: int = 10, retriever: str = "bm25", k1: float | None = None, b: float | None = None,
                 backend: str = "cpu", timeout: float = 30.0, callback_manager: CallbackManager | None = None,
                 verbose: bool = False) -> None:
        settings = SearchSettings(retriever=retriever, k1=k1, b=b, backend=backend)
        self._hits = open_hits(index, url, api_key, settings, timeout)
        self.k = k
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        # excluded from what an LLM or an embedding sees: the passage is the node's content
        keys = ["id", "score", "rank", "title", "docid"]
        return [NodeWithScore(node=TextNode(id_=h.id, text=h.text, metadata=h.metadata,
                                            excluded_llm_metadata_keys=keys, excluded_embed_metadata_keys=keys),
                              score=h.score)
                for h in self._hits.search(query_bundle.query_str, self.k)]

    def close(self) -> None:
        """Release the in-process searcher (its backend); nothing to do for a server."""
        self._hits.close()
