"""Errors of ragserve on Ray that the server and the CLI report (importable without Ray); a shard group that
does not answer is ``ShardsUnavailable`` of the kernel contract."""
from __future__ import annotations


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached or cannot place the replicas."""

