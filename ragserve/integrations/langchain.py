"""A LangChain retriever over a ragserve index (``pip install 'ragserve[langchain]'``)::

    from ragserve.integrations.langchain import RagserveRetriever

    retriever = RagserveRetriever(index="indexes/arguana", k=10)            # in this process
    retriever = RagserveRetriever(url="http://127.0.0.1:8080", api_key=KEY)  # a running ragserve serve
    docs = retriever.invoke("nuclear power is safe")

Each ``Document`` has the corpus's document id as ``id``, the passage as ``page_content`` and ``metadata`` with
``id``, ``score`` (the retriever's, e.g. the f32 BM25 score), ``rank``, ``title`` and ``docid``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict, Field, PrivateAttr
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"ragserve.integrations.langchain needs langchain-core: pip install 'ragserve[langchain]' "
                      f"({e})") from e

from ragserve.integrations.hits import HitSource, RetrievalError, SearchSettings, open_hits

__all__ = ["RagserveRetriever", "RetrievalError"]


class RagserveRetriever(BaseRetriever):
    """Exactly one of ``index`` (a directory, searched here with ``backend``) or ``url`` (a server)."""

    index: str | Path | None = None
    url: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    k: int = 10
    retriever: str = "bm25"
    k1: float | None = None
    b: float | None = None
    backend: str = "cpu"
    timeout: float = 30.0

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _hits: HitSource = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        settings = SearchSettings(retriever=self.retriever, k1=self.k1, b=self.b, backend=self.backend)
        self._hits = open_hits(self.index, self.url, self.api_key, settings, self.timeout)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None) -> list[Document]:
        return [Document(page_content=h.text, id=h.id, metadata=h.metadata)
                for h in self._hits.search(query, self.k if k is None else k)]

    def close(self) -> None:
        """Release the in-process searcher (its backend); nothing to do for a server."""
        self._hits.close()
