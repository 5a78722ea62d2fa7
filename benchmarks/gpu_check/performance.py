"""The performance section: at the Qwen3-0.6B shape in bfloat16, as ratios to Qwen3 of the same shape in the same
run, the routing implementations buffer and fused side by side: memory and eager training at a short and a long
batch, the routing operation's bytes/s against the memory bandwidth, kernels and GPU-busy time of a training step,
eager decoding, decoding under CUDA graphs and compiled training; each ratio beside its goal (benchmarks/README.md),
reported, not failed on."""

from collections.abc import Callable

import torch

from benchmarks.gpu_check.profiles import Profile
from benchmarks.gpu_check.running import SectionRecord, release_memory, run_parts

# The routing implementations timed in eager mode: the GPU's default, one registered operation per routing point, and
# the buffer that routed by default before it. Under torch.compile `buffer` cannot be traced whole (it routes between
# graphs), so the compiled parts time `fused`.
EAGER_IMPLEMENTATIONS = ("buffer", "fused")
COMPILED_IMPLEMENTATIONS = ("fused",)
# Goals on one H200 as ratios to Qwen3, per variant, and whether a figure meets its goal at least or at most there:
# reported beside the figures, never failed on (benchmarks/README.md says where each comes from).
GOALS = {
    "saved_activations": (False, {"delta_block": 1.05, "delta": 1.15}),
    "saved_activations_long": (False, {"delta_block": 1.05, "delta": 1.15}),
    "training": (True, {"delta_block": 0.93, "delta": 0.85}),
    "training_long": (True, {"delta_block": 0.97, "delta": 0.90}),
    "decoding": (True, {"delta_block": 0.95, "delta": 0.95}),
    "decoding_cuda_graphs": (True, {"delta_block": 0.95, "delta": 0.90}),
    "compiled_training": (True, {"delta_block": 0.97, "delta": 0.90}),
}
NOT_ON_CPU = "not measured on cpu"
PROFILED_STEP = "gpu_check training step"  # torch.profiler's name for the range of the step it measures


def performance_settings(profile: Profile, variants: tuple[str, ...]):
    """benchmarks/routing_overhead.py's settings for this profile and `variants`, in bfloat16 on its device."""
    from benchmarks import routing_overhead

    shape = profile.perf_shape or routing_overhead.QWEN3_06B
    prompt, new_tokens, rounds = profile.decode
    return routing_overhead.Settings(
        device=profile.device, dtype=torch.bfloat16, batch=profile.perf_tokens[0], seq=profile.perf_tokens[1],
        depths=[], train_layers=shape["num_hidden_layers"], training_pairs=profile.training_pairs, decode_shape=shape,
        prompt=prompt, new_tokens=new_tokens, decode_runs=rounds, keep_freed_memory=False,
        variants=[variant for variant in routing_overhead.VARIANTS if variant[0] in ("qwen3", *variants)],
        train_shape=shape, compile_backend=profile.compile_backend,
        routing_implementation="buffer")  # fmt: skip  # fla autotunes per source count: minutes at 28 layers


def record_goal(section: SectionRecord, figure: str, label: str, name: str, value: float) -> None:
    """A measured ratio, checked only for having been measured, and reported beside its goal where it has one."""
    section.check(f"{name}: measured", value, 0.0, at_least=True)
    if figure in GOALS:
        at_least, goals = GOALS[figure]
        goal = goals[label]
        section.data.setdefault("goals", []).append(
            {"name": name, "value": value, "goal": goal, "passes_if": "value >= goal" if at_least else "value <= goal",
             "met": value >= goal if at_least else value <= goal})  # fmt: skip


def figure_data(section: SectionRecord, figure: str) -> dict:
    """The figure's dictionary in the section's data, made on first use, so that each value lands as measured."""
    return section.data.setdefault("figures", {}).setdefault(figure, {})


def peak_training_memory(model, ids: torch.Tensor) -> int:
    """`torch.cuda.max_memory_allocated` over a training step after a first one (which creates AdamW's state)."""
    from benchmarks.routing_overhead import training_step

    step = training_step(model, ids)
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def check_memory(settings, section: SectionRecord, ids: torch.Tensor, figure: str = "memory") -> None:
    """Per variant and implementation, autograd's saved-activation bytes of a training forward and (CUDA) the peak
    memory of a training step on `ids`, as ratios to Qwen3's; one model alive at a time. In the long batch (figure
    "memory_long") the fused implementation reads its sources in groups of points, and keeps each group's partial
    mixtures for the backward pass."""
    from benchmarks.routing_overhead import build, saved_activation_bytes

    def sizes(model) -> dict[str, int]:
        found = {"saved_activations": saved_activation_bytes(model, ids)}
        if settings.device == "cuda":
            found["peak_cuda_memory"] = peak_training_memory(model, ids)
        return found

    qwen3 = sizes(build(settings.train_shape, None, False, settings))
    memory = figure_data(section, figure)
    goal = "saved_activations" + figure.removeprefix("memory")
    for label, mode, gated in settings.variants[1:]:
        model = build(settings.train_shape, mode, gated, settings)
        for implementation in EAGER_IMPLEMENTATIONS:
            model.set_routing_implementation(implementation)
            for kind, size in sizes(model).items():
                memory.setdefault(kind, {}).setdefault(label, {})[implementation] = size / qwen3[kind]
            record_goal(section, goal, label, f"{goal}: {label} {implementation} / qwen3",
                        memory["saved_activations"][label][implementation])
        del model
        release_memory()


def time_against_qwen3(section: SectionRecord, figure: str, settings, shape: dict, prepare: Callable,
                       measure: Callable, implementations: tuple[str, ...], tokens: int,
                       share_weights: bool = False) -> None:
    """Per variant and routing implementation, the run that `prepare(model)` makes, timed against Qwen3's by
    `measure(qwen3_run, run)` (Qwen3's time over the variant's, and Qwen3's seconds per run; the two runs
    interleaved). One Qwen3 serves every variant: built first, then each variant, with only the two alive (their
    common weights shared where `share_weights`: in decoding, where the weights lie moves the speed). Each ratio is
    recorded as soon as measured; so is every run's first call, in seconds (compilation, where anything compiles)."""
    from benchmarks.routing_overhead import _seconds, _share_base_weights, build

    results = figure_data(section, figure)
    first_calls = results.setdefault("first_call_seconds", {})

    def prepared(name: str, model) -> Callable[[], None]:
        run = prepare(model)
        first_calls[name] = round(_seconds(run, settings.device), 2)
        return run

    qwen3 = build(shape, None, False, settings)
    qwen3_run = prepared("qwen3", qwen3)
    for label, mode, gated in settings.variants[1:]:
        model = build(shape, mode, gated, settings)
        if share_weights:
            _share_base_weights(qwen3, model)
        for implementation in implementations:
            model.set_routing_implementation(implementation)
            ratio, qwen3_seconds = measure(qwen3_run, prepared(f"{label} {implementation}", model))
            results.setdefault(label, {})[implementation] = ratio
            results["qwen3_tokens_per_s"] = tokens / qwen3_seconds
            record_goal(section, figure, label, f"{figure}: {label} {implementation} / qwen3", ratio)
        del model
        release_memory()


def paired_runs(repeats: int, warmup: int, device: str) -> Callable:
    """A `measure` for `time_against_qwen3`: routing_overhead's rounds of one run of each, back to back."""
    from benchmarks.routing_overhead import _paired_ratio

    return lambda qwen3_run, run: _paired_ratio({"qwen3": qwen3_run, "variant": run}, repeats, warmup, device)


def paired_decoders(settings) -> Callable:
    """A `measure` for `time_against_qwen3`: routing_overhead's decoding, the two models' forward passes alternating
    one token at a time."""
    from benchmarks.routing_overhead import paired_decoding

    def measure(qwen3_decoder, decoder) -> tuple[float, float]:
        result = paired_decoding({"qwen3": qwen3_decoder, "variant": decoder}, settings.new_tokens,
                                 settings.decode_runs, settings.device)  # fmt: skip
        return result["ratio"], result["qwen3_seconds"]

    return measure


def decoding_under_cuda_graphs(profile: Profile, settings, section: SectionRecord) -> None:
    """`generate` with the static cache, whose decoding steps Transformers compiles on a GPU with the model's
    `generation_config.compile_config`, here `CompileConfig(mode="reduce-overhead", fullgraph=True)`: CUDA graphs
    (the prompt's forward pass stays eager). On the CPU Transformers compiles nothing, so the rehearsal times the
    same calls with the static cache, eagerly, under another figure's name."""
    from transformers import CompileConfig

    prompt_length, new_tokens, rounds = profile.graph_decode
    prompt = torch.randint(3, settings.decode_shape["vocab_size"], (1, prompt_length), device=profile.device)
    cuda = profile.device == "cuda"
    if not cuda:
        section.not_run("decoding_cuda_graphs", f"{NOT_ON_CPU}: CUDA graphs need CUDA; decoding_static_cache_eager "
                                                "times the same generate calls without them")  # fmt: skip

    def prepare(model) -> Callable[[], None]:
        if cuda:
            model.generation_config.compile_config = CompileConfig(mode="reduce-overhead", fullgraph=True)
        return lambda: model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                      eos_token_id=None, cache_implementation="static")  # fmt: skip

    # Two calls after the first before timing: CUDA graphs are recorded on the second and replayed from the third.
    time_against_qwen3(section, "decoding_cuda_graphs" if cuda else "decoding_static_cache_eager", settings,
                       settings.decode_shape, prepare, paired_runs(rounds, 2, profile.device),
                       COMPILED_IMPLEMENTATIONS, new_tokens, share_weights=True)  # fmt: skip


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(tensor.nbytes for tensor in tensors)


def memory_bandwidth() -> float | None:
    """The GPU's nominal memory bandwidth in bytes/s (two transfers per memory clock across its bus), or None where
    PyTorch does not report its memory clock and bus width."""
    properties = torch.cuda.get_device_properties()
    clock_khz, bus_bits = getattr(properties, "memory_clock_rate", None), getattr(properties, "memory_bus_width", None)
    return None if not clock_khz or not bus_bits else 2 * clock_khz * 1000 * bus_bits / 8


def routing_op_bandwidth(profile: Profile, settings, section: SectionRecord) -> None:
    """`torch.ops.delta_qwen3.route` and `route_backward` over the long training batch's tokens, each reading as
    many sources as the deepest routing point of a variant at this depth (Delta Block, 4 blocks: h_0 and three
    finished blocks' changes; Delta AttnRes: h_0 and every sublayer's output but the last), with a residual and no
    gate: the bytes each must move (its inputs read once, its outputs written once) per second, beside a plain copy
    of the sources, and both as fractions of the GPU's nominal memory bandwidth."""
    import modeling_delta_qwen3  # noqa: F401  (registers the operations)
    from benchmarks.routing_overhead import _seconds

    shape, device, calls = settings.train_shape, profile.device, profile.op_calls
    layers, hidden = shape["num_hidden_layers"], shape["hidden_size"]
    counts = {"delta_block": min(4, layers), "delta": 2 * layers}  # routing_overhead.build's blocks: at most 4
    results = figure_data(section, "routing_op_bandwidth")
    nominal = memory_bandwidth() if device == "cuda" else None
    unknown = "PyTorch reports no memory clock or bus width" if device == "cuda" else NOT_ON_CPU
    results["memory_bandwidth_bytes_per_s"] = nominal or unknown

    def rate(call: Callable, moved: int) -> dict:
        call()  # the first call compiles the kernel
        seconds = _seconds(lambda: [call() for _ in range(calls)], device) / calls
        return {"bytes": moved, "seconds": seconds, "bytes_per_s": moved / seconds,
                "of_memory_bandwidth": moved / seconds / nominal if nominal else unknown}  # fmt: skip

    for label in profile.perf_variants:
        count = counts[label]
        sources = torch.randn(count, *profile.long_tokens, hidden, device=device, dtype=torch.bfloat16)
        residual = torch.randn_like(sources[0])
        w = torch.randn(hidden, device=device)  # the compute dtype of a bfloat16 model's routing: float32
        out, weights = torch.ops.delta_qwen3.route(sources, count, None, w, None, residual, 1e-6)
        grad_out = torch.randn_like(out)
        gradients = torch.ops.delta_qwen3.route_backward(grad_out, sources, count, None, w, None, weights, 1e-6)
        copy_target = torch.empty_like(sources)
        results[label] = {
            "sources": count,
            "route": rate(lambda: torch.ops.delta_qwen3.route(sources, count, None, w, None, residual, 1e-6),
                          tensor_bytes(sources, residual, w, out, weights)),
            "route_backward": rate(lambda: torch.ops.delta_qwen3.route_backward(grad_out, sources, count, None, w,
                                                                                None, weights, 1e-6),
                                   tensor_bytes(grad_out, sources, w, weights, *gradients)),
            "copy": rate(lambda: copy_target.copy_(sources), 2 * sources.nbytes),
        }  # fmt: skip
        del sources, residual, out, weights, grad_out, gradients, copy_target
        release_memory()


def gpu_activity(events, window: str) -> dict:
    """From torch.profiler's events (`profile.events()`): the kernels the GPU ran during the CPU range named
    `window`, and the fraction of that range in which the GPU was busy (running kernels, copies or fills: the union
    of their intervals). Annotations the profiler marks on the GPU's timeline are not activities."""
    from torch.autograd import DeviceType

    (span,) = [event.time_range for event in events if event.name == window and event.device_type == DeviceType.CPU]
    activities = [event for event in events
                  if event.device_type == DeviceType.CUDA and not event.is_user_annotation and event.name != window
                  and event.time_range.start < span.end and event.time_range.end > span.start]  # fmt: skip
    busy, covered_to = 0.0, span.start
    for start, end in sorted((event.time_range.start, event.time_range.end) for event in activities):
        if end > covered_to:
            busy += min(end, span.end) - max(start, covered_to)
            covered_to = end
    kernels = sum(not event.name.startswith(("Memcpy", "Memset")) for event in activities)
    return {"kernels": kernels, "gpu_busy": busy / (span.end - span.start)}


def kernels_and_gpu_busy(profile: Profile, settings, section: SectionRecord, ids: torch.Tensor) -> None:
    """Per model and implementation, `torch.profiler` over one eager training step (after two that warm it up):
    the kernels it launches, as a count and as a ratio to Qwen3's, and the fraction of the step the GPU is busy."""
    from benchmarks.routing_overhead import build, training_step

    if profile.device != "cuda":
        section.not_run("kernels", f"{NOT_ON_CPU}: kernels and the GPU's busy time are CUDA's (torch.profiler)")
        return
    results = figure_data(section, "kernels")

    def record(name: str, model) -> None:
        step = training_step(model, ids)
        step()
        step()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profiler:
            with torch.profiler.record_function(PROFILED_STEP):
                step()
                torch.cuda.synchronize()
        results[name] = gpu_activity(profiler.events(), PROFILED_STEP)
        results[name]["kernels_vs_qwen3"] = results[name]["kernels"] / results["qwen3"]["kernels"]

    record("qwen3", build(settings.train_shape, None, False, settings))
    for label, mode, gated in settings.variants[1:]:
        model = build(settings.train_shape, mode, gated, settings)
        for implementation in EAGER_IMPLEMENTATIONS:
            model.set_routing_implementation(implementation)
            record(f"{label} {implementation}", model)
        del model
        release_memory()


def performance_parts(profile: Profile, section: SectionRecord) -> dict[str, Callable[[], None]]:
    """The performance section's parts, cheapest and most wanted first, so that what is measured before the budget
    runs out is what matters most: memory at both batch sizes; eager training at both; the routing operation's
    bandwidth; kernels and GPU-busy time; eager decoding; decoding under CUDA graphs; compiled training, whose
    compilation takes minutes at the 0.6B shape."""
    from benchmarks.routing_overhead import GreedyDecoder, training_step

    settings = performance_settings(profile, profile.perf_variants)
    compiled = performance_settings(profile, profile.compiled_variants)
    shape, device = settings.train_shape, profile.device

    def batch(tokens: tuple[int, int]) -> torch.Tensor:
        return torch.randint(0, shape["vocab_size"], tokens, device=device)

    short, long = batch(profile.perf_tokens), batch(profile.long_tokens)
    prompt = batch((1, settings.prompt))
    section.figure("shape", {"layers": shape["num_hidden_layers"], "hidden": shape["hidden_size"],
                             "dtype": "bfloat16", "training_tokens": list(profile.perf_tokens),
                             "training_long_tokens": list(profile.long_tokens),
                             "decoding": {"prompt": settings.prompt, "new_tokens": settings.new_tokens},
                             "decoding_cuda_graphs": dict(zip(("prompt", "new_tokens"), profile.graph_decode))})

    def compiled_step(model) -> Callable[[], None]:
        return training_step(torch.compile(model, backend=profile.compile_backend, fullgraph=True), short)

    return {
        "memory": lambda: check_memory(settings, section, short),
        "memory_long": lambda: check_memory(settings, section, long, "memory_long"),
        "training": lambda: time_against_qwen3(
            section, "training", settings, shape, lambda model: training_step(model, short),
            paired_runs(profile.training_pairs, 1, device), EAGER_IMPLEMENTATIONS, short.numel()),
        "training_long": lambda: time_against_qwen3(
            section, "training_long", settings, shape, lambda model: training_step(model, long),
            paired_runs(profile.long_training_pairs, 1, device), EAGER_IMPLEMENTATIONS, long.numel()),
        "routing_op_bandwidth": lambda: routing_op_bandwidth(profile, settings, section),
        "kernels": lambda: kernels_and_gpu_busy(profile, settings, section, short),
        "decoding": lambda: time_against_qwen3(
            section, "decoding", settings, shape, lambda model: GreedyDecoder(model, prompt),
            paired_decoders(settings), EAGER_IMPLEMENTATIONS, settings.new_tokens, share_weights=True),
        "decoding_cuda_graphs": lambda: decoding_under_cuda_graphs(profile, settings, section),
        "compiled_training": lambda: time_against_qwen3(
            section, "compiled_training", compiled, shape, compiled_step,
            paired_runs(profile.training_pairs, 1, device), COMPILED_IMPLEMENTATIONS, short.numel()),
    }  # fmt: skip


def check_performance(profile: Profile, section: SectionRecord) -> None:
    """Ratios to Qwen3 of the same shape in the same run, each beside its goal; checked only for having been
    measured (see `run_parts`)."""
    with torch.device(profile.device):  # the models are built on the device, not built on the CPU and moved
        run_parts(section, performance_parts(profile, section))
