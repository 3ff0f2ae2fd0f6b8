"""HTTP question-answering server: a flask app (``create_app``) served by waitress (``runner.serve``).

The package imports nothing itself: the ``--workers`` supervisor imports ``runner`` and ``workers`` from here
and must not load flask, torch or the retrievers (and their threads) before it forks."""
from __future__ import annotations

__all__ = ["create_app", "ServerConfig"]


def __getattr__(name: str):
    if name == "create_app":
        from ragserve.server.app import create_app

        return create_app
    if name == "ServerConfig":
        from ragserve.server.config import ServerConfig

        return ServerConfig
    raise AttributeError(f"module 'ragserve.server' has no attribute {name!r}")
