"""How sharply a DeltaQwen3 model routes over depth, read from the model's own `output_routing_weights`.

Per routing point, over all tokens: the mean of the largest routing weight (1 = every token reads one source,
1/n = uniform over n sources), the mean entropy of the weights (nats), and the mean weight of each source. The
model's figure is the mean over its routing points (the paper: about 0.62 for Delta Block, 0.35 for AttnRes).
Points with a single source (the first block of a block mode) always have weight 1; they are included in
`mean_max_weight` and left out of `multi_source`.
"""

import torch

from delta_qwen3.errors import CommandError

from .texts import token_stream


def _point_names(num_layers: int, num_points: int) -> list[tuple[int, str]]:
    """(sublayer index, name) of each routing point in the order they run: sublayers 1 ... 2L-1, then the final
    point of the AttnRes modes (sublayer index 2L)."""
    names = []
    for sublayer in range(1, num_points + 1):
        layer, part = divmod(sublayer, 2)
        names.append((sublayer, "final" if sublayer == 2 * num_layers else f"{layer}.{('attn', 'mlp')[part]}"))
    return names


def _summary(points: list[dict]) -> dict:
    return {
        "mean_max_weight": sum(point["mean_max_weight"] for point in points) / len(points),
        "mean_entropy": sum(point["mean_entropy"] for point in points) / len(points),
        "num_points": len(points),
    }


@torch.no_grad()
def routing_statistics(model, tokenizer, texts: list[str], max_length: int = 1024) -> dict:
    """Routing sharpness of `model` over `texts`, read in consecutive windows of `max_length` tokens.

    Returns `{"routing_mode", "num_layers", "num_tokens", "points": [{"sublayer", "name", "num_sources",
    "mean_max_weight", "mean_entropy", "mean_weights"}], "mean_max_weight", "mean_entropy", "multi_source":
    {"mean_max_weight", "mean_entropy", "num_points"}}`.
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
            "mean_weights": (weight_sums[point] / num_tokens).tolist(),
        }
        for point, (sublayer, name) in enumerate(names)
    ]
    overall = _summary(points)
    multi_source = [point for point in points if point["num_sources"] > 1]
    return {
        "routing_mode": routing_mode,
        "num_layers": model.config.num_hidden_layers,
        "num_tokens": num_tokens,
        "points": points,
        "mean_max_weight": overall["mean_max_weight"],
        "mean_entropy": overall["mean_entropy"],
        "multi_source": _summary(multi_source) if multi_source else None,
    }
