"""Sparse decoding in a real decoder: a tiny random Llama with grouped-query attention, loaded through
``from_pretrained``, decodes greedily with each method through transformers' attention interface."""
from __future__ import annotations

import functools
import json

import pytest
import torch

from ragserve.attention import method_names
from ragserve.rag.generator import Generator, GeneratorError
from tests import rag_support as S

@functools.cache
def prompt() -> str:
    """A HotpotQA question after its first paragraphs: a few hundred tokens of context."""
    ex = S.hotpot_examples()[0]
    context = " ".join(f"{p.title}: {p.text}" for p in ex.paragraphs[:4])
    return f"Context: {context}\nQuestion: {ex.question}\nAnswer:"


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with S.one_torch_thread():
        yield


@functools.cache
def gqa_lm():
    from tools.tiny_models import build_tiny_lm
    return build_tiny_lm(S.workdir() / "tiny-llama-gqa", S._texts(), heads=4, kv_heads=2, layers=2)


@functools.cache
def dense_generator() -> Generator:
    return Generator(str(gqa_lm()), device="cpu")


def decode_steps(g) -> int:
    """Forward passes after the (dense) prefill: one per token but the last, or per token when EOS ended it."""
    return g.tokens_generated - (g.stop != "eos")


def test_the_model_is_gqa_and_the_prompt_long_enough():
    g = dense_generator()
    assert g.model.config.num_key_value_heads == 2 and g.model.config.num_attention_heads == 4
    assert g.count_tokens(prompt()) > 300


@pytest.mark.parametrize("method", method_names())
def test_greedy_tokens_equal_dense_at_a_budget_covering_the_context(method):
    ref = dense_generator().generate(prompt(), 24, stop="sentence")
    assert ref.tokens_generated >= 16
    gen = Generator(str(gqa_lm()), device="cpu", attention=method, budget=4096, threshold=0.0)
    out = gen.generate(prompt(), 24, stop="sentence")
    assert out.token_ids == ref.token_ids and out.text == ref.text
    assert out.attention["method"] == method
    if method != "dense":
        # every decode step of every layer ran through the sparse path, over the whole cache
        assert out.attention["layer_steps"] == 2 * decode_steps(out)
        assert out.attention["attended_share"] == 1.0
        assert out.attention["relevancy"] > 0 and out.attention["apply"] > 0


@pytest.mark.parametrize("method", ["dsa", "quest", "lserve", "seer-topk"])
def test_a_small_budget_attends_a_part_of_the_cache(method):
    gen = Generator(str(gqa_lm()), device="cpu", attention=method, budget=192, sink=16, local=32)
    out = gen.generate(prompt(), 12, stop="line")
    assert out.tokens_generated >= 2
    assert 0 < out.attention["attended_share"] < 1.0
    assert out.attention["layer_steps"] == 2 * decode_steps(out)


def test_per_call_method_overrides_and_leaves_the_default():
    gen = Generator(str(gqa_lm()), device="cpu", attention="dense")
    quest = gen.sparse_method("quest", 64, sink=16, local=16)
    a = gen.generate(prompt(), 8, stop="line", attention=quest)
    b = gen.generate(prompt(), 8, stop="line")
    assert a.attention["method"] == "quest" and a.attention["attended_share"] < 1.0
    assert b.attention["method"] == "dense"
    assert b.token_ids == dense_generator().generate(prompt(), 8, stop="line").token_ids


def test_bad_attention_settings_are_generator_errors():
    with pytest.raises(GeneratorError, match="unknown attention method"):
        Generator(str(gqa_lm()), device="cpu", attention="sparse")
    with pytest.raises(GeneratorError, match="below"):
        Generator(str(gqa_lm()), device="cpu", attention="seer-topk", budget=64)


def test_eval_decodes_with_the_chosen_attention(tmp_path, capsys):
    from ragserve.cli import main
    from tests.test_rag_cli import eval_args

    rows = {}
    for name, extra in (("dense", []), ("quest", ["--attention", "quest", "--attention-budget", "8192"]),
                        ("small", ["--attention", "quest", "--attention-budget", "96"])):
        out = tmp_path / f"{name}.jsonl"
        assert main(eval_args(out, "single", 2, *extra)) == 0
        rows[name] = [json.loads(line) for line in out.read_text().splitlines()]
    # room for every token: the same answers as dense decoding; a budget of 96 tokens changes some
    assert [r["output"] for r in rows["quest"]] == [r["output"] for r in rows["dense"]]
    assert [r["output"] for r in rows["small"]] != [r["output"] for r in rows["dense"]]
    capsys.readouterr()
    assert main(eval_args(tmp_path / "e.jsonl", "single", 1, "--attention-budget", "64")) == 2
    assert "--attention-budget needs --attention" in capsys.readouterr().err
    assert main(eval_args(tmp_path / "e.jsonl", "single", 1, "--attention", "quest", "--attention-budget", "8")) == 2
    assert "below 96 tokens" in capsys.readouterr().err


def test_a_qwen2_model_decodes_sparse_as_dense_at_full_budget():
    """Another Llama-style family: Qwen2 (GQA, biases on q/k/v), random weights, greedy by hand."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from ragserve.attention import get_method
    from ragserve.attention import hf

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.randint(0, 300, (1, 300))

    def greedy() -> list[int]:
        out = model(ids, use_cache=True)
        toks = []
        for _ in range(12):
            toks.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([toks[-1:]]), past_key_values=out.past_key_values, use_cache=True)
        return toks

    with torch.inference_mode():
        ref = greedy()
        hf.install(model)
        for name in ("dsa", "quest", "seer-topk"):
            with hf.session(get_method(name, budget=4096)) as s:
                assert greedy() == ref
            assert s.steps == 2 * 12 and s.stats()["attended_share"] == 1.0
        with hf.session(get_method("quest", budget=96, sink=16, local=16)) as s:
            greedy()
        assert s.stats()["attended_share"] < 0.4


def test_sparse_and_dense_generations_interleave_unchanged():
    """Generations with their own sparse method step alone inside their context while dense ones batch beside
    them: each equals the same generation run alone, and each keeps its own attention statistics."""
    from concurrent.futures import ThreadPoolExecutor

    gen = Generator(str(gqa_lm()), device="cpu")
    quest = gen.sparse_method("quest", 64, sink=16, local=16)
    jobs = [quest, None, quest, None]
    alone = [gen.generate(prompt(), 8, stop="none", attention=m) for m in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda m: gen.generate(prompt(), 8, stop="none", attention=m), jobs))
    for m, a, b in zip(jobs, alone, together):
        assert a.token_ids == b.token_ids
        if m is None:
            assert b.attention is None
        else:
            assert b.attention["method"] == "quest" and b.attention["layer_steps"] == a.attention["layer_steps"]
            assert b.attention["attended_share"] == a.attention["attended_share"] < 1.0
