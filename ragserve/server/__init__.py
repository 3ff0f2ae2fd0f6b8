"""HTTP question-answering server: a flask app (``create_app``) served by waitress (``runner.serve``)."""
from ragserve.server.app import create_app
from ragserve.server.config import ServerConfig

__all__ = ["create_app", "ServerConfig"]
