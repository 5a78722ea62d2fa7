"""SPEC section 2 written out loop by loop, in float64, for the tests to check the model against.

Deliberately naive: every routing point re-normalises every source, nothing is shared with the model's routing
code, and each mode follows the spec's own words. Only the Qwen3 sublayers `f_s` are taken from the model.
"""

import copy

import torch

from delta_qwen3.routing_parameters import randomize_routing  # noqa: F401  (the tests' helpers import it from here)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def mix(point, sources: list[torch.Tensor], eps: float, weights_log: list) -> torch.Tensor:
    """mix_p = sum_j alpha_j x_j,  alpha_j = softmax_j(q_p . RMSNorm_p(x_j))."""
    logits = torch.stack([(rms_norm(x, point.norm.weight, eps) * point.query).sum(-1) for x in sources], -1)
    alpha = torch.softmax(logits, dim=-1)
    weights_log.append(alpha)
    return sum(alpha[..., j : j + 1] * x for j, x in enumerate(sources))


def gate(point) -> torch.Tensor | float:
    return point.gate if point.gate is not None else 1.0


def reference_forward(model, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and routing weights of `model` (a DeltaQwen3ForCausalLM) computed from the spec, in float64."""
    model = copy.deepcopy(model).double().eval()
    model.config._attn_implementation = "eager"
    inner, config = model.model, model.config
    eps, num_layers, lpb = config.rms_norm_eps, config.num_hidden_layers, config.layers_per_block
    seq = input_ids.shape[1]
    positions = torch.arange(seq).unsqueeze(0)
    mask = torch.full((seq, seq), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        h0 = inner.embed_tokens(input_ids)
        rope = inner.rotary_emb(h0, positions)

        def f(s: int, u: torch.Tensor) -> torch.Tensor:
            layer = inner.layers[s // 2]
            if s % 2 == 0:
                return layer.self_attn(layer.input_layernorm(u), rope, mask)[0]
            return layer.mlp(layer.post_attention_layernorm(u))

        def point(s: int):
            layer = inner.layers[s // 2]
            return layer.attn_route if s % 2 == 0 else layer.mlp_route

        def starts_block(s: int) -> bool:
            return s % 2 == 0 and s // 2 > 0 and (s // 2) % lpb == 0

        log: list[torch.Tensor] = []
        mode = config.routing_mode
        if mode == "delta":  # 2.1
            h, outputs = h0, []
            for s in range(2 * num_layers):
                h_hat = h0 if s == 0 else h + gate(point(s)) * mix(point(s), [h0, *outputs], eps, log)
                v = f(s, h_hat)
                h = h + v
                outputs.append(v)
            final = h
        elif mode == "delta_block":  # 2.2
            h, block_entry, sources = h0, h0, [h0]
            for s in range(2 * num_layers):
                if starts_block(s):
                    sources.append(h - block_entry)
                    block_entry = h
                h_hat = h0 if s == 0 else h + gate(point(s)) * mix(point(s), sources, eps, log)
                h = h + f(s, h_hat)
            final = h
        elif mode == "attnres_full":  # 2.3
            outputs = []
            for s in range(2 * num_layers):
                h_hat = h0 if s == 0 else mix(point(s), [h0, *outputs], eps, log)
                outputs.append(f(s, h_hat))
            final = mix(inner.final_route, [h0, *outputs], eps, log)
        elif mode == "attnres_block":  # 2.4
            blocks, partial = [h0], None
            for s in range(2 * num_layers):
                if starts_block(s):
                    blocks.append(partial)
                    partial = None
                current = blocks if partial is None else [*blocks, partial]
                h_hat = h0 if s == 0 else mix(point(s), current, eps, log)
                v = f(s, h_hat)
                partial = v if partial is None else partial + v
            blocks.append(partial)
            final = mix(inner.final_route, blocks, eps, log)
        else:
            raise ValueError(mode)
        logits = model.lm_head(inner.norm(final))
    return logits, log
