"""Corpus readers, the analyzer and the index layout (writer and reader).

Importing this package points numba's cache of compiled kernels at a per-user cache directory, before any
module here or in ``ragserve`` imports numba: kernels compiled once (~25 s for the index build, ~10 s for
search) are then reused by every later process, whether ragserve runs from a clone or an installed package
(numba's default, ``__pycache__`` beside the sources, is lost with each new clone and not writable in
site-packages). The place: ``$NUMBA_CACHE_DIR`` if set, else ``$RAGSERVE_CACHE_DIR/numba``, else
``${XDG_CACHE_HOME:-~/.cache}/ragserve/numba``.
"""
import os
from pathlib import Path


def cache_dir() -> Path:
    """ragserve's per-user cache directory (compiled kernels)."""
    if os.environ.get("RAGSERVE_CACHE_DIR"):
        return Path(os.environ["RAGSERVE_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "ragserve"


os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir() / "numba"))
