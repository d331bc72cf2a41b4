"""runtime.model.native_layers and runtime/native/decode_layers.c: a quant="gguf" decode pass's layers in one native
call must give the eager layers' bits (the same native functions in the same order), on a batch of 4 rows that
shrinks to 1 as requests finish (its mirror rows then out of batch order), with and without q/k/v bias, on both
activation kernels; passes it does not take (5 rows and more) run the eager layers; a float32 model whose plan
puts its products on "native" gets the same (and stays within float32 error of its fixed rules), a model of mixed
products gets no plan; and the native SiLU(gate) * up is SiLU to float32 rounding."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from radixcache.runtime import Engine
from radixcache.runtime.model import native_layers
from radixcache.runtime.model.kernel_plan import BUCKETS, KernelPlan
from radixcache.runtime.model.kernel_tune import apply_plan, model_linears
from radixcache.runtime.model.linear import DenseLinear
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.native.ops import NativeDecodeOps
from radixcache.runtime.testing import hold_engine_loop, random_block_weight, random_weights, tiny_config

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)


def _gguf_model(bias: bool, seed: int = 5, vocab: int = 97, **shape: int) -> LlamaModel:
    """A small GQA model whose every matrix is a GGUF block weight (Q4_1 and Q8_0 mixed), its float weights their
    dequantisation; `shape`: tiny_config's sizes other than these defaults."""
    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
    cfg = tiny_config(**{**sizes, **shape}, attention_bias=bias, vocab_size=vocab)
    weights = random_weights(cfg, seed)
    blocks = {}
    for i, (name, w) in enumerate(sorted(weights.items())):
        if w.dim() == 2 and name != "model.embed_tokens.weight":
            blocks[name] = random_block_weight("Q4_1" if i % 3 else "Q8_0", *w.shape, seed=seed + i)
            weights[name] = blocks[name].dequantize()
    return LlamaModel(cfg, weights, quant="gguf", blocks=blocks)


def _decode_together(
    model: LlamaModel, rows: int, path: str | None = None, threads: int = 1
) -> list[tuple[list[int], torch.Tensor]]:
    """`rows` requests queued at once: they prefill, then decode as one batch that shrinks as each finishes (its
    own max_tokens), so every run of this has the same passes. Greedy, with logits. `path`: a float32 model's
    products on it for 1 to 8 rows (`_force`, after the engine applied the suite's fixed rules). `threads`: the
    engine's, fixed (the native layers' one parallel region shares every product and attention among them)."""
    g = torch.Generator().manual_seed(rows)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (9, 30, 17, 41, 5, 22)[:rows]]
    with Engine(model, capacity_blocks=64, page_size=8, threads=threads, thread_policy="fixed") as engine:
        if path is not None:
            _force(model, path)
        release = hold_engine_loop(engine)
        handles = [engine.submit(p, 6 + 3 * i, ignore_eos=True, return_logits=True) for i, p in enumerate(prompts)]
        release()
        results = [h.result(60) for h in handles]
    return [(list(r.token_ids), torch.stack(list(r.logits))) for r in results]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("activations", ["float", "int8", "int16"])
@pytest.mark.parametrize("bias", [False, True])
def test_native_layers_give_the_eager_layers_bits(
    monkeypatch: pytest.MonkeyPatch, activations: str, bias: bool, threads: int
) -> None:
    rows = 4  # the batch shrinks 4 -> 3 -> 2 -> 1 as requests finish, the mirror's rows out of batch order on the way
    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", activations)
    model = _gguf_model(bias)
    plan = model.native_layers
    assert plan is not None
    ran: list[int] = []
    real = native_layers.NativeLayers.run

    def counted(self: Any, x: torch.Tensor, fused: Any) -> torch.Tensor | None:
        out = real(self, x, fused)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(native_layers.NativeLayers, "run", counted)
    native = _decode_together(model, rows, threads=threads)
    assert ran and all(ran), "the native layers never ran, or refused a pass"
    model.native_layers = None
    eager = _decode_together(model, rows, threads=threads)
    for (tokens_a, a), (tokens_b, b) in zip(native, eager, strict=True):
        assert tokens_a == tokens_b
        assert torch.equal(a, b)


@pytest.mark.parametrize("fault", ["product", "slot"])
def test_a_bad_argument_is_refused_before_anything_is_written(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """Every layer's products, and the pass's pool slots (the same for every layer), are checked before the layers'
    region starts: the last layer's down product naming no kernel, or a row's slot past the pool, fails the call
    with -1, and the hidden rows, the pool and the mirror are as they were (no layer ran), so the same pass with
    the fault mended gives the eager layers' bits."""
    model = _gguf_model(bias=False)
    refused: list[bool] = []
    real = native_layers.NativeLayers.run

    def with_a_fault_first(self: Any, x: torch.Tensor, fused: Any) -> torch.Tensor | None:
        last = self._table(x.shape[0])[len(self._layers) - 1]
        kernel, slots = last.down.kernel, fused.slots
        if fault == "product":
            last.down.kernel = 9
        else:
            fused.slots = slots.clone()
            fused.slots[-1] = fused.pool.kv.shape[2] * fused.pool.kv.shape[3]  # one past the last slot
        before = [t.clone() for t in (x, fused.pool.kv, *fused.mirror.k, *fused.mirror.v)]
        try:
            with pytest.raises(RuntimeError, match="status -1"):
                real(self, x, fused)
        finally:
            last.down.kernel, fused.slots = kernel, slots
        after = (x, fused.pool.kv, *fused.mirror.k, *fused.mirror.v)
        refused.append(all(torch.equal(a, b) for a, b in zip(before, after, strict=True)))
        return real(self, x, fused)

    monkeypatch.setattr(native_layers.NativeLayers, "run", with_a_fault_first)
    native = _decode_together(model, 2, threads=2)
    assert refused and all(refused), "a refused call wrote something"
    model.native_layers = None
    for (tokens_a, a), (tokens_b, b) in zip(native, _decode_together(model, 2, threads=2), strict=True):
        assert tokens_a == tokens_b and torch.equal(a, b)


def test_more_rows_than_the_native_norm_takes_run_the_eager_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _gguf_model(bias=False)
    ran: list[bool] = []
    real = native_layers.NativeLayers.run
    monkeypatch.setattr(
        native_layers.NativeLayers, "run", lambda self, x, f: ran.append(x.shape[0]) or real(self, x, f)
    )
    native = _decode_together(model, 6)  # 6 rows, then 5 (eager), then 4 and fewer (native)
    assert {6, 5, 4, 1} <= set(ran)
    model.native_layers = None
    for (tokens_a, a), (tokens_b, b) in zip(native, _decode_together(model, 6), strict=True):
        assert tokens_a == tokens_b and torch.equal(a, b)


def _force(model: LlamaModel, path_to_8: str) -> None:
    """Every product of a float32 model on `path_to_8` for 1 to 8 rows and F.linear above (a measured plan)."""
    layers = model_linears(model)
    shapes = {f"{x.weight.shape[0]}x{x.weight.shape[1]}" for x in layers}
    choices = {s: {b: path_to_8 if b <= 8 else "linear" for b in BUCKETS} for s in shapes}
    apply_plan(layers, KernelPlan({}, choices))


@pytest.mark.parametrize("threads", [1, 2])
def test_float32_native_layers_give_the_eager_layers_bits_and_stay_near_float64(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """A float32 model whose plan puts every product's 1 to 8 rows on "native" (densedot.c): its decode passes run
    in the native layers with the eager layers' bits, and its logits stay within float32 error of the same model
    under the fixed rules (another summation order: MKL's and oneDNN's)."""
    cfg = tiny_config(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
    model = LlamaModel(cfg, random_weights(cfg, 9))
    plan = model.native_layers
    assert plan is not None and plan.dense and not plan.takes(1)  # the fixed rules never run natively
    fixed = _decode_together(model, 4)
    _force(model, "native")
    assert plan.takes(1) and plan.takes(4) and not plan.takes(9)
    _force(model, "mm_t")  # a plan that is not native for these rows: the plan's own cache follows it
    assert not plan.takes(1)
    layers = model_linears(model)
    o_shape, gate_up_shape = (
        f"{x.weight.shape[0]}x{x.weight.shape[1]}" for x in (model.layers[0].o, model.layers[0].gate_up)
    )
    for slow, takes in ((o_shape, True), (gate_up_shape, False)):  # o: 1/9 of a layer's weights here; gate_up: 4/9
        shapes = {f"{x.weight.shape[0]}x{x.weight.shape[1]}" for x in layers}
        choices = {s: {b: "mm_t" if s == slow or b > 8 else "native" for b in BUCKETS} for s in shapes}
        apply_plan(layers, KernelPlan({}, choices))
        assert plan.takes(1) is takes, slow
    ran: list[bool] = []
    real = native_layers.NativeLayers.run
    monkeypatch.setattr(
        native_layers.NativeLayers, "run", lambda self, x, f: ran.append((out := real(self, x, f)) is not None) or out
    )
    native = _decode_together(model, 4, "native", threads)
    assert ran and all(ran), "the native layers never ran, or refused a pass"
    monkeypatch.setattr(native_layers.NativeLayers, "run", lambda self, x, f: None)  # the plan stays: its SiLU too
    eager = _decode_together(model, 4, "native", threads)
    for (tokens_a, a), (tokens_b, b), (tokens_c, c) in zip(native, eager, fixed, strict=True):
        assert tokens_a == tokens_b and torch.equal(a, b)
        assert tokens_a == tokens_c
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_a_model_with_mixed_products_has_no_plan() -> None:
    model = _gguf_model(bias=False)
    last = model.layers[-1]  # one dense product among block ones
    model.layers[-1] = dataclasses.replace(last, down=DenseLinear(torch.randn(64, 128)))
    assert native_layers.NativeLayers.build(model) is None


def test_silu_mul_is_silu_times_up_to_float32_rounding() -> None:
    ops = NativeDecodeOps()
    g = torch.Generator().manual_seed(3)
    gate = torch.cat([torch.randn(3, 100, generator=g) * 6, torch.tensor([[-1e4, -100.0, -88.0, -20.0, 0.0]] * 3)], 1)
    gate = torch.cat([gate, torch.tensor([[20.0, 88.0, 100.0, 1e4, -0.0]] * 3)], 1)  # 110 wide: lanes and a tail
    up = torch.randn(3, gate.shape[1], generator=g)
    out = ops.silu_mul(torch.cat([gate, up], 1))
    assert out is not None and out.shape == gate.shape
    want = (gate.double() * torch.sigmoid(gate.double())) * up.double()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), want, rtol=4e-7, atol=1e-30)
    assert ops.silu_mul(torch.zeros(2, 3)) is None  # an odd width has no gate / up halves


@pytest.mark.parametrize("width", [16, 19])  # vector lanes only, and a scalar tail too
def test_silu_mul_of_a_huge_negative_gate_is_pytorchs_silu(width: int) -> None:
    """Below -88 the exp is clamped: g / (1 + exp(88)) grew with |g| (-1.8 at -3e38, where SiLU is -0). Gates from
    -89 to -3e38 and -inf, with the others of each row, against PyTorch's silu(gate) * up (NaN where it is NaN)."""
    far = torch.tensor([-89.0, -100.0, -1e4, -1e10, -3e38, -float("inf"), float("inf"), float("nan")])
    gate = torch.cat([far, torch.linspace(-20.0, 20.0, width - len(far))])
    gate = torch.stack([gate, gate.roll(5)])
    up = torch.linspace(-3.0, 3.0, width).expand(2, width)
    out = NativeDecodeOps().silu_mul(torch.cat([gate, up], 1))
    assert out is not None
    want = F.silu(gate) * up
    torch.testing.assert_close(out, want, rtol=4e-7, atol=1e-30, equal_nan=True)


@pytest.mark.parametrize(("rows", "inter"), [(1, 1536), (2, 1037), (48, 1536), (70, 1000), (1, 17)])
def test_silu_mul_has_the_same_bits_on_any_number_of_threads(rows: int, inter: int) -> None:
    """From 65,536 values the threads split the rows (decode_layers.c): every lane and tail sees the same positions
    of a row, so 1 to 4 threads give one thread's bits, and those are SiLU(gate) * up to float32 rounding."""
    ops = NativeDecodeOps()
    g = torch.Generator().manual_seed(rows * 7919 + inter)
    gated = torch.randn(rows, 2 * inter, generator=g) * 5
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.silu_mul(gated)
        assert one is not None
        for threads in (2, 3, 4):
            torch.set_num_threads(threads)
            assert torch.equal(ops.silu_mul(gated), one), threads
    finally:
        torch.set_num_threads(before)
    gate, up = gated.double().chunk(2, dim=1)
    torch.testing.assert_close(one.double(), gate * torch.sigmoid(gate) * up, rtol=4e-7, atol=1e-30)


def test_two_engines_sharing_one_model_on_two_threads_decode_as_each_alone() -> None:
    """The plan belongs to the model, and engines on other threads may share a model: each pass must use its own
    engine's mirror and pool (the plan's cache of mirror pointers is read once per pass)."""
    model = _gguf_model(bias=False)
    alone = {rows: _decode_together(model, rows) for rows in (2, 4)}
    together: dict[int, list[tuple[list[int], torch.Tensor]]] = {}
    threads = [threading.Thread(target=lambda r=r: together.__setitem__(r, _decode_together(model, r))) for r in (2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for rows in (2, 4):
        for (tokens_a, a), (tokens_b, b) in zip(alone[rows], together[rows], strict=True):
            assert tokens_a == tokens_b and torch.equal(a, b)


def count_native_heads(mp: pytest.MonkeyPatch) -> list[bool]:
    """Each decode-only pass's head from now on: True where it ran natively, in the layers' call
    (NativeLayers._step_head, native_decode_step) or in a call of its own after them (NativeLayers.head)."""
    ran: list[bool] = []
    in_step, after = native_layers.NativeLayers._step_head, native_layers.NativeLayers.head

    def step_head(self: Any, *args: Any) -> Any:
        out = in_step(self, *args)
        if out is not None:  # else the pass's head runs after the layers: `head` records it
            ran.append(True)
        return out

    def head(self: Any, *args: Any) -> Any:
        out = after(self, *args)
        ran.append(out is not None)
        return out

    mp.setattr(native_layers.NativeLayers, "_step_head", step_head)
    mp.setattr(native_layers.NativeLayers, "head", head)
    return ran


@pytest.mark.parametrize("kind", ["gguf-float", "gguf-int8", "float32"])
def test_native_head_gives_the_eager_heads_logits_and_tokens(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Decode passes end in NativeLayers.head (final norm, head, argmax in one call): the logits keep the eager
    head's bits and the greedy tokens its argmax's, on a batch that shrinks from 4 rows to 1."""
    if kind == "float32":
        cfg = tiny_config(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
        model, path = LlamaModel(cfg, random_weights(cfg, 9)), "native"
    else:
        monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", kind.split("-")[1])
        model, path = _gguf_model(bias=True), None
    ran = count_native_heads(monkeypatch)
    native = _decode_together(model, 4, path)
    team = _decode_together(model, 4, path, threads=2)  # the head in the team's region (decode_team.c)
    assert ran and all(ran), "the native head never ran, or refused a pass"
    monkeypatch.setattr(native_layers.NativeLayers, "head", lambda self, *a: None)
    monkeypatch.setattr(native_layers.NativeLayers, "_step_head", lambda self, *a: None)
    eager = _decode_together(model, 4, path)
    for (tokens_a, a), (tokens_b, b) in zip(team, eager, strict=True):
        assert tokens_a == tokens_b and torch.equal(a, b)
    for (tokens_a, a), (tokens_b, b) in zip(native, eager, strict=True):
        assert tokens_a == tokens_b and torch.equal(a, b)


def test_native_head_alone_against_the_models_logits() -> None:
    """NativeLayers.head over given rows: LlamaModel.logits' bits, numpy's argmax (None for a row with a NaN or an
    infinite maximum), and None (nothing run) for more rows than the native norm takes or a head the measured
    plan does not run natively."""
    model = _gguf_model(bias=False)
    plan = model.native_layers
    assert plan is not None
    eps = model.config.rms_norm_eps
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    out = plan.head(x, model.norm, eps, model.lm_head)
    assert out is not None
    logits, best = out
    assert torch.equal(logits, model.logits(x, prefill=False, decode_rows=3))
    assert list(best) == [int(row.argmax()) for row in logits]
    x[1, 5] = float("nan")
    _, best = plan.head(x, model.norm, eps, model.lm_head) or (None, None)
    assert best is not None and best[1] is None and best[0] is not None
    assert plan.head(torch.randn(5, 64), model.norm, eps, model.lm_head) is None  # the native norm takes 4
    cfg = tiny_config(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
    dense = LlamaModel(cfg, random_weights(cfg, 9))
    assert dense.native_layers is not None  # fixed rules: the head's path is not "native"
    assert dense.native_layers.head(x, dense.norm, eps, dense.lm_head) is None


def test_native_head_tokens_go_only_to_plain_greedy_rows_without_a_grammar(tmp_path) -> None:
    """One decode batch through the native head: a JSON-constrained request (its row masked after the pass, so the
    pass's argmax is not its token), a request with a logit bias and a plain greedy one. The constrained output
    parses (a token the mask forbids would fail the request), the biased one takes its biased token, and the plain
    one's tokens are the eager head's."""
    from radixcache.runtime.loading.tokenizer import Tokenizer
    from tests.cli.conftest import write_tiny_checkpoint

    tokenizer = Tokenizer.from_hf_dir(write_tiny_checkpoint(tmp_path / "tiny"))
    model = _gguf_model(bias=False, vocab=260)
    biased = tokenizer.encode("z", add_special_tokens=False)[0]

    def run() -> list[Any]:
        with Engine(model, tokenizer=tokenizer, capacity_blocks=64, page_size=8, threads=1) as engine:
            release = hold_engine_loop(engine)
            handles = [
                engine.submit([5, 6, 7, 8], 12, response_format={"type": "json_object"}),
                engine.submit([9, 10, 11], 6, ignore_eos=True, logit_bias={biased: 100.0}),
                engine.submit([12, 13], 8, ignore_eos=True),
            ]
            release()
            return [h.result(60) for h in handles]

    with pytest.MonkeyPatch.context() as mp:
        ran = count_native_heads(mp)
        constrained, bias, plain = run()
    assert ran and all(ran)
    assert constrained.finish_reason in ("stop", "length") and constrained.text.startswith("{")
    if constrained.finish_reason == "stop":
        assert isinstance(json.loads(constrained.text), dict)
    assert list(bias.token_ids) == [biased] * 6
    model.native_layers = None
    assert list(run()[2].token_ids) == list(plain.token_ids)


def test_requests_arriving_mid_decode_give_the_eager_heads_tokens_and_logits() -> None:
    """A request arriving while another decodes (its prefill shares mixed passes, where the eager head runs), a
    third while both decode, one cancelled mid-decode: every pass of decodes alone ends in the native head, and
    each finished request's tokens are those of the same arrivals with the eager head and layers, and its logits
    within float32 noise of them (the arrivals race the steps, so the two runs' passes group rows differently, and a
    block kernel is chosen per row count)."""
    model = _gguf_model(bias=False)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (12, 27, 9, 15)]

    def arrive() -> list[Any]:
        with Engine(model, capacity_blocks=64, page_size=8, threads=1, thread_policy="fixed") as engine:
            handles = []
            for i, p in enumerate(prompts):
                if handles:
                    deadline = time.monotonic() + 60
                    while len(handles[-1].request.output_ids) < 3 and not handles[-1].done():
                        assert time.monotonic() < deadline, "the engine made no progress"
                        time.sleep(0.001)
                handles.append(engine.submit(p, 10, ignore_eos=True, return_logits=True))
                if i == 2:
                    handles[0].cancel()  # mid-decode, while the others go on
            return [h.result(60) for h in handles[1:]]

    with pytest.MonkeyPatch.context() as mp:
        ran = count_native_heads(mp)
        native = arrive()
    assert ran and all(ran)
    model.native_layers = None
    eager = arrive()
    for a, b in zip(native, eager, strict=True):
        assert list(a.token_ids) == list(b.token_ids) and len(a.token_ids) == 10
        torch.testing.assert_close(torch.stack(list(a.logits)), torch.stack(list(b.logits)), rtol=1e-4, atol=1e-4)
