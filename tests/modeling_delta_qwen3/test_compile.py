"""`torch.compile(fullgraph=True)` (inductor, CPU, float32) compiles the whole model in every mode, through the
`"compiled"` routing implementation that compilation picks by default, and computes what eager mode computes:
logits, generation with the dynamic and the static cache, the training loss and every gradient; and its training
memory stays linear in depth. Compiling takes most of these tests' time: tiny models, one compilation per case."""

import pytest
import torch
from torch._dynamo.utils import counters
from helpers.models import MODES, delta_config, token_ids
from helpers.spec_reference import randomize_routing

from modeling_delta_qwen3 import DeltaQwen3ForCausalLM, routing_fused
from modeling_delta_qwen3.routing_modes import ROUTING_MODES

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fresh_compilation_caches():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tiny_model(mode: str) -> DeltaQwen3ForCausalLM:
    """Two layers, two blocks, routing parameters random: each routing mechanism of the mode is there once."""
    torch.manual_seed(0)
    model = DeltaQwen3ForCausalLM(delta_config(mode, ROUTING_MODES[mode].gateable, num_hidden_layers=2))
    randomize_routing(model)
    return model


# Each mode generates with one cache, each cache in two modes: compiling the decoding steps for both caches in every
# mode doubled these tests' time.
GENERATION_CACHES = {"delta": "static", "delta_block": "dynamic", "attnres_full": "dynamic", "attnres_block": "static"}


@pytest.mark.parametrize(
    "mode,implementation", [*((mode, "fused") for mode in MODES), ("delta", None)], ids=lambda value: str(value)
)
def test_decoding_with_the_static_cache_compiles_once_without_graph_breaks(mode, implementation):
    """`generate` with the static cache under `torch.compile(fullgraph=True)`: one graph for the prompt and one for
    every decoding step after it (what CUDA graphs capture and replay, `CompileConfig(mode="reduce-overhead")`),
    nothing compiled again by a second call, no graph breaks; the tokens are eager mode's. The fused routing
    operation (one registered operation per point) and the default under compilation."""
    model = tiny_model(mode).eval()
    model.set_routing_implementation(implementation)
    ids = token_ids(batch=1, seq=6)
    kwargs = dict(max_new_tokens=5, do_sample=False, pad_token_id=2, eos_token_id=None, cache_implementation="static")
    eager = model.generate(ids, disable_compile=True, **kwargs)
    counters.clear()
    model.forward = torch.compile(model.forward, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, **kwargs), eager)
        assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]
        assert torch.equal(model.generate(ids, **kwargs), eager)
    assert counters["stats"]["unique_graphs"] == 2


@pytest.mark.parametrize("mode", MODES)
def test_compiled_inference_and_generation_equal_eager(mode):
    """With the static cache, `generate` compiles the decoding steps itself (`_can_compile_fullgraph`): the eager
    run is told not to."""
    model = tiny_model(mode).eval()
    ids = token_ids(batch=1, seq=6)
    cache = {"cache_implementation": "static"} if GENERATION_CACHES[mode] == "static" else {}
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=2, eos_token_id=None, output_logits=True,
                  return_dict_in_generate=True, **cache)
    with torch.no_grad():
        logits = model(ids).logits
    eager = model.generate(ids, disable_compile=True, **kwargs)
    model.forward = torch.compile(model.forward, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, logits, atol=1e-5, rtol=0)
    compiled = model.generate(ids, **kwargs)
    assert torch.equal(compiled.sequences, eager.sequences)
    for got, want in zip(compiled.logits, eager.logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_compiled_block_modes_with_blocks_of_several_layers_equal_eager():
    """Blocks of two layers: a block's start and its partial sum are carried across a layer of the graph (vLLM's
    compilation miscomputes this case for delta_block; plain inductor must not)."""
    ids = token_ids(batch=1, seq=6)
    for mode in ("delta_block", "attnres_block"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = DeltaQwen3ForCausalLM(delta_config(mode, ROUTING_MODES[mode].gateable, num_hidden_layers=4)).eval()
        randomize_routing(model)
        assert model.config.layers_per_block == 2
        with torch.no_grad():
            eager = model(ids).logits
            compiled = torch.compile(model, fullgraph=True)(ids).logits
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=0, msg=lambda m, mode=mode: f"{mode}: {m}")


@pytest.mark.newest_end  # the compile tests the newest PyTorch runs: compiling cold is most of their time
@pytest.mark.parametrize("mode", MODES)
def test_compiled_training_equals_eager(mode):
    model = tiny_model(mode).train()
    eager = assert_compiled_training_equals_eager(model)
    assert any(name.endswith("_route.query") for name in eager)


def assert_compiled_training_equals_eager(model: DeltaQwen3ForCausalLM) -> dict[str, torch.Tensor]:
    """The loss and every gradient of a compiled training pass equal eager mode's; returns eager's gradients."""
    ids = token_ids()
    eager_loss = model(ids, labels=ids).loss
    eager_loss.backward()
    eager = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    loss = torch.compile(model, fullgraph=True)(ids, labels=ids).loss
    loss.backward()
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, eager[name], atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    return eager


@pytest.mark.newest_end
def test_compiled_training_through_the_fused_operation_with_grouped_reads_equals_eager(monkeypatch):
    """The fused implementation's operations and autograd functions, points in groups (forced: these batches are
    too short for them) as on a GPU in long batches, traced whole: eager's loss and gradients."""
    monkeypatch.setattr(routing_fused, "GROUP_OPERATIONS_BYTES", -(2**62))
    model = tiny_model("delta").train()
    model.set_routing_implementation("fused")
    assert_compiled_training_equals_eager(model)


LIMITS = {"delta_block": 1.05, "delta": 1.15}


@pytest.mark.parametrize("layers", [4, 8])
def test_compiled_training_memory_stays_linear_in_depth(layers):
    """Autograd's saved bytes under compile, against compiled Qwen3 of the same shape (counted as in
    `test_routing_memory.py`): nothing of a source's size is saved per routing point. What a compiled graph saves for
    backward is decided by AOTAutograd's partitioner on inductor's decompositions, before any code is generated:
    the `aot_eager_decomp_partition` backend runs exactly that and generates no code (at 4 layers it counted the
    bytes inductor's graphs save, to 240 bytes of 24 MB), in a third of inductor's time."""
    from benchmarks.routing_overhead import SMALL, Settings, build, saved_activation_bytes

    settings = Settings("cpu", torch.float32, 2, 128, [layers], layers, 0, SMALL, 0, 0, 0, False)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 128), generator=torch.Generator().manual_seed(0))
    shape = {**SMALL, "num_hidden_layers": layers}
    sizes = {}
    for mode in (None, *LIMITS):
        torch._dynamo.reset()
        model = torch.compile(build(shape, mode, False, settings), backend="aot_eager_decomp_partition", fullgraph=True)
        sizes[mode] = saved_activation_bytes(model, ids)
    for mode, limit in LIMITS.items():
        assert 1.0 <= sizes[mode] / sizes[None] <= limit, (mode, sizes[mode] / sizes[None])
