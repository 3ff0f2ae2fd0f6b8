"""Corpus recipes: one JSON file per corpus the project knows (where to download it, checksums, its layout).

A recipe has ``name``, ``description``, ``format`` (an ``indexer.readers`` format), ``corpus`` / ``queries`` /
``qrels`` (paths inside the download directory, or null), ``license``, ``checksum_source`` (where each checksum
comes from, or why there is none) and ``files``: ``[{url, name, md5, sha256, unpack}]`` with ``unpack`` "zip"
or null. ``fetch`` downloads every file with ``ragserve.fetch.download`` and unpacks the zips.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ragserve.fetch import FetchError, ProgressFactory, download, file_digest, unzip

# Recipes live in the checkout's top-level corpora/ folder (ragserve is installed from a checkout, editable);
# RAGSERVE_CORPORA points elsewhere.
RECIPE_DIR = Path(os.environ.get("RAGSERVE_CORPORA") or Path(__file__).resolve().parents[1] / "corpora")


class RecipeError(ValueError):
    """An unknown corpus name or a malformed recipe."""


@dataclass(frozen=True)
class RemoteFile:
    url: str
    name: str
    md5: str | None = None
    sha256: str | None = None
    unpack: str | None = None

    @property
    def checksum(self) -> tuple[str, str] | tuple[None, None]:
        """(algorithm, hex digest), the strongest one the recipe has."""
        if self.sha256:
            return "sha256", self.sha256
        if self.md5:
            return "md5", self.md5
        return None, None


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    format: str
    files: tuple[RemoteFile, ...]
    corpus: str | None = None
    queries: str | None = None
    qrels: str | None = None
    license: str = ""
    checksum_source: str = ""
    notes: str = ""


def parse_recipe(data: dict, origin: str) -> Recipe:
    try:
        files = tuple(RemoteFile(**{k: v for k, v in f.items() if k != "bytes"}) for f in data["files"])
        recipe = Recipe(**{**data, "files": files})
    except (KeyError, TypeError) as e:
        raise RecipeError(f"{origin}: not a valid recipe ({e})") from None
    for f in files:
        if f.unpack not in (None, "zip"):
            raise RecipeError(f"{origin}: {f.name}: unknown unpack {f.unpack!r} (zip or null)")
        if "/" in f.name or f.name in ("", ".", ".."):
            raise RecipeError(f"{origin}: file name {f.name!r} must be a plain name")
    if not files:
        raise RecipeError(f"{origin}: no files")
    return recipe


def load_recipe_file(path: str | Path) -> Recipe:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except json.JSONDecodeError as e:
        raise RecipeError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None
    return parse_recipe(data, str(path))


def recipes() -> dict[str, Recipe]:
    """The bundled recipes by name."""
    found = (load_recipe_file(p) for p in sorted(RECIPE_DIR.glob("*.json")))
    return {r.name: r for r in found}


def get_recipe(name: str) -> Recipe:
    """A bundled recipe by name, or a recipe file when ``name`` is a path to one."""
    if name.endswith(".json"):
        return load_recipe_file(name)
    known = recipes()
    if name not in known:
        raise RecipeError(f"unknown corpus {name!r}; known corpora: {', '.join(known)}")
    return known[name]


def fetch(recipe: Recipe, dest: str | Path, progress: ProgressFactory | None = None, timeout: float = 60.0) -> list[Path]:
    """Download (or resume) every file of ``recipe`` into ``dest`` and unpack archives; files already present
    with a matching checksum are kept. Returns the downloaded paths."""
    dest = Path(dest)
    paths = []
    for f in recipe.files:
        target = dest / f.name
        algo, digest = f.checksum
        if not (target.exists() and (digest is None or file_digest(target, algo) == digest)):
            download(f.url, target, algo, digest, timeout=timeout, progress=progress)
        if f.unpack == "zip":
            unzip(target, dest)
        paths.append(target)
    return paths


__all__ = ["FetchError", "Recipe", "RecipeError", "RemoteFile", "fetch", "get_recipe", "load_recipe_file", "recipes"]
