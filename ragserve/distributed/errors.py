"""Errors of distributed search that the server and the CLI report (importable without Ray)."""
from __future__ import annotations


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached or cannot place the replicas."""


class ShardsUnavailable(RuntimeError):
    """Shard groups did not answer (their replica died and is being restarted, or timed out)."""

    def __init__(self, missing: list[int], reason: str) -> None:
        self.missing = sorted(missing)
        super().__init__(f"shards {', '.join(map(str, self.missing))} are unavailable ({reason}); retry once "
                         f"their replica is back, or ask for partial results")
