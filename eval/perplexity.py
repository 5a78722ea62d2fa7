"""Validation perplexity with strided windows: every token is predicted once, with up to `max_length - stride`
tokens of earlier context carried over from the previous window.

The windows run several at a time: a window alone rarely fills an accelerator, and on a CPU shared with other
processes, fewer and larger operations wait less on each other's threads (benchmarks/README.md). A batch holds
windows of one length that score the same number of tokens (all but the first and the last window), so nothing is
padded, and the model computes logits only for the positions scored.
"""

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from delta_qwen3.texts import chunks, token_stream

# Windows per forward pass by default. On a CPU a few windows a pass cost nothing on an otherwise idle machine and,
# on a loaded one, spare the threads much waiting for each other; on an accelerator one window rarely fills the
# device, which is assumed, not measured. The figures: benchmarks/README.md, "Perplexity batching".
DEFAULT_BATCH = {"cpu": 4, "accelerator": 16}
LOGITS_BUDGET = 2**28  # logit values per forward pass that the default batch stays within (1 GiB in float32)


@dataclass(frozen=True)
class Window:
    begin: int  # the window's first token in the stream
    end: int  # one past its last token
    first_scored: int  # the first token it scores; those before it are context, scored by an earlier window

    @property
    def length(self) -> int:
        return self.end - self.begin

    @property
    def scored(self) -> int:
        return self.end - self.first_scored


def windows(length: int, max_length: int, stride: int) -> list[Window]:
    """The windows over a stream of `length` tokens: one starts every `stride` tokens until one reaches the end,
    and each scores the tokens no earlier window did (the stream's first token is never predicted)."""
    result, scored_until = [], 1
    for begin in range(0, length - 1, stride):
        end = min(begin + max_length, length)
        result.append(Window(begin, end, max(scored_until, begin + 1)))
        scored_until = end
        if end == length:
            break
    return result


def window_batches(all_windows: list[Window], batch_size: int) -> Iterator[list[Window]]:
    """Consecutive windows that share their length and scored count, at most `batch_size` at a time."""
    for _, group in itertools.groupby(all_windows, key=lambda window: (window.length, window.scored)):
        yield from chunks(group, batch_size)


def default_batch_size(stride: int, vocab_size: int, device: torch.device) -> int:
    """`DEFAULT_BATCH` windows for the device, fewer where their logits (`stride + 1` positions a window, once past
    the first) would pass `LOGITS_BUDGET`: a large vocabulary in long windows runs one at a time, as before."""
    most = DEFAULT_BATCH["cpu" if device.type == "cpu" else "accelerator"]
    return max(1, min(most, LOGITS_BUDGET // ((stride + 1) * vocab_size)))


def _batch_nll(model, ids: torch.Tensor, batch: list[Window], device) -> float:
    """The summed negative log-likelihood of the tokens that the windows of `batch` score, in one forward pass."""
    scored = batch[0].scored  # the same for every window of the batch: its last `scored` tokens
    input_ids = torch.stack([ids[window.begin : window.end] for window in batch]).to(device)
    # Logits of the last `scored + 1` positions; the very last predicts past the window.
    logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=scored + 1).logits[:, :-1]
    nll = F.cross_entropy(logits.flatten(0, 1).float(), input_ids[:, -scored:].flatten(), reduction="none")
    return nll.double().sum().item()


@torch.no_grad()
def negative_log_likelihood(model, ids: torch.Tensor, max_length: int, stride: int, batch_size: int
                            ) -> tuple[float, int]:  # fmt: skip
    """The summed negative log-likelihood of the stream `ids` over strided windows, and the number of tokens
    scored."""
    device = next(model.parameters()).device
    all_windows = windows(len(ids), max_length, stride)
    total = sum(_batch_nll(model, ids, batch, device) for batch in window_batches(all_windows, batch_size))
    return total, sum(window.scored for window in all_windows)


def perplexity(model, tokenizer, texts: list[str], max_length: int | None = None, stride: int | None = None,
               batch_size: int | None = None) -> float:  # fmt: skip
    """exp of the token-weighted mean negative log-likelihood of `texts` (joined into one stream).

    Windows of `max_length` tokens (default: the model's context, at most 2048) start every `stride` tokens
    (default: half a window); each window scores only the tokens the previous one did not. `batch_size` windows
    run at a time (default: `default_batch_size`).
    """
    max_length = max_length or min(model.config.max_position_embeddings, 2048)
    stride = stride or max(max_length // 2, 1)
    if not 1 <= stride <= max_length:
        raise ValueError(f"stride={stride} must be between 1 and max_length={max_length}")
    ids = token_stream(tokenizer, texts)
    if len(ids) < 2:
        raise ValueError("the texts have fewer than two tokens; nothing to predict")
    device = next(model.parameters()).device
    batch_size = batch_size or default_batch_size(stride, model.config.vocab_size, device)
    total, count = negative_log_likelihood(model, ids, max_length, stride, batch_size)
    return float(torch.exp(torch.tensor(total / count)))
