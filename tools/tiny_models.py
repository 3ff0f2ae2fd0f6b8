"""Tiny randomly initialised models for tests and benchmarks (no weights can be downloaded): a BPE tokenizer
trained on the fly, a 2-layer Llama causal LM and a 2-layer BERT cross-encoder, saved with
``save_pretrained`` so that they load through the same ``from_pretrained`` path as real checkpoints."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

SPECIAL = ["<s>", "</s>", "<pad>"]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2000, pair_template: bool = False):
    """A byte-level BPE tokenizer (``PreTrainedTokenizerFast``) trained on ``texts``. The LM variant
    prefixes BOS as Llama's does; the cross-encoder variant wraps ``<s> A </s> B </s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    if pair_template:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def build_tiny_lm(out_dir: str | Path, texts: Iterable[str], vocab_size: int = 2000, hidden: int = 64,
                  layers: int = 2, heads: int = 4, init_range: float = 0.5, seed: int = 0,
                  kv_heads: int | None = None) -> Path:
    """Save a random Llama causal LM with its tokenizer in ``out_dir``. A wide initialisation with untied
    embeddings makes greedy output varied (a mix of confident and uncertain tokens) instead of one token
    repeated. ``kv_heads`` < ``heads`` makes it grouped-query attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = train_tokenizer(texts, vocab_size)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                      max_position_embeddings=4096, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False, initializer_range=init_range)
    return _save_random(LlamaForCausalLM, cfg, tok, out_dir, seed)


def build_tiny_cross_encoder(out_dir: str | Path, texts: Iterable[str], vocab_size: int = 2000, hidden: int = 32,
                             layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """Save a random one-label BERT sequence classifier with its tokenizer in ``out_dir``."""
    from transformers import BertConfig, BertForSequenceClassification

    tok = train_tokenizer(texts, vocab_size, pair_template=True)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, max_position_embeddings=512, num_labels=1,
                     pad_token_id=tok.pad_token_id)
    return _save_random(BertForSequenceClassification, cfg, tok, out_dir, seed)


def build_tiny_sentence_encoder(out_dir: str | Path, texts: Iterable[str], vocab_size: int = 2000, hidden: int = 32,
                                layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """Save a random BERT as a sentence-transformers directory (mean pooling, then normalisation): ``hidden``
    dimensions, few enough for the FPGA kernel's 256 lanes."""
    import json

    from transformers import BertConfig, BertModel

    tok = train_tokenizer(texts, vocab_size, pair_template=True)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, max_position_embeddings=512, pad_token_id=tok.pad_token_id)
    out = _save_random(BertModel, cfg, tok, out_dir, seed)
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": hidden,
                                                               "pooling_mode_mean_tokens": True}))
    return out


def _save_random(model_cls, cfg, tok, out_dir: str | Path, seed: int) -> Path:
    """A randomly initialised ``model_cls(cfg)`` and its tokenizer, saved for ``from_pretrained``."""
    import torch

    torch.manual_seed(seed)
    out = Path(out_dir)
    model_cls(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def tiny_gemma3(vocab_size: int = 512, hidden: int = 64, layers: int = 6, heads: int = 4, kv_heads: int = 2,
                head_dim: int = 16, sliding_window: int = 8, init_range: float = 0.3, seed: int = 0,
                dtype=None, layer_types: list[str] | None = None):
    """A random ``Gemma3ForCausalLM`` in memory (every sixth layer global, a short sliding window so that tests
    cross it, grouped-query attention, an untied output projection so that greedy tokens vary), eager attention,
    for engine tests; no tokenizer. ``layer_types``: each layer's attention instead (e.g. a sliding and a global
    layer in a two-layer model)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                           head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=sliding_window,
                           max_position_embeddings=4096, initializer_range=init_range, bos_token_id=2,
                           eos_token_id=1, pad_token_id=0, attn_implementation="eager",
                           tie_word_embeddings=False, layer_types=layer_types)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():  # the norms start at zero scale (1 + w): random ones exercise them
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    return model.to(dtype) if dtype is not None else model
