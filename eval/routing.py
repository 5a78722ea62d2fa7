"""How sharply a DeltaQwen3 model routes over depth, read from the model's own `output_routing_weights`.

Per routing point, over all tokens: the mean of the largest routing weight (1 = every token reads one source,
1/n = uniform over n sources), the mean entropy of the weights (nats), and the mean weight of each source. The
model's figures are the means over its routing points, in the two variants of `delta_qwen3.sharpness` (all points,
and only those with more than one source; the paper: about 0.62 for Delta Block, 0.35 for AttnRes).
"""

import torch

from delta_qwen3.errors import CommandError
from delta_qwen3.sharpness import depth_bands, mean_max_weights, normalised_sharpness
from delta_qwen3.texts import token_stream


def _point_names(num_layers: int, num_points: int) -> list[tuple[int, str]]:
    """(sublayer index, name) of each routing point in the order they run: sublayers 1 ... 2L-1, then the final
    point of the AttnRes modes (sublayer index 2L)."""
    names = []
    for sublayer in range(1, num_points + 1):
        layer, part = divmod(sublayer, 2)
        names.append((sublayer, "final" if sublayer == 2 * num_layers else f"{layer}.{('attn', 'mlp')[part]}"))
    return names


def _summary(points: list[dict]) -> dict:
    """The model's figures: both mean-max-weight variants, the mean entropy over all points, and the sharpness of
    the early, middle and late multi-source points (`delta_qwen3.sharpness.depth_bands`)."""
    sharpness = mean_max_weights(
        torch.tensor([point["mean_max_weight"] for point in points], dtype=torch.float64),
        [point["num_sources"] for point in points],
    )
    return {
        **{name: None if value is None else value.item() for name, value in sharpness.items()},
        "mean_entropy": sum(point["mean_entropy"] for point in points) / len(points),
        "bands": depth_bands(points),
    }


@torch.no_grad()
def routing_statistics(model, tokenizer, texts: list[str], max_length: int = 1024) -> dict:
    """Routing sharpness of `model` over `texts`, read in consecutive windows of `max_length` tokens.

    Returns `{"routing_mode", "num_layers", "num_tokens", "points": [{"sublayer", "name", "num_sources",
    "mean_max_weight", "mean_entropy", "max_above_uniform", "entropy_sharpness", "mean_weights"}],
    "mean_max_weight", "mean_max_weight_multi_source", "mean_entropy", "bands"}`.
    """
    routing_mode = getattr(model.config, "routing_mode", None)
    if routing_mode is None:
        raise CommandError(
            f"the model is a {model.config.model_type!r} model, not DeltaQwen3: it has no routing weights"
        )
    max_length = min(max_length, model.config.max_position_embeddings)
    ids = token_stream(tokenizer, texts)
    device = next(model.parameters()).device
    max_sums, entropy_sums, weight_sums = None, None, None
    for begin in range(0, len(ids), max_length):
        window = ids[begin : begin + max_length].to(device)
        weights = model(input_ids=window[None], use_cache=False, output_routing_weights=True).routing_weights
        weights = [w[0].double() for w in weights]  # [seq, n_sources] each; float64 sums stay exact over tokens
        if max_sums is None:
            max_sums = [0.0] * len(weights)
            entropy_sums = [0.0] * len(weights)
            weight_sums = [torch.zeros(w.shape[-1], dtype=torch.float64, device=device) for w in weights]
        for point, w in enumerate(weights):
            max_sums[point] += w.max(dim=-1).values.sum().item()
            entropy_sums[point] += torch.special.entr(w).sum().item()
            weight_sums[point] += w.sum(dim=0)
    num_tokens = len(ids)
    names = _point_names(model.config.num_hidden_layers, len(max_sums))
    points = [
        {
            "sublayer": sublayer,
            "name": name,
            "num_sources": len(weight_sums[point]),
            "mean_max_weight": max_sums[point] / num_tokens,
            "mean_entropy": entropy_sums[point] / num_tokens,
            **normalised_sharpness(
                max_sums[point] / num_tokens, entropy_sums[point] / num_tokens, len(weight_sums[point])
            ),
            "mean_weights": (weight_sums[point] / num_tokens).tolist(),
        }
        for point, (sublayer, name) in enumerate(names)
    ]
    return {
        "routing_mode": routing_mode,
        "num_layers": model.config.num_hidden_layers,
        "num_tokens": num_tokens,
        "points": points,
        **_summary(points),
    }
