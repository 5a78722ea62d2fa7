"""The `"buffer"` routing implementation, the default in eager mode: the sources a
forward pass routes over, and the routing points' mixture of them, at almost no cost in memory or time.

For a routing point `p` with `w = q * g` (query times norm weight) and optional gate `gamma`, over sources
`x_1 .. x_n` (the formulas are in `routing_math.py`):

    alpha_j = softmax_j( q . RMSNorm_g(x_j) ) = softmax_j( r_j * (x_j . w) ),   r_j = 1 / RMS(x_j)
    out     = residual + gamma * sum_j alpha_j x_j          (additive routing; gamma 1 without a gate)
    out     = sum_j alpha_j x_j                             (replacement routing: no residual, no gate)

Each source is copied once into one `[capacity, tokens, D]` buffer together with its `r_j`, so that a routing point
is a few batched matrix products however many sources it reads. A forward pass is in one of three regimes, chosen
once by `buffer_sources`, each its own class:

- `PromptBuffer`: without autograd, several tokens (a prompt, or a decoding step of several sequences).
- `TrainingBuffer`: with autograd; its backward pass is written by hand (below).
- `OneTokenBuffer`: a decoding step of one sequence, in products over `[1, 1, D]`-shaped operands.

The training regime's backward pass:

- A routing point saves a view of the buffer, never a stacked or normalised copy of its sources (plain autograd
  would save one per point: memory quadratic in depth). The sources themselves are not kept anywhere else.
- A source's gradient sums over the points that read it: `sum_p gamma_p alpha_pj G_p + (dL/ds_pj) w_p` plus the
  part through `r_j`, with `G_p` the gradient of point p's output and `s_pj = x_j . w_p`. Accumulating it point by
  point would read and write every source's gradient at every point. Instead each point's backward stores `G_p`
  and its per-token coefficients, and a source's gradient is assembled in one batched product when autograd
  reaches the source: after every point that reads it, because each point takes the latest source's `order`, an empty
  tensor that orders autograd, and each source's `order` is an input of the next source's.
- When every point's `w_p` is known before the forward pass (`routing_points.PointTable` stacks them when the parameters
  are ordinary tensors on one device, not sharded or offloaded), each source's logits `r_j (x_j . w_p)` against
  all later points are one matrix product at the moment it is written, and its part of the points' `dL/dw_p` one
  more when its gradient is assembled: both read the source while it is in cache, instead of once more at every
  point that reads it. Without autograd too: a prompt's forward pass then reads each source once per point
  instead of twice. A decoding step takes each point's logits when it runs (see `_ManyTokenStorage`); it keeps
  nothing for the next step, which depends on its arguments alone (an exported program carries no more).
- With the gates stacked up front too, a point that reads no source of its own leaves its backward pass to its newest
  source (`_deferred_point_backward`): there, the dot products of the sources with the output gradients of every
  point whose newest source it is are one batched product, which reads each source once for all of them rather
  than once per point.
"""

import math

import torch

from .routing_math import (
    add_inverse_rms_gradient,
    as_dtype,
    compute_dtype,
    inverse_rms,
    inverse_rms_gradient,
    logits_against_points,
    mixture_backward,
    one_token_logits,
    padded_norm,
    source_softmax,
    score_gradients,
    weighted_sum,
)
from .routing_math import logits as point_logits
from .routing_modes import DepthData
from .routing_sources import buffer_slots


def buffer_sources(h0: torch.Tensor, plan, table):
    """The buffer's sources for a forward pass from `h0` (see `routing_sources.Sources`), in the regime of that
    pass. Under `torch.compile` they append and route eagerly between the compiled graphs: the training regime's
    autograd functions keep state from call to call, which Dynamo cannot trace."""
    if plan.grad:
        sources = TrainingBuffer(h0, plan, table)
    elif h0.shape[:-1].numel() == 1:
        sources = OneTokenBuffer(h0, plan, table)
    else:
        sources = PromptBuffer(h0, plan, table)
    return _BetweenGraphs(sources) if plan.compiling else sources


class _BetweenGraphs(DepthData):
    """Sources whose appending and routing `torch.compile` leaves out of its graphs."""

    def __init__(self, sources):
        self.sources = sources

    @torch.compiler.disable
    def append(self, x: torch.Tensor) -> None:
        self.sources.append(x)

    @torch.compiler.disable
    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sources.route(point, residual, own_source)

def _slots(buffer: torch.Tensor | None) -> tuple[torch.Tensor, ...] | None:
    """`buffer_slots` of a buffer that may not exist (None)."""
    return None if buffer is None else buffer_slots(buffer)


class _ManyTokenStorage(DepthData):
    """The buffers of a forward pass over several tokens, and a routing point's forward pass over them (`mix`).

    The buffers are written through aliases that autograd does not track (`.data`), which do not count as
    modifying them: routing points save views of the slots written before them, and under autograd a slot is never
    written twice.

    Logits are taken up front when the queries are stacked, except in a decoding step (one position per sequence,
    without autograd): a point's few sources then stay in cache from its own logits to its mixture, whereas logits
    up front read all the queries once more per source, after the layer in between has evicted them. The inverse
    RMS are kept only for a backward pass or for points that compute their own logits."""

    keeps_for_backward = False
    DERIVED = ("_value_slots", "_inv_rms_slots", "_logit_slots", "_queries", "_logits_by_point",
               "_coefficient_buffers")  # fmt: skip

    def __init__(self, h0: torch.Tensor, plan, table):
        self.capacity, self.max_points = plan.capacity, len(plan.points)
        self.queries = table.queries  # [points, D] or None
        self.shape, self.dtype, self.compute = h0.shape, h0.dtype, compute_dtype(h0.dtype)
        self.count = 0  # sources written
        self.points_routed = 0
        keep = self.keeps_for_backward
        tokens, hidden = h0.shape[:-1].numel(), h0.shape[-1]
        decoding = h0.shape[-2] == 1 and not keep
        self.logits_up_front = self.queries is not None and not decoding
        self.values = h0.new_empty(self.capacity, tokens, hidden)  # in the model's dtype
        # [capacity, tokens] in the compute dtype, when kept
        kept = keep or not self.logits_up_front
        self.inv_rms = h0.new_empty(self.capacity, tokens, dtype=self.compute) if kept else None
        # [capacity, points, tokens]: r_j (x_j . w_p), when kept
        self.logits = (
            h0.new_empty(self.capacity, self.max_points, tokens, dtype=self.compute)
            if keep or self.logits_up_front
            else None
        )
        self._eps = h0.new_full((), plan.eps, dtype=self.compute)
        # See `_coefficients`.
        self._coefficient_scratch = h0.new_empty(tokens * (self.capacity + 1), dtype=self.compute)
        self.derive()

    def derive(self) -> None:
        """The views that writing a source and routing a point index: each slot of each buffer, the values' and
        inverse RMS' shaped like the sources, each point's logits."""
        self._value_slots = _slots(self.values.view(self.capacity, *self.shape))
        inv_rms = None if self.inv_rms is None else self.inv_rms.view(self.capacity, *self.shape[:-1])
        self._inv_rms_slots, self._logit_slots = _slots(inv_rms), _slots(self.logits)
        self._queries = None if self.queries is None else self.queries.data
        self._logits_by_point = None if self.logits is None else self.logits.data.unbind(1)
        self._coefficient_buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def write(self, x: torch.Tensor) -> None:
        slot = self.count
        self._value_slots[slot].copy_(x)
        x = as_dtype(x, self.compute)
        r = inverse_rms(x, self._eps, out=None if self._inv_rms_slots is None else self._inv_rms_slots[slot])
        if self.logits_up_front:  # the logits against the points still to run
            later = slice(self.points_routed, self.max_points)
            source = x.reshape(-1, x.shape[-1])
            logits_against_points(self._queries[later], source, r.view(-1), out=self._logit_slots[slot][later])
        self.count += 1

    def mix(self, point, residual, own_source):
        """A routing point's forward pass over every source written so far; returns the routed tensor, the
        routing weights `[sources, tokens]`, and the logits `r_j (x_j . w)` and inverse RMS `r_j` `[sources,
        tokens]` that its backward pass needs."""
        n, p = self.count, point.index
        self.points_routed = p + 1
        values = self.values[:n]
        _, tokens, hidden = values.shape
        compute = self.compute
        x = as_dtype(values, compute)
        inv_rms = None if self.inv_rms is None else self.inv_rms[:n]
        if self.logits_up_front:
            logits = self._logits_by_point[p][:n]
        else:  # into the logits buffer when there is one, for the backward pass
            out = None if self.logits is None else self._logits_by_point[p][:n]
            logits = point_logits(x, point.w, inv_rms, out=out)
        if own_source is not None:
            e = as_dtype(own_source.reshape(tokens, hidden), compute)
            own_inv_rms = inverse_rms(e, self._eps)[None]
            logits = torch.cat([logits, point_logits(e, point.w, own_inv_rms[0])[None]])
            inv_rms = None if inv_rms is None else torch.cat([inv_rms, own_inv_rms])
        # Softmax along the tokens' contiguous axis, many times faster than along a short last axis of sources.
        alpha = source_softmax(logits, sources_dim=0)  # [sources, tokens]
        coefficients, by_token = self._coefficients(alpha.shape[0])
        if point.gate is None:
            coefficients.copy_(alpha)
        else:
            torch.mul(alpha, as_dtype(point.gate, compute), out=coefficients)
        residual = None if residual is None else as_dtype(residual.reshape(tokens, 1, hidden), compute)
        out = weighted_sum(x.transpose(0, 1), by_token[:, :, :n], residual)
        if own_source is not None:
            out.addcmul_(e[:, None], by_token[:, :, n:])
        return as_dtype(out.view(self.shape), self.dtype), alpha, logits, inv_rms

    def _coefficients(self, sources: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A reused buffer for the mixture's coefficients `gamma alpha_j`, as written `[sources, tokens]` and as
        read `[tokens, 1, sources]`: contiguous for the batched product, which takes a much slower path on the CPU
        when its per-token weights are strided."""
        if sources not in self._coefficient_buffers:
            tokens = self.shape[:-1].numel()
            by_token = self._coefficient_scratch[: tokens * sources].view(tokens, 1, sources)
            self._coefficient_buffers[sources] = by_token.view(tokens, sources).T, by_token
        return self._coefficient_buffers[sources]

class PromptBuffer(_ManyTokenStorage):
    """The sources of a forward pass without autograd over several tokens."""

    def append(self, x: torch.Tensor) -> None:
        self.write(x)

    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        """See `routing_sources.Sources.route`."""
        routed, alpha = self.mix(point, residual, own_source)[:2]
        return routed, alpha.T

class _TrainingStorage(_ManyTokenStorage):
    """The buffers of a forward pass that autograd records, shared with the backward passes of its routing points,
    and what those leave for the sources' gradients (`backward_store`). Moved in place: the points' backward
    passes hold it, and read its counts and what later points wrote."""

    keeps_for_backward = True
    IN_PLACE = True

    def __init__(self, h0: torch.Tensor, plan, table):
        super().__init__(h0, plan, table)
        self.gates = table.gates  # [points] or None
        self.deferred: list[bool] = []  # per point, whether its backward pass is left to its newest source
        self.first_reader: list[int] = []  # per source, the first point that reads it; every later point does too
        self.store: _BackwardStore | None = None

    def write(self, x: torch.Tensor) -> None:
        super().write(x)
        self.first_reader.append(self.points_routed)

    def backward_store(self) -> "_BackwardStore":
        if self.store is None:
            _, tokens, hidden = self.values.shape
            self.store = _BackwardStore(
                self.max_points, self.capacity, tokens, hidden, self.values, self.compute, self.queries is not None
            )
        return self.store


class TrainingBuffer(DepthData):
    """The sources of a forward pass that autograd records: appending and routing are autograd functions whose
    backward passes are written by hand (see the module docstring)."""

    def __init__(self, h0: torch.Tensor, plan, table):
        self.storage = _TrainingStorage(h0, plan, table)
        # The latest source's `order` (an empty tensor: see the module docstring). Only this object holds it: the
        # autograd graph it leads to holds the storage, and a reference back from the storage would make a cycle that
        # keeps the whole graph alive.
        self.order: torch.Tensor | None = None

    def append(self, x: torch.Tensor) -> None:
        self.order = _AppendSource.apply(self.storage, x, self.order, self.storage.queries, self.storage.gates)

    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        """See `routing_sources.Sources.route`."""
        return _Route.apply(self.storage, self.order, residual, point.gate, point.w, own_source, point)

class OneTokenBuffer(DepthData):
    """The sources of a decoding step of one sequence, without autograd, routed in products of a single batch over
    `[1, 1, D]`-shaped operands, the sources' shape: the same values in fewer dispatched operations (no reshaping,
    the sources kept in the compute dtype and their transposes made once, the gates as numbers), which at one token
    cost more than the arithmetic.

    The sources are rows of a `[capacity, D + 32]` buffer padded with `sqrt(D eps)` (the padding keeps rows 64-byte
    aligned), whose norms stand in for the inverse RMS (`routing_math.one_token_logits`); the factor `sqrt(D)` is in
    the query rows."""

    DERIVED = ("values", "_value_slots", "_padded_slots", "_norm_slots", "_query_rows", "_prefixes")

    def __init__(self, h0: torch.Tensor, plan, table):
        self.capacity, self.dtype, self.compute = plan.capacity, h0.dtype, compute_dtype(h0.dtype)
        self.shape, hidden = h0.shape, h0.shape[-1]
        self.count = 0  # sources written
        padded = h0.new_zeros(self.capacity, hidden + 32, dtype=self.compute)
        padded[:, hidden] = math.sqrt(hidden * plan.eps)
        self.padded = padded
        self.norms = h0.new_empty(self.capacity, dtype=self.compute)
        self.queries = table.queries
        # The gates as numbers, read once rather than at every point.
        self._gate_values = None if table.gates is None else table.gates.tolist()
        self.derive()

    def derive(self) -> None:
        """The slots of the padded rows and norms; `sqrt(D) w_p` `[1, 1, D]` of each point where the queries are
        stacked; and for each count n of sources, the first n values `[1, n, D]`, transposed, and norms `[1, 1, n]`."""
        hidden = self.shape[-1]
        self.values = self.padded[:, :hidden].view(self.capacity, 1, hidden)
        self._value_slots = _slots(self.values.view(self.capacity, *self.shape))
        self._padded_slots, self._norm_slots = _slots(self.padded), _slots(self.norms)
        scaled = None if self.queries is None else self.queries.data * math.sqrt(hidden)
        self._query_rows = _slots(None if scaled is None else scaled.view(-1, 1, 1, hidden))
        values, norms = self.values.data.view(1, self.capacity, hidden), self.norms.view(1, 1, -1)
        self._prefixes = [
            (values[:, :n], values[:, :n].transpose(1, 2), norms[:, :, :n]) for n in range(self.capacity + 1)
        ]

    def _write(self, slot: int, x: torch.Tensor) -> None:
        self._value_slots[slot].copy_(x)
        padded_norm(self._padded_slots[slot], self.compute, out=self._norm_slots[slot])

    def append(self, x: torch.Tensor) -> None:
        self._write(self.count, x)
        self.count += 1

    def route(self, point, residual=None, own_source=None) -> tuple[torch.Tensor, torch.Tensor]:
        """See `routing_sources.Sources.route`. `own_source` is written into the slot after the sources, which the
        next source takes."""
        n, p = self.count, point.index
        if own_source is not None:
            self._write(n, own_source)
            n += 1
        x, x_transposed, norms = self._prefixes[n]  # [1, n, D], [1, D, n], [1, 1, n]
        if self._query_rows is not None:
            scaled_w = self._query_rows[p]
        else:
            scaled_w = (point.w * math.sqrt(point.w.shape[-1])).view(1, 1, -1)
        alpha = source_softmax(one_token_logits(scaled_w, x_transposed, norms), sources_dim=-1)  # [1, 1, n]
        gate = point.gate if self._gate_values is None else self._gate_values[p]
        if isinstance(gate, torch.Tensor):
            coefficients, scale = alpha * as_dtype(gate, self.compute), 1
        else:
            coefficients, scale = alpha, gate
        if residual is None:
            out = torch.bmm(coefficients, x) if scale is None else torch.bmm(coefficients, x).mul_(scale)
        else:  # the gate, a number, scales the product inside `baddbmm`
            out = torch.baddbmm(as_dtype(residual, self.compute), coefficients, x, alpha=1 if scale is None else scale)
        return as_dtype(out, self.dtype), alpha

class _BackwardStore:
    """What each routing point's backward pass leaves for its sources' gradients: its output gradient `G_p`, per
    source and token its coefficient `gamma_p alpha_pj` and its logit gradient `dL/dl_pj` (indexed `[point, source,
    token]`, so that each point writes one contiguous block), and its `w_p` when the queries were not known up front.
    A point that received no gradient wrote nothing: its rows are zeroed when first read (not at allocation: on CPU,
    zeroing buffers this size costs as much as routing)."""

    def __init__(self, points: int, capacity: int, tokens: int, hidden: int, like: torch.Tensor, compute: torch.dtype,
                 queries_known: bool):
        self.received = [False] * points
        self.grad_out = like.new_empty(points, tokens, hidden)  # G_p, in the model's dtype
        self.coefficients = like.new_empty(points, capacity, tokens, dtype=compute)
        self.logit_grads = like.new_empty(points, capacity, tokens, dtype=compute)
        self.w = None if queries_known else like.new_empty(points, hidden, dtype=compute)
        # Each point's rows, made once: indexing costs a dispatched operation per point.
        self.grad_out_rows, self.coefficient_rows, self.logit_grad_rows = (
            buffer.unbind(0) for buffer in (self.grad_out, self.coefficients, self.logit_grads)
        )

    def zero_missing(self, points: slice) -> None:
        """Zeroes what the points in `points` that received no gradient would have written."""
        for p in range(points.start, points.stop):
            if not self.received[p]:
                for buffer in (self.grad_out, self.coefficients, self.logit_grads, self.w):
                    if buffer is not None:
                        buffer[p].zero_()
                self.received[p] = True


class _AppendSource(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sources: _TrainingStorage, x: torch.Tensor, order: torch.Tensor | None, queries, gates):
        ctx.set_materialize_grads(False)
        sources.write(x)
        ctx.sources, ctx.slot, ctx.shape, ctx.dtype = sources, sources.count - 1, x.shape, x.dtype
        ctx.save_for_backward(sources.values[ctx.slot])
        return x.new_empty(0)

    @staticmethod
    def backward(ctx, _grad_order):
        """Source j's gradient from every point p that read it, in a few products over the points:
        `sum_p gamma_p alpha_pj G_p + r_j (dL/dl_pj) w_p`, plus the part through `r_j`, with `dL/dr_j = sum_p
        (dL/dl_pj) s_pj` for the scores `s_pj = x_j . w_p = l_pj / r_j`; first, the backward passes that the
        points reading j as their newest source left to it."""
        sources, j = ctx.sources, ctx.slot
        readers = slice(sources.first_reader[j], sources.points_routed)
        if sources.store is None or readers.start == readers.stop:
            return None, None, None, None, None
        (x,) = ctx.saved_tensors
        store, device = sources.store, x.device  # the store is on the last point's device
        store.zero_missing(readers)
        grad_gates = _deferred_point_backward(sources, j)
        coefficients = store.coefficients[readers, j].T.contiguous().unsqueeze(1).to(device)  # [tokens, 1, points]
        grad_outs = store.grad_out[readers].transpose(0, 1).to(device, coefficients.dtype)  # [tokens, points, D]
        grad = torch.bmm(coefficients, grad_outs).squeeze(1)
        inv_rms = sources.inv_rms[j].to(device)
        logit_grads = store.logit_grads[readers, j].to(device)  # [points, tokens]
        score_grads = score_gradients(logit_grads, inv_rms)
        w = (sources.queries if store.w is None else store.w)[readers].to(device)
        grad.addmm_(score_grads.T, w)
        inv_rms_grad = inverse_rms_gradient(logit_grads, sources.logits[j, readers].to(device), inv_rms)
        x = x.to(grad.dtype)
        add_inverse_rms_gradient(grad, x, inv_rms, inv_rms_grad)
        grad_queries = None
        if ctx.needs_input_grad[3]:  # this source's part of dL/dw_p, for the points that read it
            grad_queries = sources.queries.new_zeros(sources.queries.shape)
            grad_queries[readers] = score_grads @ x
        grad_gates = grad_gates if ctx.needs_input_grad[4] else None
        return None, grad.view(ctx.shape).to(ctx.dtype), None, grad_queries, grad_gates


def _deferred_point_backward(sources: _TrainingStorage, j: int) -> torch.Tensor | None:
    """What `_Route.backward` left to source j for the points whose newest source it is, with their output
    gradients in the store: their dot products with their sources `0..j` are one batched product, which reads each
    source once for all of them (point by point, each would read every source again). Writes their coefficients and
    logit gradients into the store and returns their gates' gradients `[points]` (zero for other points), or None
    when there are no gates."""
    store, n = sources.store, j + 1
    last = sources.first_reader[j + 1] if j + 1 < sources.count else sources.points_routed
    deferred = [p for p in range(sources.first_reader[j], last) if sources.deferred[p]]
    if not deferred:
        return None
    grad_gates = None if sources.gates is None else sources.gates.new_zeros(sources.gates.shape)
    compute, device = store.coefficients.dtype, store.coefficients.device
    values = as_dtype(sources.values[:n].to(device), compute).permute(1, 2, 0)  # [tokens, D, n]
    # Runs of consecutive points, each a slice of the store: usually all of them, one run.
    for start in (p for p in deferred if p - 1 not in deferred):
        stop = start + 1
        while stop in deferred:
            stop += 1
        points = slice(start, stop)
        grad_outs = as_dtype(store.grad_out[points], compute).transpose(0, 1)  # [tokens, points, D]
        dots = torch.bmm(grad_outs, values).permute(1, 2, 0)  # x_j . G_p: [points, n, tokens]
        logits = sources.logits[:n, points].to(device)
        alpha = source_softmax(logits, sources_dim=0).transpose(0, 1)  # [points, n, tokens]
        gates = None if grad_gates is None else as_dtype(sources.gates[points].to(device), compute).view(-1, 1, 1)
        logit_grads, coefficients, per_token = mixture_backward(alpha, dots, gates, sources_dim=1)
        if grad_gates is not None:
            grad_gates[points] = per_token.sum((1, 2)).to(grad_gates)
        store.coefficients[points, :n] = coefficients
        store.logit_grads[points, :n] = logit_grads
    return grad_gates


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sources: _TrainingStorage, order, residual, gate, w, own_source, point):
        """`point` is the resolved point whose `gate` and `w` are also arguments of their own, for their gradients."""
        ctx.set_materialize_grads(False)
        ctx.sources, ctx.n, ctx.p, ctx.has_residual = sources, sources.count, point.index, residual is not None
        # Left to the newest source when the logits and gates are known there: see `_deferred_point_backward`.
        ctx.deferred = sources.queries is not None and own_source is None and (gate is None) == (sources.gates is None)
        sources.deferred.append(ctx.deferred)
        routed, alpha, logits, inv_rms = sources.mix(point, residual, own_source)
        # Saved whether or not they are read here, so that saved-tensor hooks see every buffer backward reads. The
        # logits through a fresh alias: later points write their own logits into the same buffer. The gate and `w`
        # only where this backward reads them.
        values = sources.values[: ctx.n]
        saved_alpha, saved_gate = (None, None) if ctx.deferred else (alpha, gate)
        saved_w = w if own_source is not None or not sources.logits_up_front else None
        ctx.save_for_backward(values, saved_alpha, saved_gate, own_source, logits.data, inv_rms, saved_w)
        weights = alpha.T
        ctx.mark_non_differentiable(weights)
        return routed, weights

    @staticmethod
    def backward(ctx, grad_out, _grad_weights):
        """Point p's own gradients (its gate, its `w_p` unless known up front, `own_source`, the residual), and what its
        sources' gradients need from it, left in the backward store (see `_AppendSource.backward`); a deferred
        point leaves only its output gradient."""
        if grad_out is None:  # the routed output did not reach the loss
            return (None,) * 7
        sources, n, p = ctx.sources, ctx.n, ctx.p
        store = sources.backward_store()
        store.received[p] = True
        grad_row = store.grad_out_rows[p]
        grad_row.copy_(grad_out.reshape(grad_row.shape))
        grad_residual = grad_out if ctx.has_residual else None
        if ctx.deferred:
            return None, None, grad_residual, None, None, None, None
        values, alpha, gate, own_source, logits, inv_rms, w = ctx.saved_tensors
        _, tokens, hidden = values.shape
        compute = alpha.dtype
        grad_compute = as_dtype(grad_out.reshape(tokens, 1, hidden), compute)
        # x_j . G: [n, tokens]
        dots = torch.bmm(grad_compute, as_dtype(values, compute).permute(1, 2, 0)).view(tokens, n).T
        if own_source is not None:
            e = as_dtype(own_source.reshape(tokens, hidden), compute)
            dots = torch.cat([dots, (e * grad_compute.view(tokens, hidden)).sum(-1)[None]])
        gate_acc = None if gate is None else as_dtype(gate, compute)
        logit_grads, coefficients, per_token = mixture_backward(alpha, dots, gate_acc, sources_dim=0)
        grad_gate = None
        if gate is not None and ctx.needs_input_grad[3]:
            grad_gate = as_dtype(per_token.sum(), gate.dtype).view(gate.shape)
        # Copied, not computed into the store: it is on the last point's device, which may not be this point's.
        # Its rows for this point have room for `own_source`'s, which are never read there.
        store.coefficient_rows[p][: len(alpha)].copy_(coefficients)
        store.logit_grad_rows[p][: len(alpha)].copy_(logit_grads)

        grad_w = None  # dL/dw_p through the scores computed in this point; the rest reaches `queries`
        if store.w is not None or own_source is not None:
            score_grads = score_gradients(logit_grads, inv_rms)
        if store.w is not None:
            store.w[p] = w
            grad_w = values.view(n * tokens, hidden).T.to(compute) @ score_grads[:n].reshape(n * tokens)
        grad_own_source = None
        if own_source is not None:
            grad_w = e.T @ score_grads[n] if grad_w is None else grad_w.addmv_(e.T, score_grads[n])
            grad_own_source = torch.addcmul(
                score_grads[n, :, None] * w, grad_compute.view(tokens, hidden), coefficients[n, :, None]
            )
            own_inv_rms_grad = inverse_rms_gradient(logit_grads[n, None], logits[n, None], inv_rms[n])
            add_inverse_rms_gradient(grad_own_source, e, inv_rms[n], own_inv_rms_grad)
            grad_own_source = grad_own_source.view(own_source.shape).to(own_source.dtype)
        return None, None, grad_residual, grad_gate, grad_w, grad_own_source, None
