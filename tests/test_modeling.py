"""The model against SPEC sections 2-5: the maths of every mode, exact conversion, caching, checkpointing."""

import copy
import gc
import weakref
from types import SimpleNamespace

import pytest
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from conftest import tiny_qwen3_config
from spec_reference import randomize_routing, reference_forward
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, Qwen3ForCausalLM, pipeline

from finetune.model import enable_activation_checkpointing
from modeling_delta_qwen3 import DeltaQwen3Config, DeltaQwen3ForCausalLM, DeltaQwen3Model
from modeling_delta_qwen3 import routing_buffer
from modeling_delta_qwen3.routing_buffer import SourceBuffer, upfront_gates, upfront_queries
from modeling_delta_qwen3.routing import RoutingPoint

MODES = ["delta", "delta_block", "attnres_full", "attnres_block"]
# (mode, gated): every mode, and the gate where it exists.
# Five layers, so that 2 and 3 blocks give uneven blocks; weights large enough that routing changes the logits.
SHAPE = dict(num_hidden_layers=5, initializer_range=0.1)
VARIANTS = [("delta", False), ("delta", True), ("delta_block", False), ("delta_block", True)] + [
    ("attnres_full", False),
    ("attnres_block", False),
]


def delta_config(mode: str = "delta_block", gated: bool = False, **overrides) -> DeltaQwen3Config:
    fields = tiny_qwen3_config(**{**SHAPE, **overrides}).to_dict()
    fields.pop("model_type")
    return DeltaQwen3Config(**fields, routing_mode=mode, routing_gate=gated, routing_num_blocks=2)


def random_model(mode: str, gated: bool = False, seed: int = 0, scale: float = 0.3) -> DeltaQwen3ForCausalLM:
    torch.manual_seed(seed)
    model = DeltaQwen3ForCausalLM(delta_config(mode, gated)).eval()
    randomize_routing(model, seed, scale)
    return model


def token_ids(batch: int = 2, seq: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 512, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mode,gated", VARIANTS)
@pytest.mark.parametrize("num_blocks", [2, 3])
@pytest.mark.parametrize("grad", [True, False], ids=["autograd", "inference"])
def test_matches_spec_reference(mode, gated, num_blocks, grad):
    """Both routing paths: the fused autograd function (training) and the stacked one (inference)."""
    model = random_model(mode, gated)
    model.config.routing_num_blocks = num_blocks
    ids = token_ids()
    expected_logits, expected_weights = reference_forward(model, ids)
    with torch.set_grad_enabled(grad):
        out = model.double()(ids, output_routing_weights=True)
    torch.testing.assert_close(out.logits, expected_logits, atol=1e-5, rtol=0)
    assert len(out.routing_weights) == len(expected_weights)
    for got, expected in zip(out.routing_weights, expected_weights):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # In float32 the model differs from the float64 reference by rounding alone.
    with torch.set_grad_enabled(grad):
        logits32 = model.float()(ids).logits
    torch.testing.assert_close(logits32.double(), expected_logits, atol=1e-4, rtol=0)


def test_reference_is_sensitive_to_routing():
    """The reference would catch a model that ignored its routing parameters."""
    model = random_model("delta")
    ids = token_ids()
    before, _ = reference_forward(model, ids)
    with torch.no_grad():
        model.model.layers[3].mlp_route.query.mul_(-1)
    after, _ = reference_forward(model, ids)
    assert (before - after).abs().max() > 1e-3


@pytest.mark.parametrize("mode", MODES)
def test_routing_weight_shapes(monkeypatch, mode):
    kept = []  # per source appended, the buffer's capacity

    def append(self, x, append=SourceBuffer.append):
        kept.append(self.storage.capacity)
        append(self, x)

    monkeypatch.setattr(SourceBuffer, "append", append)
    config = delta_config(mode)  # 5 layers, 2 blocks of 3 layers
    out = DeltaQwen3ForCausalLM(config)(token_ids(batch=2, seq=7), output_routing_weights=True)
    counts = [w.shape[-1] for w in out.routing_weights]
    # Only sources that some point reads are kept (in delta mode, not the last sublayer's output), in a buffer
    # of just their number.
    assert kept == [max(counts)] * max(counts)
    expected = {
        "delta": list(range(2, 11)),
        "delta_block": [1] * 5 + [2] * 4,
        "attnres_full": list(range(2, 12)),
        "attnres_block": [2] * 5 + [2] + [3] * 3 + [3],
    }[mode]
    assert counts == expected
    for weights in out.routing_weights:
        assert weights.shape[:2] == (2, 7)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 7))


@pytest.mark.parametrize("mode", MODES)
def test_parameter_names_shapes_and_init(mode):
    gated = mode.startswith("delta")
    config = delta_config(mode, gated)
    model = DeltaQwen3ForCausalLM(config)
    routing = {name: p for name, p in model.state_dict().items() if "_route." in name}
    expected = set()
    for i in range(config.num_hidden_layers):
        for kind in (["attn", "mlp"] if i >= 1 else ["mlp"]):
            expected |= {f"model.layers.{i}.{kind}_route.query", f"model.layers.{i}.{kind}_route.norm.weight"}
            if gated:
                expected.add(f"model.layers.{i}.{kind}_route.gate")
    if mode.startswith("attnres"):
        expected |= {"model.final_route.query", "model.final_route.norm.weight"}
    assert set(routing) == expected
    for name, value in routing.items():
        shape, fill = {"query": ((64,), 0.0), "weight": ((64,), 1.0), "gate": ((), 0.0)}[name.rsplit(".", 1)[1]]
        assert value.shape == shape
        assert torch.equal(value, torch.full(shape, fill))
    qwen3_names = set(Qwen3ForCausalLM(tiny_qwen3_config(**SHAPE)).state_dict())
    assert set(model.state_dict()) - expected == qwen3_names


@pytest.mark.parametrize("mode", ["delta", "delta_block"])
@pytest.mark.parametrize("tied", [False, True])
def test_gated_zero_init_reproduces_qwen3(mode, tied):
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(tiny_qwen3_config(**SHAPE, tie_word_embeddings=tied)).eval()
    delta = DeltaQwen3ForCausalLM(delta_config(mode, gated=True, tie_word_embeddings=tied)).eval()
    missing, unexpected = delta.load_state_dict(qwen3.state_dict(), strict=False)
    assert not unexpected and all("_route." in name for name in missing)
    ids = token_ids()
    expected = qwen3(ids).logits
    torch.testing.assert_close(delta(ids).logits, expected, atol=1e-5, rtol=0)
    # Once the gates open, routing changes the function.
    randomize_routing(delta)
    assert (delta(ids).logits - expected).abs().max() > 1e-2


def test_ungated_zero_init_adds_the_mean_of_the_sources():
    """Ungated, zero queries add the uniform mean of the sources. In `delta` mode that mean is `h_s / n`, which
    the pre-norm cancels (up to its eps); in `delta_block` it is not proportional to `h_s`, so the function moves."""
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(tiny_qwen3_config(**SHAPE)).eval()
    ids = token_ids()
    expected = qwen3(ids).logits
    differences = {}
    for mode in ("delta", "delta_block"):
        ungated = DeltaQwen3ForCausalLM(delta_config(mode, gated=False)).eval()
        ungated.load_state_dict(qwen3.state_dict(), strict=False)
        differences[mode] = (ungated(ids).logits - expected).abs().max().item()
    assert differences["delta"] < 1e-4
    assert differences["delta_block"] > 1e-2


def point(query: torch.Tensor, norm_weight: torch.Tensor, gate: torch.Tensor | None = None) -> SimpleNamespace:
    """A routing point over given tensors: a `RoutingPoint` holds parameters, which gradcheck cannot vary."""
    return SimpleNamespace(query_and_norm_weight=lambda: (query, norm_weight), gate=gate)


@pytest.mark.parametrize("upfront", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_routing_gradients_match_finite_differences(gated, upfront):
    """The hand-written backward of `SourceBuffer` against numerical gradients, with additive and replacement
    routing, a read-once `extra` source, and sources computed from earlier routed outputs as in the model; with
    the points' queries and gates known up front (scores computed as sources are written; points without `extra`
    left to their newest source, here two runs of them around a point with `extra`) and not (sharded parameters)."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    def routed(x0, x1, x2, residual, extra, q0, g0, q1, g1, q2, g2, q3, g3, gate):
        points = [point(q0, g0, gate), point(q1, g1, gate), point(q2, g2, gate), point(q3, g3, gate)]
        queries, gates = (upfront_queries(points, x0), upfront_gates(points, x0)) if upfront else (None, None)
        sources = SourceBuffer(1e-6, capacity=4, max_points=4, queries=queries, gates=gates)
        sources.append(x0)
        sources.append(x1)
        first = sources.route(point(q0, g0, gate), residual=residual)[0]
        second = sources.route(point(q1, g1), extra=extra)[0]
        third = sources.route(point(q2, g2, gate), residual=first)[0]
        sources.append(torch.tanh(first) + x2)
        sources.append(second * third)
        return sources.route(point(q3, g3, gate), residual=second)[0]

    inputs = [rand(2, 3, 8) for _ in range(5)] + [rand(8) for _ in range(8)] + [rand(()) if gated else None]
    assert torch.autograd.gradcheck(routed, inputs)


def test_queries_are_taken_up_front_only_from_whole_local_tensors():
    """Up front, the points' `q * g` in order, with or without autograd; None for a parameter that is offloaded
    (meta) or partitioned (empty), whose values are known only when its point runs."""

    like = torch.zeros(2, 3, 4)
    q, g = torch.randn(2, 4), torch.randn(2, 4)
    points = [point(q[0], g[0]), point(q[1], g[1])]
    torch.testing.assert_close(upfront_queries(points, like), q * g, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(upfront_queries(points, like), q * g, atol=0, rtol=0)
    for odd in (torch.empty(4, device="meta"), torch.empty(0)):
        assert upfront_queries([*points, point(odd, g[0])], like) is None
    assert upfront_queries([point(torch.empty(4, device="meta"), torch.empty(4, device="meta"))], like) is None
    assert upfront_queries([point(torch.empty(0), torch.empty(0))], like) is None


def test_a_routing_point_reads_its_parameters_or_the_tensors_a_wrapper_swapped_in():
    """FSDP1 without `use_orig_params` replaces parameters with plain tensors for the forward pass."""
    routing_point = RoutingPoint(4, 1e-6, gated=False)
    query, norm_weight = routing_point.query_and_norm_weight()
    assert query is routing_point.query and norm_weight is routing_point.norm.weight
    swapped = torch.randn(4)
    del routing_point.query
    routing_point.query = swapped
    query, norm_weight = routing_point.query_and_norm_weight()
    assert query is swapped and norm_weight is routing_point.norm.weight


@pytest.mark.parametrize("upfront", [False, True])
def test_one_token_routing_moved_between_points_routes_as_unmoved(upfront):
    """A decoding step whose state a device hook moves between layers (`to`, here a forced copy on the same
    device): the moved buffers stay one padded buffer, so the sources written after the move are routed right. One
    token (`mix_one_token`, gates read as numbers when known up front) routes as each of two tokens does (`mix`)."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    sources = rand(4, 1, 1, 8)
    points = [point(rand(8), rand(8).abs() + 0.5, rand(())) for _ in range(3)]

    def route(move: bool, batch: int = 1) -> list[torch.Tensor]:
        x = sources.expand(-1, batch, -1, -1)
        with torch.no_grad():
            queries, gates = (upfront_queries(points, x[0]), upfront_gates(points, x[0])) if upfront else (None, None)
            buffer = SourceBuffer(1e-6, capacity=4, max_points=3, queries=queries, gates=gates)
            buffer.append(x[0])
            buffer.append(x[1])
            outs = [buffer.route(points[0], residual=x[3])[0]]
            if move:
                buffer = buffer.to("cpu", copy=True)
            buffer.append(x[2])
            outs.append(buffer.route(points[1], residual=x[3])[0])
            outs.append(buffer.route(points[2], extra=x[3])[0])
        return outs

    moved, unmoved, two_tokens = route(move=True), route(move=False), route(move=False, batch=2)
    for a, b, c in zip(moved, unmoved, two_tokens):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        torch.testing.assert_close(c, b.expand_as(c), atol=1e-14, rtol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 2])
def test_decoding_step_matches_full_forward(mode, batch):
    """A decoding step (one position per sequence: per-point logits, and single-batch products for a single
    sequence) gives the last position's logits and routing weights of a full forward pass."""
    model = random_model(mode, gated=mode.startswith("delta"), scale=1.0).double()
    ids = token_ids(batch=batch, seq=7)
    with torch.no_grad():
        full = model(ids, output_routing_weights=True)
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        step = model(ids[:, -1:], past_key_values=cache, use_cache=True, output_routing_weights=True)
    torch.testing.assert_close(step.logits, full.logits[:, -1:], atol=1e-9, rtol=0)
    assert len(step.routing_weights) == len(full.routing_weights)
    for got, expected in zip(step.routing_weights, full.routing_weights):
        torch.testing.assert_close(got, expected[:, -1:], atol=1e-9, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_decoding_steps_depend_on_their_arguments_alone(mode):
    """Each decoding step gives the full forward pass's logits, also from a deep copy of the cache (a prompt's cache
    reused for several continuations); the cache holds the keys and values only: nothing of the routing is kept
    from step to step, so an exported decoding step computes the same."""
    model = random_model(mode, gated=mode.startswith("delta"), scale=1.0).double()
    ids = token_ids(batch=1, seq=9)
    with torch.no_grad():
        cache = model(ids[:, :5], use_cache=True).past_key_values
        attributes = set(vars(cache))
        for position in range(5, 9):
            if position == 7:
                cache = copy.deepcopy(cache)
            expected = model(ids[:, : position + 1]).logits[:, -1:]
            step = model(ids[:, position : position + 1], cache=cache)
            torch.testing.assert_close(step.logits, expected, atol=1e-9, rtol=0)
            assert set(vars(cache)) == attributes


def _loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode,gated", VARIANTS)
@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_same_loss_and_gradients(mode, gated, reentrant):
    """Checkpointed layers route with the compiled implementation by default (see `resolve_implementation`): the
    same one computes the unchecked run."""
    model = random_model(mode, gated).train()
    ids = token_ids()
    model.set_routing_implementation("compiled")
    loss, grads = _loss_and_grads(model, ids)
    model.set_routing_implementation(None)
    enable_activation_checkpointing(model, use_reentrant=reentrant)
    assert model.model.layers[0].gradient_checkpointing
    loss_ckpt, grads_ckpt = _loss_and_grads(model, ids)
    torch.testing.assert_close(loss_ckpt, loss, atol=1e-6, rtol=0)
    assert grads.keys() == grads_ckpt.keys() and any("_route." in n for n in grads)
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("mode,gated", VARIANTS)
def test_backward_passes_left_to_the_sources_agree_with_each_points_own(monkeypatch, mode, gated):
    """With the points' parameters known up front, points leave their backward pass to their newest source (see
    `_deferred_point_backward`); with them unknown (sharded, offloaded), each point takes its own. Both give the
    same gradients, in float64."""
    model = random_model(mode, gated).train().double()
    ids = token_ids()
    loss, grads = _loss_and_grads(model, ids)
    monkeypatch.setattr(routing_buffer, "upfront_queries", lambda points, like: None)
    monkeypatch.setattr(routing_buffer, "upfront_gates", lambda points, like: None)
    own_loss, own_grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(own_loss, loss, atol=1e-12, rtol=0)
    assert grads.keys() == own_grads.keys() and any(name.endswith("_route.gate") for name in grads) == gated
    for name in grads:
        torch.testing.assert_close(own_grads[name], grads[name], atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("mode", MODES)
def test_sdpa_and_eager_agree(mode):
    """Masks and positions reach both attention backends alike. Their float32 rounding differs by ~1e-6, which
    replacement routing (AttnRes) amplifies through depth to ~1e-5 at these logits (magnitude ~3); a mask or a
    position handled differently would differ by orders of magnitude more. (In float64 the eager backend turns the
    left-padded sequence into NaN.)"""
    model = random_model(mode, gated=mode.startswith("delta"))
    ids = token_ids()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding in the second row
    model.set_attn_implementation("eager")
    eager = model(ids, attention_mask=mask).logits
    model.set_attn_implementation("sdpa")
    sdpa = model(ids, attention_mask=mask).logits
    real = mask.bool()  # padded positions attend to nothing; each backend fills them differently
    torch.testing.assert_close(sdpa[real], eager[real], atol=2e-5, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_generate_with_and_without_cache(mode):
    model = random_model(mode, gated=mode.startswith("delta"), scale=1.0)
    prompt = token_ids(batch=1, seq=6)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=2, eos_token_id=None)
    cached = model.generate(prompt, use_cache=True, **kwargs)
    assert cached.shape == (1, 18)
    assert torch.equal(model.generate(prompt, use_cache=False, **kwargs), cached)
    # Logits too, in float64 so that the comparison sees the maths rather than float32 rounding (which the
    # AttnRes modes, having no residual stream, amplify to ~1e-5).
    model.double()
    kwargs.update(output_logits=True, return_dict_in_generate=True)
    with_cache = model.generate(prompt, use_cache=True, **kwargs).logits
    without_cache = model.generate(prompt, use_cache=False, **kwargs).logits
    for a, b in zip(with_cache, without_cache, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    model.float()
    # The same continuation as a step-by-step argmax over full forward passes.
    sequence = prompt
    for _ in range(12):
        next_token = model(sequence).logits[:, -1].argmax(-1, keepdim=True)
        sequence = torch.cat([sequence, next_token], dim=1)
    assert torch.equal(cached, sequence)


@pytest.mark.parametrize("mode", ["delta_block", "attnres_full"])
def test_left_padded_batch_generates_like_single_rows(mode):
    model = random_model(mode, gated=mode.startswith("delta"), scale=3.0)
    short, long = token_ids(batch=1, seq=4, seed=5)[0], token_ids(batch=1, seq=9, seed=6)[0]
    pad = 2
    batch = torch.full((2, 9), pad)
    batch[0, 5:], batch[1] = short, long
    mask = (torch.arange(9) >= 5).long().unsqueeze(0).repeat(2, 1)
    mask[1] = 1
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=pad, eos_token_id=None)
    batched = model.generate(batch, attention_mask=mask, **kwargs)
    for row, prompt in enumerate([short, long]):
        single = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long), **kwargs)
        assert torch.equal(batched[row, 9:], single[0, len(prompt) :])


@pytest.mark.parametrize("mode", MODES)
def test_bfloat16_forward_and_backward(mode):
    model = random_model(mode, gated=mode.startswith("delta")).train()
    ids = token_ids()
    reference = model(ids).logits
    model = model.to(torch.bfloat16)
    out = model(ids, labels=ids, output_routing_weights=True)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16
    assert (out.logits.float() - reference).abs().max() < 0.1 * reference.abs().max()
    route_grads = [p.grad for n, p in model.named_parameters() if "_route." in n]
    assert all(g is not None and g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in route_grads)
    assert any(g.abs().sum() > 0 for g in route_grads)


@pytest.mark.parametrize("mode", MODES)
def test_bfloat16_decoding_step(mode):
    """A bfloat16 decoding step (routing in float32 on bfloat16 sources) gives the full forward pass's last logits,
    to bfloat16's precision."""
    model = random_model(mode, gated=mode.startswith("delta")).to(torch.bfloat16)
    ids = token_ids(batch=1, seq=7)
    with torch.no_grad():
        full = model(ids).logits[:, -1:]
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        step = model(ids[:, -1:], past_key_values=cache, use_cache=True).logits
    assert step.dtype == torch.bfloat16
    assert (step.float() - full.float()).abs().max() < 0.05 * full.float().abs().max()


@pytest.mark.parametrize("mode", MODES)
def test_routing_buffers_are_freed_by_reference_counting(monkeypatch, mode):
    """After a training forward, with or without backward, nothing keeps the sources' buffers (or the autograd
    graph that holds them) alive: no reference cycle, which the garbage collector could not break either."""
    storages = []

    class TrackedStorage(routing_buffer._SourceStorage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            storages.append(weakref.ref(self))

    monkeypatch.setattr(routing_buffer, "_SourceStorage", TrackedStorage)
    model = random_model(mode).train()
    ids = token_ids()
    gc.disable()
    try:
        loss = model(ids, labels=ids).loss
        del loss
        model(ids, labels=ids).loss.backward()
        assert len(storages) == 2 and all(storage() is None for storage in storages)
    finally:
        gc.enable()


@pytest.mark.parametrize("mode", MODES)
def test_accelerate_device_hooks_keep_loss_and_gradients(mode):
    """Dispatch with a `device_map` hooks every decoder layer to move its inputs, the depth state among them, to the
    layer's device; the moved state must keep routing over the same sources and give the same gradients."""
    model = random_model(mode, gated=mode.startswith("delta")).train()
    ids = token_ids()
    loss, grads = _loss_and_grads(model, ids)
    for layer in model.model.layers:
        add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", io_same_device=True))
    hooked_loss, hooked_grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(hooked_loss, loss, atol=0, rtol=0)
    assert hooked_grads.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(hooked_grads[name], grads[name], atol=0, rtol=0, msg=name)


def test_auto_classes_are_registered():
    config = delta_config("delta")
    assert isinstance(AutoConfig.for_model("delta_qwen3", num_hidden_layers=2, routing_num_blocks=2), DeltaQwen3Config)
    assert isinstance(AutoModel.from_config(config), DeltaQwen3Model)
    assert isinstance(AutoModelForCausalLM.from_config(config), DeltaQwen3ForCausalLM)


def test_return_dict_false_gives_tuple():
    model = random_model("delta")
    ids = token_ids()
    logits = model(ids).logits
    as_tuple = model(ids, return_dict=False, use_cache=False)
    assert torch.equal(as_tuple[0], logits)


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"routing_mode": "residual"}, "routing_mode"),
        ({"routing_num_blocks": 0}, "routing_num_blocks"),
        ({"routing_num_blocks": 6}, "routing_num_blocks"),
        ({"routing_mode": "attnres_full", "routing_gate": True}, "routing_gate"),
        ({"routing_mode": "attnres_block", "routing_gate": True}, "routing_gate"),
    ],
)
def test_bad_config_values_name_the_field(overrides, field):
    fields = {"num_hidden_layers": 5, "routing_num_blocks": 2, **overrides}
    with pytest.raises(ValueError, match=field) as error:
        DeltaQwen3Config(**fields)
    assert str(overrides.get(field, "")) in str(error.value)


def test_num_blocks_equal_to_depth_and_one_block_are_valid():
    assert DeltaQwen3Config(num_hidden_layers=5, routing_num_blocks=5).layers_per_block == 1
    assert DeltaQwen3Config(num_hidden_layers=5, routing_num_blocks=1).layers_per_block == 5
    model = copy.deepcopy(random_model("delta_block"))
    model.config.routing_num_blocks = 5
    ids = token_ids()
    torch.testing.assert_close(model.double()(ids).logits, reference_forward(model, ids)[0], atol=1e-5, rtol=0)


def test_text_generation_pipeline(tokenizer):
    model = random_model("delta_block", gated=True, scale=1.0)
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    prompt = "The for statement"
    text = generator(prompt, max_new_tokens=6, do_sample=False, return_full_text=False)[0]["generated_text"]
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=2)
    assert expected.shape[1] == ids.shape[1] + 6 and text
    assert text == tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.mark.parametrize("mode", ["delta", "delta_block"])
def test_converted_model_hidden_states_and_attentions_are_qwen3s(mode):
    """A gated model with Qwen3's weights and zero-initialised routing returns Qwen3's `num_hidden_layers + 1` hidden
    states (the last after the final norm) and its eager attention weights."""
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(tiny_qwen3_config(**SHAPE)).eval()
    delta = DeltaQwen3ForCausalLM(delta_config(mode, gated=True)).eval()
    delta.load_state_dict(qwen3.state_dict(), strict=False)
    qwen3.set_attn_implementation("eager")
    delta.set_attn_implementation("eager")
    ids = token_ids()
    expected = qwen3(ids, output_hidden_states=True, output_attentions=True)
    out = delta(ids, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == len(expected.hidden_states) == SHAPE["num_hidden_layers"] + 1
    assert len(out.attentions) == len(expected.attentions) == SHAPE["num_hidden_layers"]
    for got, want in zip([*out.hidden_states, *out.attentions], [*expected.hidden_states, *expected.attentions]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def sublayer_io(model) -> dict[str, list[torch.Tensor]]:
    """Hooks recording, per layer, its attention's routed input (`input_layernorm`'s input), its attention output
    and weights, and its MLP output."""
    records = {"attn_input": [], "attn_output": [], "attn_weights": [], "mlp_output": []}
    for layer in model.model.layers:
        layer.input_layernorm.register_forward_hook(lambda m, args, out: records["attn_input"].append(args[0]))
        layer.self_attn.register_forward_hook(lambda m, args, out: records["attn_output"].append(out[0]))
        layer.self_attn.register_forward_hook(lambda m, args, out: records["attn_weights"].append(out[1]))
        layer.mlp.register_forward_hook(lambda m, args, out: records["mlp_output"].append(out))
    return records


@pytest.mark.parametrize("mode", MODES)
def test_hidden_states_are_the_layer_boundaries(mode):
    """Delta modes: the residual stream entering each layer, `h_0` plus every earlier sublayer's output. AttnRes
    modes: each layer's routed attention input. Then the final norm's output; attention weights under eager."""
    model = random_model(mode, gated=mode.startswith("delta"))
    model.set_attn_implementation("eager")
    records = sublayer_io(model)
    ids = token_ids()
    out = model.model(ids, output_hidden_states=True, output_attentions=True)
    layers = SHAPE["num_hidden_layers"]
    assert len(out.hidden_states) == layers + 1 and len(out.attentions) == layers
    torch.testing.assert_close(out.hidden_states[0], model.model.embed_tokens(ids), atol=0, rtol=0)
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state, atol=0, rtol=0)
    stream = out.hidden_states[0]
    for i in range(layers):
        expected = stream if mode.startswith("delta") else records["attn_input"][i]
        torch.testing.assert_close(out.hidden_states[i], expected, atol=1e-5, rtol=0)
        stream = stream + records["attn_output"][i] + records["mlp_output"][i]
        assert out.attentions[i].shape == (2, 4, 11, 11)
        torch.testing.assert_close(out.attentions[i], records["attn_weights"][i], atol=0, rtol=0)
        torch.testing.assert_close(out.attentions[i].sum(-1), torch.ones(2, 4, 11))
    assert not mode.startswith("delta") or (out.hidden_states[2] - records["attn_input"][2]).abs().max() > 1e-3
    as_tuple = model(ids, output_hidden_states=True, return_dict=False, use_cache=False)
    assert len(as_tuple[1]) == layers + 1


def test_class_flags_say_what_holds():
    """No pipeline-parallel plan (layers hand on the depth state, not hidden states), and an attention function
    registered with Transformers' `AttentionInterface` is what the layers call."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    assert DeltaQwen3ForCausalLM._pp_plan is None and DeltaQwen3Config.base_model_pp_plan is None
    assert not DeltaQwen3ForCausalLM(delta_config("delta")).supports_pp_plan
    calls = []

    def counting_attention(*args, **kwargs):
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register("counting_sdpa", counting_attention)
    model = random_model("delta_block")
    ids = token_ids()
    model.set_attn_implementation("sdpa")
    expected = model(ids).logits
    model.set_attn_implementation("counting_sdpa")
    torch.testing.assert_close(model(ids).logits, expected, atol=0, rtol=0)
    assert len(calls) == SHAPE["num_hidden_layers"]
