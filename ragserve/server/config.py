"""Limits and settings of one server instance (the CLI fills them from flags)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    max_query_chars: int = 2000  # per query or question, after stripping
    max_batch: int = 64  # queries in one /v1/search batch
    max_k: int = 100  # largest k a client may ask for
    max_body_bytes: int = 1 << 20  # larger request bodies get 413
    request_timeout_s: float = 60.0  # waiting for the search backend or the generator, then 504
    max_pending_answers: int = 8  # answers queued or running on the generator; more get 503
    concurrent_answers: int = 8  # answers running at once (their decode steps batched); the rest of the pending wait
    api_key: str | None = None  # when set, every endpoint but /healthz and the page needs "Bearer <key>"
    sse_keepalive_s: float = 15.0  # comment line sent on an idle event stream so proxies keep it open
    max_attention_budget: int = 131072  # largest sparse-attention token budget a request may ask for

    def __post_init__(self) -> None:
        for name in ("max_query_chars", "max_batch", "max_k", "max_body_bytes", "max_pending_answers",
                     "concurrent_answers", "max_attention_budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not self.request_timeout_s > 0:
            raise ValueError("request_timeout_s must be positive")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty")
