"""Retriever adapters for other frameworks, each an optional extra: ``ragserve.integrations.langchain``
(``pip install 'ragserve[langchain]'``) and ``ragserve.integrations.llamaindex`` (``'ragserve[llamaindex]'``).
Both search in-process on an index directory or against a running server (``hits.open_hits``); nothing here is
imported by the rest of ragserve."""
