"""The Gemma 3 engine's compiled static step (``StepSettings.compile``), proven on the CPU with inductor's C++
backend: the same greedy tokens as the eager static step and the numba kernels step, a slot's logits the same bits
alone or beside others, a compile that fails falls back to the eager step with one logged line, and the setting
reaches the engine from the generator and the CLI. One two-layer model (a sliding and a global layer) compiled
once for the module: inductor compiles C++."""
from __future__ import annotations

import logging

import pytest
import torch

from ragserve.rag.engine import StepSettings
from ragserve.rag.engines.gemma3 import Gemma3Engine
from ragserve.rag.generator import GeneratorError
from tools.tiny_models import tiny_gemma3

PROMPTS = [[2, *range(10, 30)], [2, 400, 17, 301, 9], [2, *range(100, 140, 3)]]
TOKENS = 32


@pytest.fixture(scope="module")
def tiny():
    return tiny_gemma3(layers=2, layer_types=["sliding_attention", "full_attention"])


@pytest.fixture(scope="module")
def compiled(tiny):
    engine = Gemma3Engine(tiny, max_slots=3, max_length=80, dense_step=True, step=StepSettings(compile="on"))
    s = engine.open()
    with torch._inductor.config.patch(compile_threads=1):  # no worker pool to start on a 2-core machine
        engine.step([s], [2])  # compiles
    engine.close(s)
    assert engine.describe()["compiled"] and engine.compile_s > 0
    return engine


def greedy(engine, prompts: list[list[int]], n: int = TOKENS) -> list[list[int]]:
    """Greedy tokens of each prompt, all of their slots stepping together."""
    slots = [engine.open() for _ in prompts]
    toks = [[int(engine.prefill(s, ids).argmax())] for s, ids in zip(slots, prompts)]
    for _ in range(n - 1):
        rows = engine.step(slots, [t[-1] for t in toks])
        for t, row in zip(toks, rows):
            t.append(int(row.argmax()))
    for s in slots:
        engine.close(s)
    return toks


def test_compiled_step_decodes_the_eager_and_kernel_steps_tokens(tiny, compiled):
    """Past the sliding window, one slot and three stepping together: the compiled step's greedy tokens are the
    eager static step's and the numba kernels step's."""
    eager = Gemma3Engine(tiny, max_slots=3, max_length=80, dense_step=True, step=StepSettings(compile="off"))
    kernels = Gemma3Engine(tiny, max_slots=3, max_length=80)
    assert kernels.describe()["step"] == "kernels" and not eager.describe()["compiled"]
    for ids in PROMPTS:
        want = greedy(kernels, [ids])
        assert greedy(compiled, [ids]) == want == greedy(eager, [ids])
        assert len(set(want[0])) > 8  # tokens vary: equality is not one token repeated
    together = greedy(compiled, PROMPTS)
    assert together == greedy(eager, PROMPTS) == greedy(kernels, PROMPTS)
    assert compiled.describe()["compiled"] and not eager.compiled


@pytest.mark.parametrize("shapes", ["fixed", "bucketed"])
def test_compiled_step_rows_are_the_same_bits_alone_or_beside_others(tiny, compiled, shapes):
    """Fixed shapes: the compiled kernels' rows never mix, so slot a's logits are the same bits whatever steps
    beside it. Bucketed (rows and columns follow the slots stepping: one compile of dynamic sizes serves every
    bucket), within f32 rounding and the same greedy tokens."""
    engine = compiled
    if shapes == "fixed":
        engine = Gemma3Engine(tiny, max_slots=3, max_length=80, dense_step=True,
                              step=StepSettings(compile="on", shapes="fixed"))
    a = engine.open()
    first = engine.prefill(a, PROMPTS[0])
    toks, alone = [int(first.argmax())], []
    for _ in range(8):
        alone.append(engine.step([a], [toks[-1]])[0].clone())
        toks.append(int(alone[-1].argmax()))
    engine.truncate(a, len(PROMPTS[0]))
    b, c = engine.open(), engine.open()
    tb, tc = int(engine.prefill(b, PROMPTS[1]).argmax()), int(engine.prefill(c, PROMPTS[2]).argmax())
    with torch._inductor.config.patch(compile_threads=1):
        for i in range(8):  # a beside c, or between c and b, at other lengths
            order = [c, a, b] if i % 2 else [a, c]
            nxt = {a: toks[i], b: tb, c: tc}
            rows = dict(zip(order, engine.step(order, [nxt[s] for s in order])))
            if shapes == "fixed":
                assert torch.equal(rows[a], alone[i]), f"step {i}"
            else:
                torch.testing.assert_close(rows[a], alone[i], rtol=0, atol=5e-5)
                assert int(rows[a].argmax()) == toks[i + 1]
            tb, tc = int(rows[b].argmax()) if b in rows else tb, int(rows[c].argmax())
    assert engine.compiled
    for s in (a, b, c):
        engine.close(s)


def test_warm_compiles_every_bucket_before_the_first_step():
    """``warm`` (the generator calls it once built) compiles the step for one slot and for several; steps after it
    cross row and column buckets without compiling again, and decode the eager step's tokens."""
    from torch._dynamo.utils import counters

    # one layer: a model no earlier test compiled (a compile of the same shapes would be reused)
    tiny = tiny_gemma3(layers=1, layer_types=["full_attention"])
    engine = Gemma3Engine(tiny, max_slots=3, max_length=80, dense_step=True,
                          step=StepSettings(compile="on", span=16))
    with torch._inductor.config.patch(compile_threads=1):
        engine.warm()
    assert engine.compiled and engine.compile_s > 0
    before = counters["stats"]["unique_graphs"]
    assert engine.free == [0, 1, 2] and all(n == 0 for n in engine.lengths)
    eager = Gemma3Engine(tiny, max_slots=3, max_length=80, dense_step=True,
                         step=StepSettings(compile="off", span=16))
    assert greedy(engine, PROMPTS, 40) == greedy(eager, PROMPTS, 40)
    assert greedy(engine, PROMPTS[1:2], 40) == greedy(eager, PROMPTS[1:2], 40)
    assert counters["stats"]["unique_graphs"] == before  # no compile after warm
    assert {(3, 32), (3, 64), (1, 32), (1, 64)} <= set(engine.describe()["buckets"])


class Graphs:
    """The capture/replay driver as CUDA uses it, recorded (tests/test_engine_gemma3.py's): capture runs nothing,
    replay runs the captured step. ``refuse``: captures that raise first (a compiled step CUDA cannot capture)."""

    def __init__(self, refuse: int = 0) -> None:
        self.log, self.captured, self.refuse = [], [], refuse

    def capture(self, fn):
        if self.refuse:
            self.refuse -= 1
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captured.append(fn)
        self.log.append("capture")
        return len(self.captured) - 1

    def replay(self, handle) -> None:
        self.log.append("replay")
        self.captured[handle]()


def test_the_graph_captures_the_compiled_step(tiny, compiled, caplog):
    """With a graph driver (CUDA's path), the step is compiled first, outside the capture, and the graph captures
    the compiled step; one that cannot be captured is replaced by the eager step's graph, with one logged line.
    Same shapes as the module's compiled engine: torch.compile reuses its code."""
    eager = Gemma3Engine(tiny, max_slots=3, max_length=80, dense_step=True, step=StepSettings(compile="off"))
    want = greedy(eager, PROMPTS[:2], 12)
    for refuse in (0, 1):
        graphs = Graphs(refuse)
        engine = Gemma3Engine(tiny, max_slots=3, max_length=80, dense_step=True, graphs=graphs,
                              step=StepSettings(compile="on"))
        with caplog.at_level(logging.WARNING, logger="ragserve.engine"):
            assert greedy(engine, PROMPTS[:2], 12) == want
        assert graphs.log == ["capture"] + ["replay"] * 11
        assert engine.describe()["step"] == "graph" and engine.compiled == (not refuse)
        assert engine.compile_s is not None  # it compiled either way
    lines = [r.getMessage() for r in caplog.records if r.name == "ragserve.engine"]
    assert len(lines) == 1 and "could not be captured" in lines[0]


def failing_backend(gm, example_inputs):
    raise RuntimeError("no compiler here")


def test_a_failed_compile_falls_back_to_the_eager_step(tiny, caplog):
    engine = Gemma3Engine(tiny, max_slots=2, max_length=80, dense_step=True,
                          step=StepSettings(compile="on", backend=failing_backend))
    eager = Gemma3Engine(tiny, max_slots=2, max_length=80, dense_step=True, step=StepSettings(compile="off"))
    with caplog.at_level(logging.WARNING, logger="ragserve.engine"):
        got = greedy(engine, PROMPTS[:2], 12)
    lines = [r.getMessage() for r in caplog.records if r.name == "ragserve.engine"]
    assert len(lines) == 1 and "did not compile" in lines[0] and "no compiler here" in lines[0]
    assert got == greedy(eager, PROMPTS[:2], 12)
    assert not engine.describe()["compiled"] and engine.compile_s is None


def test_auto_compiles_on_cuda_only_and_off_is_todays_step(tiny):
    assert not Gemma3Engine(tiny, max_slots=1, max_length=16, dense_step=True).compile_step  # auto on the CPU
    off = Gemma3Engine(tiny, max_slots=1, max_length=16, dense_step=True, step=StepSettings(compile="off"))
    s = off.open()
    off.step([s], [off.prefill(s, [2, 5]).argmax().item()])
    assert off._forward == off._static_forward and off.compile_s is None
    on = Gemma3Engine(tiny, max_slots=1, max_length=16, step=StepSettings(compile="on"))  # the kernels step
    assert on.describe()["step"] == "kernels" and not on.compile_step
    with pytest.raises(GeneratorError, match="auto, on or off"):
        Gemma3Engine(tiny, max_slots=1, max_length=16, step=StepSettings(compile="yes"))


def test_step_settings_reach_the_engine_from_the_generator(tiny):
    from ragserve.rag.generator import Generator

    class Tok:
        eos_token_id, bos_token_id = 1, 2

        def __call__(self, text):
            return {"input_ids": [2]}

        def decode(self, ids, **kw):
            return ""

    settings = StepSettings(compile="off")
    gen = Generator.from_model(tiny, Tok(), device="cpu", max_slots=1, engine_options={"step": settings})
    assert gen.engine.step_settings is settings


def test_step_flags_reach_the_generator_from_serve_and_eval(tmp_path, monkeypatch, capsys):
    """``--step-compile`` and ``--step-shapes`` become the generator's ``engine_options`` (none for the defaults:
    the reference engine takes no options), from ``ragserve serve`` through its answer service and from
    ``ragserve eval``."""
    from ragserve.cli import build_parser, main
    from ragserve.commands import serve
    from ragserve.rag import generator
    from ragserve.server.answering import AnswerService
    from ragserve.server.config import ServerConfig
    from ragserve.server.metrics import ServerMetrics

    calls = []

    def load(model, **kw):  # records what the service hands the generator, then fails the load
        calls.append(kw)
        raise GeneratorError("recorded")

    for flags, want in ((["--step-compile", "on"], {"step": StepSettings(compile="on")}),
                        (["--step-shapes", "fixed"], {"step": StepSettings(shapes="fixed")}),
                        (["--step-compile", "auto"], None)):
        args = build_parser().parse_args(["serve", "--index", str(tmp_path), "--model", "m", *flags])
        service = serve._answer_service(args, ServerConfig(), None, ServerMetrics())
        assert service.engine_options == want
        AnswerService("m", None, ServerConfig(), ServerMetrics(), load_generator=load,
                      engine_options=want).wait_loaded()
        assert calls.pop().get("engine_options") == want
    # --prefill-lanes: the generator's BatchSettings (none for the default), and one line, exit 2, for a bad count
    from ragserve.rag.batcher import BatchSettings
    for lanes, want in (("2", BatchSettings(prefill_lanes=2)), ("1", None)):
        args = build_parser().parse_args(["serve", "--index", str(tmp_path), "--model", "m", "--prefill-lanes", lanes])
        service = serve._answer_service(args, ServerConfig(), None, ServerMetrics())
        assert service.batch == want
        AnswerService("m", None, ServerConfig(), ServerMetrics(), load_generator=load, batch=want).wait_loaded()
        assert calls.pop().get("batch") == want
    assert main(["serve", "--index", str(tmp_path), "--prefill-lanes", "0"]) == 2
    assert "--prefill-lanes must be >= 1" in capsys.readouterr().err

    from tests import rag_support
    from tests.conftest import shared

    monkeypatch.setattr(generator, "Generator", lambda *a, **kw: load(*a, **kw))
    (tmp_path / "config.json").write_text("{}")
    rc = main(["eval", "--dataset", str(shared(*rag_support.HOTPOT_IRCOT)), "--method", "none", "--model",
               str(tmp_path), "--step-compile", "off", "--step-shapes", "fixed", "--out", str(tmp_path / "o.jsonl"),
               "--quiet"])
    assert rc == 2 and calls.pop()["engine_options"] == {"step": StepSettings(compile="off", shapes="fixed")}
