"""The `"fused"` routing implementation: each routing point is one `torch.ops.delta_qwen3.route` (`routing_op.py`),
which reads the sources where they lie, in one `[capacity, *tokens, D]` buffer per forward pass.

A source is copied into its slot of the buffer once, when appended. Without autograd (inference, decoding) each
point reads the buffer's first `count` slots.

With autograd (training), where there are enough tokens and sources (`_worth_grouping`), the points are taken in
groups of `group_size` in the order they run, and the sources that exist when a group's first point runs are read
once for the whole group (`route_partial`): each of its points then merges that partial mixture with the sources
added since (`route` from `start`), so a pass reads each source about `1 / group_size` as often, and its backward
pass writes each source's gradient as rarely. Gradients reach the sources that a group or an ungrouped point reads
at once through the buffer's prefixes: appending source j returns the prefix `[:j+1]` (`_AppendSource`), whose
gradient splits into source j's and the previous prefix's; the sources a group's point reads after `start` get
theirs directly. The forward pass saves nothing of the sources but views of the one buffer.
"""

import torch

from .routing_modes import DepthData
from .routing_op import PartialFunction, RouteFunction, has_kernels, route
from .routing_sources import buffer_slots


# A dozen operations at a few microseconds each, on a GPU that moves several terabytes per second.
GROUP_OPERATIONS_BYTES = 2**29


def routes_with_kernels(like: torch.Tensor) -> bool:
    """Whether the operation runs Triton kernels on hidden states like `like`: on an NVIDIA GPU with Triton
    installed (they are compiled and checked for the GPUs from the T4 to Blackwell's:
    `tests/modeling_delta_qwen3/routing/kernels_for_gpu.py`; on a GPU where they fail, the operation falls back to its
    PyTorch code: `routing_op.py`)."""
    return like.is_cuda and torch.version.hip is None and has_kernels()


def group_size(hidden_size: int) -> int:
    """How many points read the sources together: the backward kernel of `route_partial` holds three rows of the
    group per point in registers (`routing_triton.py`), which past 2048 columns leaves room for two and past 4096 for
    none (1: no grouped reads; `tests/modeling_delta_qwen3/routing/kernels_for_gpu.py` counts the registers)."""
    return 4 if hidden_size <= 2048 else 2 if hidden_size <= 4096 else 1


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


class _Group(DepthData):
    """The points of one group: the index of its first, the count of sources read together, and each point's
    partial mixture and logits over them."""

    def __init__(self, first: int, start: int, outputs: tuple[torch.Tensor, ...]):
        self.first, self.start = first, start
        size = len(outputs) // 2
        self.mixes, self.logits = outputs[:size], outputs[size:]

    def __contains__(self, index: int) -> bool:
        return self.first <= index < self.first + len(self.mixes)



class FusedSources(DepthData):
    """The sources of one forward pass in one buffer, and each routing point one registered operation over them
    (see the module docstring)."""

    DERIVED = ("slots",)

    def __init__(self, h0: torch.Tensor, plan, table):
        self.eps, self.grad, self.table = plan.eps, plan.grad, table
        self.point_count, self.group_size = len(plan.points), group_size(h0.shape[-1])
        self.buffer = h0.new_empty(plan.capacity, *h0.shape)
        self.derive()
        self.count = 0
        # With autograd: the sources so far as `_AppendSource` returned them; the current group, and the sources
        # appended since it started, one by one (what its points read after `start`).
        self.prefix: torch.Tensor | None = None
        self.group: _Group | None = None
        self.since_group: list[torch.Tensor] = []

    def derive(self) -> None:
        # Untracked only for autograd: without it, the alias would cost a decoding step one more operation.
        self.slots = buffer_slots(self.buffer, untracked=self.grad)

    def append(self, x: torch.Tensor) -> None:
        if self.grad:
            self.prefix = _AppendSource.apply(self.slots, self.buffer, self.count, x, self.prefix)
            self.since_group.append(x)
        else:
            self.slots[self.count].copy_(x)
        self.count += 1

    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        """See `routing_sources.Sources.route`."""
        if not self.grad:
            return route(self.buffer, self.count, own_source, point.w, point.gate, residual, self.eps)
        if self.group is None or point.index not in self.group:
            self.group = self._start_group(point.index) if self._worth_grouping() else None
            self.since_group = []
        if self.group is None:
            return RouteFunction.apply(self.prefix, self.count, own_source, point.w, point.gate, residual, self.eps,
                                       0, None, None)  # fmt: skip
        group, member = self.group, point.index - self.group.first
        return RouteFunction.apply(
            self.buffer, self.count, own_source, point.w, point.gate, residual, self.eps, group.start,
            group.mixes[member], group.logits[member], *self.since_group,
        )  # fmt: skip

    def _worth_grouping(self) -> bool:
        """Whether the sources so far are worth reading once for a group of points rather than once per point: the
        reads saved must exceed what the group adds, a partial mixture in the compute dtype written and read per
        point, and the dozen operations more that it dispatches, which cost a GPU about the time it takes to move
        `GROUP_OPERATIONS_BYTES`. Long batches (many tokens) with many sources get there; a decoding step, short
        batches and the block modes' few sources do not. Never where the points' queries are known only as each
        point runs (sharded by FSDP, offloaded): a group needs its later points' queries when its first runs."""
        if self.table.queries is None:
            return False
        slot_numel = self.slots[0].numel()
        saved = (self.group_size - 1) * self.count * slot_numel * self.buffer.element_size()
        added = 2 * self.group_size * slot_numel * self.table.dtype.itemsize + GROUP_OPERATIONS_BYTES
        return saved > added

    def _start_group(self, first: int) -> _Group:
        """The group whose first point is `first`: the sources so far, read for all its points at once."""
        last = min(first + self.group_size, self.point_count)
        w_group = self.table.queries[first:last]
        return _Group(first, self.count, PartialFunction.apply(self.prefix, self.count, w_group, self.eps))
