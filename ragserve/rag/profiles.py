"""Per-model settings of the RAG loops (``ragserve/prompts/profiles.json``): the few-shot prompt, the answer budget
and the trigger thresholds (FLARE's token probability, DRAGIN's RIND threshold) that were chosen for one generator
on training questions, keyed by the model's shape so that they apply to that model alone. A model without a
profile gets DRAGIN's published settings and the chain-of-thought prompts."""
from __future__ import annotations

import json
from pathlib import Path

PROFILES_FILE = Path(__file__).resolve().parents[1] / "prompts" / "profiles.json"
SETTINGS = ("prompt", "max_new_tokens", "flare_theta", "dragin_threshold")


def model_key(config) -> str:
    """``<model_type>-<hidden size>x<layers>``, e.g. ``gemma3_text-640x18`` for gemma-3-270m."""
    cfg = getattr(config, "text_config", None) or config
    return f"{cfg.model_type}-{cfg.hidden_size}x{cfg.num_hidden_layers}"


def load_profiles(path: str | Path = PROFILES_FILE) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def profile_for(config, family: str, path: str | Path = PROFILES_FILE) -> dict:
    """The settings for this model on this dataset family (``hotpotqa``, ``strategyqa`` ...): only the keys of
    ``SETTINGS`` that the profile sets; {} without a profile."""
    entry = load_profiles(path).get(model_key(config), {}).get(family, {})
    return {k: entry[k] for k in SETTINGS if k in entry}
