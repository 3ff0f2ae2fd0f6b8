"""Where a framework retriever gets its hits: an index directory searched in this process (``LocalHits``: the
``Searcher``, or the dense / hybrid retriever) or a running ``ragserve serve`` (``RemoteHits``: ``POST
/v1/search``). Both give the same ids and scores for the same index and settings (the server's JSON carries the
f32 score as the same double)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class RetrievalError(RuntimeError):
    """The search could not run: bad settings, an index that will not open, or a server that said no."""


@dataclass(frozen=True)
class SourceHit:
    id: str  # the corpus's own document id
    score: float
    rank: int
    title: str = ""
    text: str = ""
    docid: int | None = None  # the index's internal id

    @property
    def metadata(self) -> dict:
        return {"id": self.id, "score": self.score, "rank": self.rank, "title": self.title, "docid": self.docid}


class HitSource(Protocol):
    def search(self, query: str, k: int) -> list[SourceHit]: ...

    def close(self) -> None: ...


@dataclass
class SearchSettings:
    retriever: str = "bm25"  # bm25, dense or hybrid (the index needs a dense part for the last two)
    k1: float | None = None  # BM25 parameters; None: the index's own
    b: float | None = None
    backend: str = "cpu"  # in-process only: the kernel backend (cpu, gpu, fpga-sim, ...)
    backend_options: dict = field(default_factory=dict)


class LocalHits:
    """Searches ``index`` in this process."""

    def __init__(self, index: str | Path, settings: SearchSettings) -> None:
        from indexer.reader import InvalidIndexError
        from ragserve.kernels.contract import SearchError

        self.settings = settings
        try:
            if settings.retriever == "bm25":  # the Searcher alone: no torch import
                from ragserve.retrieval.searcher import Searcher

                self._searcher = Searcher(index, backend=settings.backend, **settings.backend_options)
            else:
                from ragserve.retrieval.factory import RetrievalConfig, open_retriever

                self._searcher = open_retriever(index, RetrievalConfig(
                    retriever=settings.retriever, backend=settings.backend, backend_options=settings.backend_options))
        except (InvalidIndexError, SearchError, ValueError, RuntimeError) as e:
            raise RetrievalError(str(e)) from None

    def search(self, query: str, k: int) -> list[SourceHit]:
        from ragserve.kernels.contract import SearchError

        try:
            hits = self._searcher.search(query, k=k, k1=self.settings.k1, b=self.settings.b)
        except SearchError as e:
            raise RetrievalError(str(e)) from None
        return [SourceHit(h.id, float(h.score), r, h.title, h.text, h.docid) for r, h in enumerate(hits, 1)]

    def close(self) -> None:
        self._searcher.close()


class RemoteHits:
    """Searches through a running server's ``POST /v1/search`` (``api_key``: its ``--api-key``)."""

    def __init__(self, url: str, settings: SearchSettings, api_key: str | None = None, timeout: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise RetrievalError(f"the server URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/") + "/v1/search"
        self.settings, self.timeout = settings, timeout
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def search(self, query: str, k: int) -> list[SourceHit]:
        body = {"query": query, "k": k}
        if self.settings.retriever != "bm25":
            body["retriever"] = self.settings.retriever
        body.update({n: v for n in ("k1", "b") if (v := getattr(self.settings, n)) is not None})
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as e:  # the server's JSON error says what was wrong
            try:
                msg = json.loads(e.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = e.reason
            raise RetrievalError(f"{self.url}: {e.code} {msg}") from None
        except (urllib.error.URLError, OSError) as e:
            raise RetrievalError(f"{self.url}: {getattr(e, 'reason', e)}") from None
        return [SourceHit(h["id"], float(h["score"]), h["rank"], h.get("title", ""), h.get("text", ""), h.get("docid"))
                for h in data["hits"]]

    def close(self) -> None:
        pass


def open_hits(index: str | Path | None = None, url: str | None = None, api_key: str | None = None,
              settings: SearchSettings | None = None, timeout: float = 30.0) -> HitSource:
    """An index directory (in-process) or a server URL, exactly one."""
    if (index is None) == (url is None):
        raise RetrievalError("give exactly one of index (a directory, searched in this process) or url (a server)")
    settings = settings or SearchSettings()
    return LocalHits(index, settings) if index is not None else RemoteHits(url, settings, api_key, timeout)
