"""The method registry: name -> class, and construction from one set of options."""
from __future__ import annotations

from ragserve.rag.base import MethodError, RagMethod, Retriever
from ragserve.rag.bridge import BridgeRetrieval
from ragserve.rag.dragin import Dragin
from ragserve.rag.fixed import FixedLength, FixedSentence
from ragserve.rag.flare import Flare
from ragserve.rag.generator import Generator
from ragserve.rag.names import METHOD_NAMES
from ragserve.rag.none import NoRetrieval
from ragserve.rag.oracle import Oracle
from ragserve.rag.prompts import PromptBuilder
from ragserve.rag.single import SingleRetrieval

METHODS: dict[str, type[RagMethod]] = {
    "none": NoRetrieval, "single": SingleRetrieval, "fixed-sentence": FixedSentence, "fixed-length": FixedLength,
    "flare": Flare, "dragin": Dragin,
    # single retrieval through the reranker: the retriever passed in must be a RerankingSearcher
    "two-stage": SingleRetrieval,
    # single retrieval, then the top passage's links first (multi-hop bridge questions)
    "bridge": BridgeRetrieval,
}
assert tuple(METHODS) == METHOD_NAMES, "names.METHOD_NAMES lists the registered methods"
# Evaluation only, never served: the gold supporting paragraphs in the prompt (the ceiling of retrieval for this
# generator and prompt), which a question asked over HTTP does not come with.
EVAL_METHODS: dict[str, type[RagMethod]] = {**METHODS, "oracle": Oracle}


def build_method(name: str, generator: Generator, prompts: PromptBuilder, retriever: Retriever | None = None,
                 **options) -> RagMethod:
    """Instantiate method ``name``; ``options`` holds the common settings (k, max_new_tokens, ...) and any
    method-specific ones, of which those the method does not take are ignored."""
    if name not in EVAL_METHODS:
        raise MethodError(f"unknown method {name!r}; choose one of {', '.join(EVAL_METHODS)}")
    from ragserve.retrieval.rerank import RerankingSearcher

    if name == "two-stage" and not isinstance(retriever, RerankingSearcher):
        raise MethodError("method 'two-stage' needs a reranker (--rerank MODEL: a cross-encoder or a sentence encoder)")
    cls = EVAL_METHODS[name]
    common = ("k", "max_new_tokens", "query_max_tokens", "answer_max_tokens")
    kwargs = {k: v for k, v in options.items() if v is not None and (k in common or k in cls.options)}
    return cls(generator, prompts, retriever if cls.uses_retrieval else None, **kwargs)
