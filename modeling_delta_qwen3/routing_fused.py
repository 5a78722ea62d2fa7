"""The `"fused"` routing implementation: each routing point is one `torch.ops.delta_qwen3.route` (`routing_op.py`),
which reads the sources where they lie, in one `[capacity, *tokens, D]` buffer per forward pass.

A source is copied into its slot of the buffer once, when appended. Without autograd a point reads the buffer's
first `count` slots. With autograd, gradients reach the sources through the buffer's prefixes: appending source j
returns the prefix `[:j+1]` (`_AppendSource`), whose gradient splits into source j's and the previous prefix's, and
a point differentiates the prefix it reads. Autograd thus sums each source's gradient over the points that read it,
while the forward pass saves nothing but views of the one buffer.
"""

import copy

import torch

from .routing_op import RouteFunction, route
from .routing_sources import buffer_slots


class _AppendSource(torch.autograd.Function):
    """Writes `x` into slot `slot` of `buffer` and returns the buffer's prefix `[:slot+1]`, through which gradients
    reach `x` and `prefix`, the prefix before it (None for the first source)."""

    @staticmethod
    def forward(ctx, buffer_slots, buffer, slot, x, prefix):
        # The slots are aliases that autograd does not track (`.data`): points save prefixes of the buffer, and
        # writing the slots after them must not count as modifying what they saved.
        ctx.set_materialize_grads(False)
        ctx.slot, ctx.dtype = slot, x.dtype
        buffer_slots[slot].copy_(x)
        return buffer[: slot + 1]

    @staticmethod
    def backward(ctx, grad_prefix):
        if grad_prefix is None:
            return None, None, None, None, None
        grad_x = grad_prefix[ctx.slot].to(ctx.dtype)
        return None, None, None, grad_x, grad_prefix[: ctx.slot] if ctx.slot else None


class FusedSources:
    """The sources of one forward pass in one buffer, and each routing point one registered operation over them
    (see the module docstring)."""

    def __init__(self, h0: torch.Tensor, plan, table):
        self.eps, self.grad = plan.eps, plan.grad
        self.buffer = h0.new_empty(plan.capacity, *h0.shape)
        # Untracked only for autograd: without it, the alias would cost a decoding step one more operation.
        self.slots = buffer_slots(self.buffer, untracked=self.grad)
        self.count = 0
        self.prefix: torch.Tensor | None = None  # with autograd: the sources so far, as `_AppendSource` returned

    def append(self, x: torch.Tensor) -> None:
        if self.grad:
            self.prefix = _AppendSource.apply(self.slots, self.buffer, self.count, x, self.prefix)
        else:
            self.slots[self.count].copy_(x)
        self.count += 1

    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        """See `routing_sources.Sources.route`."""
        if self.grad:
            return RouteFunction.apply(self.prefix, self.count, own_source, point.w, point.gate, residual, self.eps)
        return route(self.buffer, self.count, own_source, point.w, point.gate, residual, self.eps)

    def to(self, *args, **kwargs) -> "FusedSources":
        """A copy on another device, the buffer copied with what it holds (accelerate's device hooks move the depth
        state between layers); the sources themselves where nothing moves."""
        buffer = self.buffer.to(*args, **kwargs)
        if buffer is self.buffer:
            return self
        moved = copy.copy(self)
        moved.buffer, moved.slots = buffer, buffer_slots(buffer, untracked=self.grad)
        moved.prefix = None if self.prefix is None else self.prefix.to(*args, **kwargs)
        return moved
