"""Sentence embeddings from a local sentence-transformers-style model directory, with plain transformers.

The directory's own configuration says how to turn token states into one vector, as sentence-transformers
reads it: ``modules.json`` lists a Transformer, a Pooling module (its ``config.json``: mean / CLS / max /
mean-sqrt-len pooling) and optionally ``Normalize``; ``sentence_bert_config.json`` gives the longest input.
all-MiniLM-L6-v2 is mean pooling over the non-padding tokens, then L2 normalisation, at most 256 word pieces.
No sentence-transformers import is needed at run time.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from indexer.layout import DENSE_BATCHING

if TYPE_CHECKING:
    import torch

POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len")
# How ``Embedder.encode`` batches (recorded by a dense part): one token count a batch, no padding. A dense part
# written without it (an older build) gives vectors that depend on their batch, so a live index refuses writes.
BATCHING = DENSE_BATCHING


class EmbedderError(ValueError):
    """A model directory that is not a sentence encoder, or unusable embedder settings."""


@dataclass(frozen=True)
class EncoderInfo:
    """What identifies a sentence encoder: a dense index or memory bank built with one records this."""

    name: str
    path: str
    fingerprint: str  # SHA-256 over the weights and the pooling / tokenizer configuration
    dim: int
    pooling: str
    normalize: bool
    max_seq_length: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _read_json(path: Path, what: str) -> dict | list:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise EmbedderError(f"{path}: unreadable {what}: {e}") from None


def _pooling_mode(cfg: dict, where: Path) -> str:
    on = [m for m in POOLING_MODES if cfg.get(f"pooling_mode_{m}_token" if m == "cls" else f"pooling_mode_{m}_tokens")]
    if len(on) != 1:
        raise EmbedderError(f"{where}: expected exactly one pooling mode of {', '.join(POOLING_MODES)}, got {on or 'none'}")
    return on[0]


def encoder_dir(path: str | Path) -> Path:
    """The directory ``path`` names: a path, an installed short name (``minilm``) or a cached hub id
    (``ragserve.models.resolve_model``); ``EmbedderError`` when it names no directory."""
    from ragserve.models import ModelError, resolve_model

    try:
        root = resolve_model(path)
    except ModelError as e:
        raise EmbedderError(str(e)) from None
    if not root.is_dir():
        raise EmbedderError(f"{root} is a file, not a model directory")
    return root


def read_encoder_config(path: str | Path) -> tuple[str, bool, int | None, Path]:
    """(pooling mode, normalize, max_seq_length or None, transformer directory) of a sentence-encoder directory;
    ``EmbedderError`` for anything else (a causal LM, a cross-encoder, a plain transformer without pooling)."""
    root = encoder_dir(path)
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        raise EmbedderError(f"{root} is not a sentence encoder (no modules.json with a Pooling module; "
                            f"a sentence-transformers model directory is needed)")
    modules = _read_json(modules_file, "modules.json")
    if not isinstance(modules, list):
        raise EmbedderError(f"{modules_file}: expected a list of modules")
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    if "Transformer" not in kinds or "Pooling" not in kinds:
        raise EmbedderError(f"{root} is not a sentence encoder (modules.json lists {', '.join(kinds) or 'nothing'}; "
                            f"a Transformer and a Pooling module are needed)")
    extra = set(kinds) - {"Transformer", "Pooling", "Normalize"}
    if extra:
        raise EmbedderError(f"{root}: unsupported sentence-transformers module(s) {', '.join(sorted(extra))}")
    pool_cfg = root / kinds["Pooling"].get("path", "1_Pooling") / "config.json"
    if not pool_cfg.is_file():
        raise EmbedderError(f"{root} is not a sentence encoder (no pooling configuration {pool_cfg})")
    mode = _pooling_mode(_read_json(pool_cfg, "pooling configuration"), pool_cfg)
    tdir = root / kinds["Transformer"].get("path", "")
    st_cfg = tdir / "sentence_bert_config.json"
    max_len = _read_json(st_cfg, "sentence_bert_config.json").get("max_seq_length") if st_cfg.is_file() else None
    return mode, "Normalize" in kinds, max_len, tdir


def fingerprint(tdir: Path, extra: dict) -> str:
    """SHA-256 over the weight files, the tokenizer files and ``extra`` (the pooling settings)."""
    h = hashlib.sha256(json.dumps(extra, sort_keys=True).encode())
    names = sorted(p.name for p in tdir.iterdir() if p.is_file() and (
        p.suffix in (".safetensors", ".bin") or p.name in ("config.json", "tokenizer.json", "vocab.txt")))
    for name in names:
        h.update(name.encode() + b"\0")
        with open(tdir / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def resolve_device(device: str) -> str:
    import torch  # imported when an encoder is used: a live index's writes without one never load it

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EmbedderError(f"device {device!r} asked for, but no CUDA device is usable here")
    if not (device == "cpu" or device.startswith("cuda")):
        raise EmbedderError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    return device


class Embedder:
    """Batched sentence embeddings (f32, [n, dim]) on CPU or GPU; rows are unit length when the model normalises."""

    def __init__(self, path: str | Path, device: str = "auto", batch_size: int = 0, max_seq_length: int = 0,
                 dtype: str = "auto") -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = encoder_dir(path)
        mode, normalize, cfg_len, tdir = read_encoder_config(path)
        self.device = resolve_device(device)
        self.batch_size = batch_size or (256 if self.device.startswith("cuda") else 32)
        if self.batch_size < 1 or max_seq_length < 0:
            raise EmbedderError("batch size must be >= 1 and max_seq_length >= 0")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(tdir))
            self.model = AutoModel.from_pretrained(str(tdir))
        except (OSError, ValueError) as e:
            raise EmbedderError(f"cannot load the transformer of {path}: {e}") from None
        # fp16 on a GPU (what the index stores anyway); the CPU keeps f32 (its fp16 matmuls are slow).
        if dtype == "auto":
            dtype = "float16" if self.device.startswith("cuda") else "float32"
        self.model.to(device=self.device, dtype=getattr(torch, dtype)).eval()
        self.dtype = dtype
        limit = getattr(self.model.config, "max_position_embeddings", None) or 512
        self.max_seq_length = min(max_seq_length or cfg_len or limit, limit)
        self.pooling, self.normalize = mode, normalize
        dim = int(getattr(self.model.config, "hidden_size", 0))
        root = Path(path).resolve()
        pool = {"pooling": mode, "normalize": normalize, "max_seq_length": self.max_seq_length}
        self.info = EncoderInfo(name=root.name, path=str(root), fingerprint=fingerprint(tdir, pool), dim=dim,
                                pooling=mode, normalize=normalize, max_seq_length=self.max_seq_length)

    @property
    def dim(self) -> int:
        return self.info.dim

    @property
    def compute(self) -> dict:
        """How the vectors are computed, beyond the model: a dense part records it, and a live index embeds the
        passages it adds the same way (a GPU's fp16 vectors are not the CPU's f32 ones)."""
        return {"batching": BATCHING, "device": self.device.split(":")[0], "dtype": self.dtype}

    def _pool(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(states.dtype)
        if self.pooling == "cls":
            return states[:, 0]
        if self.pooling == "max":
            return states.masked_fill(m == 0, -1e9).amax(dim=1)
        summed = (states * m).sum(dim=1)
        counts = m.sum(dim=1).clamp_min(1e-9)
        return summed / (counts if self.pooling == "mean" else counts.sqrt())

    def _batch(self, texts: list[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_length,
                                 return_tensors="pt").to(self.device)
            states = self.model(**enc).last_hidden_state.float()
            v = self._pool(states, enc["attention_mask"])
            if self.normalize:
                v = torch.nn.functional.normalize(v, p=2, dim=1)
            return v.cpu().numpy()

    def encode(self, texts: Sequence[str], progress: bool = False, desc: str = "embedding",
               on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """Embeddings of ``texts`` in their order, f32 [len(texts), dim]. A batch holds only texts of one token
        count (longest first, at most ``batch_size``), so nothing is padded: a text's embedding is then the same
        bits whatever else is embedded with it (``indexer/FORMAT.md``, "Dense part": measured on MiniLM, a
        padded batch changed 55% of the fp16 rows against one text at a time, equal-length batches none), which
        lets a live index's added passages get the vectors a fresh build gives them. ``on_batch(n)`` is told
        each batch's size."""
        from tqdm import tqdm

        texts = [t if isinstance(t, str) else "" for t in texts]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        lengths = [len(x) for x in self.tokenizer(texts, truncation=True, max_length=self.max_seq_length)[
            "input_ids"]] if texts else []
        order = sorted(range(len(texts)), key=lambda i: (-lengths[i], i))
        with tqdm(total=len(texts), desc=desc, unit=" passages", disable=not progress) as bar:
            i = 0
            while i < len(order):
                j = i + 1
                while j < len(order) and j - i < self.batch_size and lengths[order[j]] == lengths[order[i]]:
                    j += 1
                idx = order[i:j]
                out[idx] = self._batch([texts[t] for t in idx])
                bar.update(len(idx))
                if on_batch is not None:
                    on_batch(len(idx))
                i = j
        return out

    def check_same_model(self, info: dict, what: str) -> None:
        """Raise unless ``info`` (an ``EncoderInfo`` dict stored with ``what``) is this model's."""
        if info.get("fingerprint") != self.info.fingerprint:
            raise EmbedderError(f"{what} was built with model {info.get('name')!r} ({str(info.get('fingerprint'))[:12]}), "
                                f"not {self.info.name!r} ({self.info.fingerprint[:12]}); use that model or rebuild it")
        if int(info.get("dim", -1)) != self.dim:
            raise EmbedderError(f"{what} holds {info.get('dim')}-dimensional embeddings, the model makes {self.dim}")
