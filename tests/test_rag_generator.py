"""The generator on a tiny random Llama loaded through ``from_pretrained``: greedy decoding, log-probs and
entropies equal to a plain forward pass, stop rules, attention maps."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ragserve.rag.generator import Generator, GeneratorError, stop_point
from tests import rag_support as S


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with S.one_torch_thread():
        yield


@pytest.fixture(scope="module")
def gen() -> Generator:
    return S.generator()


PROMPT = "Question: Who directed the film Titanic?\nAnswer:"


def test_loads_tiny_model_fp32_on_cpu(gen):
    assert gen.device == "cpu" and next(gen.model.parameters()).dtype == torch.float32
    assert gen.bos_id is not None and gen.eos_ids
    assert gen.model.config._attn_implementation != "eager"


def test_greedy_is_deterministic_and_matches_a_plain_forward(gen):
    a = gen.generate(PROMPT, 24, stop="line")
    b = gen.generate(PROMPT, 24, stop="line")
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.tokens_generated >= len(a.token_ids) > 0
    prompt_ids = gen.tokenizer(PROMPT).input_ids
    ids = torch.tensor([prompt_ids + a.token_ids])
    with torch.inference_mode():
        logp = torch.log_softmax(gen.model(ids).logits[0].float(), dim=-1)
    n = len(prompt_ids)
    rows = logp[n - 1:n - 1 + len(a.token_ids)]
    # every kept token is the argmax of its distribution, with that log-prob and that entropy
    assert rows.argmax(-1).tolist() == a.token_ids
    np.testing.assert_allclose(a.logprobs, rows.max(-1).values.numpy(), atol=1e-4)
    np.testing.assert_allclose(a.entropies, -(rows.exp() * rows).sum(-1).numpy(), atol=1e-3)
    assert np.all(a.probs <= 1.0) and np.all(a.entropies >= 0)


def test_spans_tile_the_text(gen):
    g = gen.generate(PROMPT, 30, stop="line")
    assert g.spans[0][0] == 0 and g.spans[-1][1] == len(g.text)
    assert all(s1 == e0 for (_, e0), (s1, _) in zip(g.spans, g.spans[1:]))
    assert "\n" not in g.text.lstrip()


def test_stop_points():
    assert stop_point(" Paris is big. The", "sentence") == (14, "sentence")
    assert stop_point(" Paris is big. The", "line") is None
    assert stop_point(" He met Dr. Smith", "sentence") is None
    assert stop_point("\n Paris\nQuestion", "line") == (7, "newline")
    assert stop_point(" So the answer is 3.5 m", "sentence") is None
    assert stop_point("   ", "sentence") is None


def test_attention_map_is_causal_and_row_stochastic(gen):
    ids = gen.tokenizer("Marie Curie was born in Warsaw.").input_ids
    a = gen.attention(ids)
    assert a.shape == (len(ids), len(ids))
    np.testing.assert_allclose(a.sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(np.triu(a, 1), 0.0)
    assert gen.model.config._attn_implementation != "eager"  # switched back after the pass


def test_token_helpers(gen):
    text = "The Charles Bridge stands in Prague on the Vltava."
    n = gen.count_tokens(text)
    assert n > 5
    cut = gen.truncate(text, 4)
    assert gen.count_tokens(cut) <= 4 and text.startswith(cut)
    assert gen.truncate(text, n) == text
    ids, decoded, spans = gen.encode(text)
    assert decoded == text and len(spans) == len(ids) and spans[-1][1] == len(text)


def test_long_prompts_keep_bos_and_the_latest_tokens(gen):
    saved = gen.max_positions
    gen.max_positions = 50
    try:
        ids = gen.tokenizer(" ".join(["word"] * 200)).input_ids
        fitted = gen._fit(ids, 10)
        assert len(fitted) == 40 and fitted[0] == gen.bos_id and fitted[1:] == ids[-39:]
        assert len(gen.generate(" ".join(["word"] * 200), 10).token_ids) <= 10
        with pytest.raises(GeneratorError, match="does not fit"):
            gen._fit(ids, 60)
    finally:
        gen.max_positions = saved


def test_bad_arguments(tmp_path, gen):
    with pytest.raises(GeneratorError, match="no model directory"):
        Generator(str(tmp_path / "no-model"), device="cpu")
    with pytest.raises(GeneratorError, match="stop"):
        gen.generate(PROMPT, 5, stop="paragraph")
    with pytest.raises(GeneratorError, match="max_new_tokens"):
        gen.generate(PROMPT, 0)
    if not torch.cuda.is_available():
        with pytest.raises(GeneratorError, match="CUDA"):
            Generator(str(S.tiny_lm()), device="cuda:0")


def test_from_model_wraps_a_model_in_memory_like_from_pretrained(gen):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(S.tiny_lm())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    wrapped = Generator.from_model(model, AutoTokenizer.from_pretrained(path), device="cpu", name="in-memory")
    assert wrapped.name == "in-memory" and wrapped.device == "cpu" and not wrapped.model.training
    assert (wrapped.eos_ids, wrapped.bos_id, wrapped.max_positions) == (gen.eos_ids, gen.bos_id, gen.max_positions)
    a, b = wrapped.generate(PROMPT, 24, stop="line"), gen.generate(PROMPT, 24, stop="line")
    assert a.token_ids == b.token_ids and a.text == b.text and a.prompt_tokens == b.prompt_tokens
    ids = gen.tokenizer("Marie Curie was born in Warsaw.").input_ids
    np.testing.assert_allclose(wrapped.attention(ids), gen.attention(ids), atol=1e-6)


def test_from_model_keeps_the_dtype_of_a_model_built_from_a_config(gen):
    from transformers import AutoModelForCausalLM

    cfg = gen.model.config.__class__.from_dict(gen.model.config.to_dict())
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)  # random weights, never saved
    wrapped = Generator.from_model(model, gen.tokenizer)  # device: where the weights are
    assert wrapped.device == "cpu" and wrapped.dtype == torch.bfloat16
    assert next(wrapped.model.parameters()).dtype == torch.bfloat16
    g = wrapped.generate(PROMPT, 8, stop="line")
    assert 0 < g.tokens_generated <= 8 and g.logprobs.shape == (len(g.token_ids),)


def test_from_model_rejects_what_is_not_a_causal_lm(gen):
    with pytest.raises(GeneratorError, match="causal LM"):
        Generator.from_model("tiny-llama", gen.tokenizer)
    with pytest.raises(GeneratorError, match="tokenizer"):
        Generator.from_model(gen.model, None)
    with pytest.raises(GeneratorError, match="temperature"):
        Generator.from_model(gen.model, gen.tokenizer, temperature=-1.0)
