"""Validation perplexity with strided windows: every token is predicted once, with up to `max_length - stride`
tokens of earlier context carried over from the previous window."""

import torch
import torch.nn.functional as F

from delta_qwen3.texts import token_stream


@torch.no_grad()
def perplexity(model, tokenizer, texts: list[str], max_length: int | None = None, stride: int | None = None) -> float:
    """exp of the token-weighted mean negative log-likelihood of `texts` (joined into one stream).

    Windows of `max_length` tokens (default: the model's context, at most 2048) start every `stride` tokens
    (default: half a window); each window scores only the tokens the previous one did not.
    """
    max_length = max_length or min(model.config.max_position_embeddings, 2048)
    stride = stride or max(max_length // 2, 1)
    if not 1 <= stride <= max_length:
        raise ValueError(f"stride={stride} must be between 1 and max_length={max_length}")
    ids = token_stream(tokenizer, texts)
    if len(ids) < 2:
        raise ValueError("the texts have fewer than two tokens; nothing to predict")
    device = next(model.parameters()).device
    total_nll, total_tokens, scored_until = 0.0, 0, 1  # the first token of the stream is never predicted
    for begin in range(0, len(ids) - 1, stride):
        window = ids[begin : begin + max_length].to(device)
        logits = model(input_ids=window[None], use_cache=False).logits[0, :-1].float()
        nll = F.cross_entropy(logits, window[1:], reduction="none")  # nll[j] predicts token begin + 1 + j
        new = nll[max(scored_until - begin - 1, 0) :]
        total_nll += new.sum().item()
        total_tokens += new.numel()
        scored_until = begin + len(window)
        if scored_until == len(ids):
            break
    return float(torch.exp(torch.tensor(total_nll / total_tokens)))
