"""What every part of an index on disk shares: a file's content hash, the hashes of a directory being written
(``Checksums``), and a directory written whole or not at all."""
from __future__ import annotations

import hashlib
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

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


class Checksums:
    """Size and SHA-256 of the index files for the manifest. Files handed to ``add`` or ``write`` are hashed by a
    background thread (hashlib and file reads release the GIL) while the layout goes on."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pool = ThreadPoolExecutor(1)
        self._sums: dict[Path, Future] = {}

    def __enter__(self) -> "Checksums":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(cancel_futures=True)

    def add(self, path: Path) -> None:
        self._sums[path] = self._pool.submit(sha256_file, path)

    def record(self, path: Path, sha256: str) -> None:
        """A file written and hashed elsewhere (``write_shard_job``)."""
        done: Future = Future()
        done.set_result(sha256)
        self._sums[path] = done

    def write(self, path: Path, a: np.ndarray) -> None:
        """Write ``a`` as a raw little-endian array file and hash it, both in the background (``a`` must not
        change afterwards)."""
        self._sums[path] = self._pool.submit(_write_and_hash, path, a)

    def files(self) -> dict[str, dict]:
        """The manifest's ``files``: every file under the root, in path order."""
        sums = {path: f.result() for path, f in self._sums.items()}  # every background write is done
        files = {}
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                sha = sums[p] if p in sums else sha256_file(p)
                files[str(p.relative_to(self.root))] = {"bytes": p.stat().st_size, "sha256": sha}
        return files


def _write_and_hash(path: Path, a: np.ndarray) -> str:
    a.astype(a.dtype.newbyteorder("<"), copy=False).tofile(path)
    return sha256_file(path)
