"""What every part of an index on disk shares: a file's content hash, and a directory written whole or not at all."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")
CHUNK = 1 << 22


def sha256_file(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def write_dir_atomically(out: str | Path, build: Callable[[Path], T]) -> T:
    """Run ``build`` on an empty ``.NAME.partial-<pid>`` directory beside ``out`` and rename it to ``out`` once it
    returns (replacing an existing ``out``): an interrupted or failed build leaves ``out`` as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        result = build(tmp)
        if out.exists():
            trash = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(trash)
            tmp.rename(out)
            shutil.rmtree(trash)
        else:
            tmp.rename(out)
        return result
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
