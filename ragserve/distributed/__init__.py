"""ragserve on Ray (``pip install 'ragserve[ray]'``): index builds on Ray Data (``build``), shard groups held by
Ray actors with their own backends and an exact merge of their top-k lists (``shards``), and the HTTP API on
Ray Serve (``serve``).

Nothing here imports ray until it is used, so ragserve works without it. Every machine of the cluster must see
the index files at the same path (a shared file system): replicas load their shards from there.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from ragserve.distributed.errors import RayUnavailable

LOCAL = "local"  # --ray local: start a Ray cluster on this machine for the command


def connect(address: str) -> ModuleType:
    """Join the Ray cluster at ``address`` (``local``: start one on this machine) unless this process already
    has; returns the ``ray`` module."""
    try:
        import ray
    except ImportError as e:
        raise RayUnavailable("--ray needs Ray: pip install 'ragserve[ray]'") from e
    if ray.is_initialized():
        return ray
    if address == LOCAL:
        # Workers of a cluster started here inherit this environment: they run the code this process runs (a
        # source checkout included), and at its priority (Ray lowers its workers' by default, niceness 15; here
        # they do the searching that requests wait for).
        root = str(Path(__file__).resolve().parents[2])
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        os.environ.setdefault("RAY_worker_niceness", "0")
        # A cluster of this machine alone talks over loopback.
        ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False,
                 _node_ip_address="127.0.0.1")
    else:
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise RayUnavailable(f"cannot join the Ray cluster at {address!r}: {e}") from e
    return ray
