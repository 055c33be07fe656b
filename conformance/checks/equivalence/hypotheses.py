"""Named causes of a gradient mismatch, each one a measured hypothesis.

A cause is named only when a measurement in the record supports it:

- a *uniform scale*: every compared gradient is the reference's times one common factor
  (projection residual < 1e-3, factors within 2 % of each other), and that factor is N, 1/N,
  K, 1/K or 1/(N·K) — the fingerprints of a loss rescaled by the world size, a summed loss,
  a loss not divided (or divided twice) by the accumulation steps;
- 0 all-reduces observed, and forwards through the inner module only: DDP was bypassed;
- randomness left in forward after dropout was switched off;
- BatchNorm batches that could not be normalised in the reference's groups;
- a loss that is not a mean over samples: the whole batch's loss is not the mean of its
  microbatches' losses (``loss_split``, measured by the floor's twin: a mean over a count that
  varies per microbatch, e.g. ``ignore_index``) — unless the model's own outputs already
  differ between the whole batch and its microbatches (``mixing``, measured in the same
  forwards): a batch statistic in the model, named as such.

Otherwise the message says that no known cause matched and shows the evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .mixing import first_mixing, row_prints
from .randomness import state_kept
from .records import LossSplit

if TYPE_CHECKING:
    from .tensors import Compared

NEGLIGIBLE = 1e-4  # a reference gradient this small next to the largest one is rounding noise
RESIDUAL = 1e-3  # |g - s·ref| / |g|: how far from "a multiple of the reference" still counts
SPREAD = 0.02  # relative spread of the per-parameter factors that still counts as "one factor"


@dataclass(frozen=True, slots=True)
class Scale:
    """How the compared gradients relate to the reference's, parameter by parameter."""

    parameters: int  # (rank, parameter) pairs with a non-zero reference gradient
    low: float  # smallest per-parameter factor <g, ref> / <ref, ref>
    high: float
    residual: float  # worst |g - factor·ref| / |g|

    @property
    def uniform(self) -> float | None:
        """The common factor when every gradient is the reference's times it, else None."""
        return self.uniform_within(0.0)

    def uniform_within(self, noise: float) -> float | None:
        """``uniform``, with a residual of up to ``noise`` (the configuration's measured bound,
        ``floor``: bf16 autocast leaves ~3e-3 of every gradient as rounding) still counting as
        "a multiple of the reference"."""
        if not self.parameters or self.residual > max(RESIDUAL, noise):
            return None
        mid = (self.low + self.high) / 2
        if mid == 0 or (self.high - self.low) > SPREAD * abs(mid):
            return None
        return mid

    def to_json(self) -> dict[str, Any]:
        return {"pairs": self.parameters, "factor_min": self.low, "factor_max": self.high,
                "worst_residual": self.residual, "uniform_factor": self.uniform}


def scale_of(per_rank: list[dict[str, Any]], ref: dict[str, Any]) -> Scale:
    """``scale_from`` on whole tensors (every rank's gradients against the reference's)."""
    from .tensors import compare_tensor

    norms = [math.sqrt(compare_tensor(n, r, r, grad=True).ref_sq) for n, r in ref.items() if r is not None]
    return scale_from([[compare_tensor(n, got.get(n), r, grad=True) for n, r in ref.items()]
                       for got in per_rank], norms)


def scale_from(per_rank: list[list[Compared]], ref_norms: list[float]) -> Scale:
    """Per-parameter factors of every rank's gradients against the reference's, from the
    projections each rank measured on its device (``tensors.Compared``).

    Parameters whose reference gradient is negligible (a conv bias right before BatchNorm has
    a gradient of exactly 0 in theory, ~1e-9 of rounding in practice) carry no factor and are
    left out: their "factor" is noise. ``ref_norms``: the norm of every reference gradient.
    """
    floor = NEGLIGIBLE * max([n for n in ref_norms if math.isfinite(n)], default=0.0)
    factors, residual = [], 0.0
    for compared in per_rank:
        for c in compared:
            if not (c.got_present and c.ref_present) or math.isinf(c.diff.ratio) and c.diff.note:
                continue  # missing on one side, or shapes differ: no factor
            rr = c.ref_sq
            if rr == 0.0 or not math.isfinite(rr) or math.sqrt(rr) <= floor:
                continue
            factor = c.dot / rr
            norm = math.sqrt(c.got_sq) if c.got_sq >= 0 else c.got_sq
            factors.append(factor)
            if norm > 0:
                residual = max(residual, c.residual / norm)
    if not factors:
        return Scale(0, 0.0, 0.0, 0.0)
    return Scale(len(factors), min(factors), max(factors), residual)


def factors_by_name(per_rank: list[list[Compared]], ref_norms: list[float]) -> dict[str, tuple[float, float]]:
    """Per parameter, its gradient factor against the reference's (lowest and highest over the
    ranks), for the parameters ``scale_from`` reads a factor from: which parameters a cause
    reaches (the towers behind a gathered tensor at 1/N, a temperature at 1)."""
    out: dict[str, tuple[float, float]] = {}
    for compared in per_rank:
        for c in compared:
            one = scale_from([[c]], ref_norms)
            if one.parameters:
                low, high = out.get(c.name, (one.low, one.high))
                out[c.name] = (min(low, one.low), max(high, one.high))
    return out


def scale_causes(factor: float, *, world_size: int, microbatches: int,
                 reference_microbatches: int = 1, wrapper: str = "DDP") -> list[str]:
    """Every known bug whose gradient factor (N-rank / reference) is ``factor`` (``wrapper``:
    what averaged the gradients, ``harness.parallel.wrapper_of``)."""
    return [cause for value, cause, _ in _scale_table(world_size, microbatches, reference_microbatches, wrapper)
            if value != 1 and abs(factor / value - 1) < SPREAD]


def scale_fixes(factor: float, *, world_size: int, microbatches: int,
                reference_microbatches: int = 1, wrapper: str = "DDP") -> list[str]:
    """The one change each of ``scale_causes``'s bugs needs, in the same order: what the
    advice leads with when the factor is the measured cause."""
    return [fix for value, _, fix in _scale_table(world_size, microbatches, reference_microbatches, wrapper)
            if value != 1 and abs(factor / value - 1) < SPREAD]


#: The other fix of a summed loss: a mean divides the gradient by the batch size, so a learning
#: rate tuned for the sum (KellerJordan/cifar10-airbench's reduction="sum" at batch 2000) would
#: need retuning; N ranks' sums averaged by DDP, times N, are the global batch's sum again.
_KEEP_SUM = "To keep the sum (and a learning rate tuned for it), multiply each rank's loss {times}."


def _scale_table(n: int, k: int, reference_microbatches: int, wrapper: str) -> list[tuple[float, str, str]]:
    """(gradient factor, the bug it is the fingerprint of, that bug's fix)."""
    table: list[tuple[float, str, str]] = [
        (n, (f"the loss is multiplied by the world size (factor {n} = N): {wrapper} already averages "
             f"gradients over the {n} ranks, so the loss must stay a per-rank mean"),
         f"Remove the multiplication by the world size from the loss: {wrapper} already averages "
         f"gradients over the ranks, so each rank's loss stays a mean over its own samples."),
        (1 / (n * k) * reference_microbatches,
         f"the loss is a sum over samples (reduction='sum'), not a mean (factor 1/{n * k}: each "
         f"process's gradient grows with its microbatch, 1/{n * k} of the global batch)"
         + (" — or it is divided by the world size" if k == 1 else ""),
         "Make the loss a mean over the samples (reduction='mean'), not a sum"
         + (", and do not divide it by the world size" if k == 1 else "")
         + f": {wrapper} already averages gradients over the ranks. "
         + _KEEP_SUM.format(times=f"by the world size N={n}" if k == 1 else
                            f"by the world size N={n} instead of dividing it by the K={k} steps")),
    ]
    if k > 1:
        table += [
            (k, (f"the loss is not divided by the K={k} accumulation steps (factor {k} = K): the "
                 f"accumulated gradient is the sum over microbatches, not their mean"),
             f"Divide each microbatch's loss by the K={k} accumulation steps before its backward "
             f"(loss / {k}), so the accumulated gradient is their mean, not their sum."),
            (1 / k, (f"the loss is divided by the K={k} accumulation steps once too often "
                     f"(factor 1/{k})"),
             f"Divide the loss by the K={k} accumulation steps once, not twice."),
            # A summed loss accumulated without /K: each rank's gradient is the sum over its whole
            # share of the batch (KellerJordan/cifar10-airbench's reduction="sum" step, accumulated).
            (1 / n * reference_microbatches,
             (f"the loss is a sum over samples (reduction='sum') and is not divided by the K={k} "
              f"accumulation steps (factor 1/{n}: each process's gradient grows with its 1/{n} of the "
              f"global batch) — or it is a mean divided by the world size"),
             f"Make the loss a mean over the samples (reduction='mean') and divide it by the K={k} "
             f"accumulation steps, not by the world size: {wrapper} already averages gradients over the ranks. "
             + _KEEP_SUM.format(times=f"by the world size N={n}")),
        ]
    return table


def unsynchronised_cause(ranks: Sequence[Mapping[str, Any]], *, step: int) -> str | None:
    """Measured: at the compared ``step``, DDP forwards whose backward no all-reduce round
    followed before ``optimizer.step()`` (``harness.observe.Forwards.unsynchronised``).

    DDP reads ``require_backward_grad_sync`` (which ``no_sync()`` clears) in ``forward``: a
    backward synchronises when its forward saw the flag set. Set after the last micro-step's
    forward, or ``no_sync`` around the wrong micro-steps, and the step's last backwards add
    rank-local gradients after its last all-reduce (or the step runs none at all)."""
    for value in ranks:
        late = (value.get("unsynchronised_forwards") or [None] * (step + 1))[step:step + 1]
        if not late or not late[0]:
            continue
        rounds = (value.get("allreduce_rounds") or [None] * (step + 1))[step]
        calls = (value.get("allreduce_calls") or [None] * (step + 1))[step]
        forwards = (value.get("ddp_forwards") or [None] * (step + 1))[step]
        when = ("with no all-reduce in the step at all" if rounds == 0 else
                f"after the step's last all-reduce round ({rounds} round(s))")
        named = ""
        if (value.get("sync_flag_after_forward") or [False] * (step + 1))[step]:
            # Measured both ways round: False when the last forward ran, True when its backward began.
            named = (f"require_backward_grad_sync was set after the forward: the last micro-step's "
                     f"forward of step {step} ran with the flag False and its backward with the flag "
                     f"True, and DDP reads the flag when the forward runs, so the last microbatch's "
                     f"backward did not synchronise: ")
        return (f"{named}the backward of {late[0]} of the {forwards} DDP forwards of step {step} ran {when} "
                f"({calls} bucket all-reduces in the step on rank {value.get('rank')}), so their "
                f"gradients reached optimizer.step() rank-local — DDP decides in forward whether a backward "
                f"synchronises: set require_backward_grad_sync before the last micro-step's forward "
                f"(not after it), and use no_sync() on the first K-1 micro-steps only")
    return None


#: How far the whole batch's loss (and its gradient with respect to the outputs, ``loss_split``)
#: may be from its microbatches' and still count as "a mean over samples", by the precision the
#: forward computed in. In fp32 the two differ by summation order only: measured <= 1.7e-7
#: relative in the values and <= 1.2e-9 in the gradients on every built-in, test and example
#: target (2 and 8 pieces; docs/numerics.md), so 1e-5 leaves a factor of 60. With
#: half-precision activations (autocast in ``forward_loss``) CPU bf16 measured the same ~1e-7,
#: but another device may run a batch of another size through another kernel, which rounds the
#: 8-bit logits otherwise: 1e-3 there. A weighting by a count that varies per microbatch moves
#: the gradient by far more (4.8e-3 on 8 pieces of tests/targets/padded_lm_microbatch_mean.py,
#: 2.1e-2 on pytorch/examples' language_translation), the values less (9.4e-5, 2.7e-4: at
#: initial weights every token's loss is near log(vocabulary)).
SPLIT_GAP = 1e-5
SPLIT_GAP_HALF = 1e-3


#: One factor explains a rank's shards when what is left is under this share of them (a uniform
#: rescale leaves rounding only, ~1e-7 in fp32); factors count as different past this spread.
SHARD_RESIDUAL, SHARD_SPREAD = 1e-3, 1e-3


def shard_cause(ranks: Sequence[Mapping[str, Any]]) -> str | None:
    """Measured (``shards.shard_factor``): every rank's local gradient shards are the
    reference's scaled by one factor of the rank's own, the factors differ between ranks and
    none scales up: each rank rescaled its own shard, as clipping by the local shard's norm does."""
    found = [r.get("shard_factor") for r in ranks]
    if len(found) < 2 or any(f is None or f["residual"] > SHARD_RESIDUAL for f in found):
        return None
    factors = [float(f["factor"]) for f in found if f is not None]
    # Not "below 1": a rank's shard norm is below the global norm, so a local clip clips less
    # than the reference's global one (factors above 1 on every rank, each its own).
    if max(factors) - min(factors) <= SHARD_SPREAD * max(abs(x) for x in factors):
        return None
    each = ", ".join(f"rank {r}: {x:.4g}" for r, x in enumerate(factors))
    return (f"each rank scaled its own gradient shard by a factor of its own ({each}; one factor "
            f"explains each rank's shards): gradients clipped by the rank's local shard norm "
            f"(p.grad.to_local()), not the global norm — clip with "
            f"torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm), which reduces the "
            f"norm over every shard of FSDP2's DTensor gradients")


def loss_split(model: Any, loss: Callable[[Any, Any, Any], Any], whole: tuple[Any, Any],
               parts: list[tuple[Any, Any]], *, device: Any = None) -> LossSplit:
    """Does the target's loss decompose as a mean over samples? ``loss(model, inputs,
    targets)`` on the whole batch and on each of its equal ``parts``, compared two ways:

    - the values: the whole batch's loss against the mean of the parts' losses;
    - the loss's gradient with respect to the model's outputs (a zero added to every floating
      output of ``model``'s forward, differentiated: a backward through the loss alone, never
      the model): Σ|∂L/∂out|² of the whole batch against Σ over the parts of |∂L_i/∂out_i / M|².
      For a per-sample mean both are Σ_s|∂l_s/∂out_s|²/B²; for a mean over a count that varies
      per part, (1/M²)·Σ_i Σ_{t∈i}|∂l_t|²/C_i² ≠ Σ_t|∂l_t|²/C² even when every token's loss is
      alike — the values cannot tell then (at initial weights every token's loss is near
      log(vocabulary)), the weights of the tokens in the gradient can.

    The same forwards fingerprint every module call per sample (``mixing.row_prints``, along the
    one dimension the first input was cut into the parts along: the target's ``batch_dim``); where
    the parts' rows already differ from the whole's (``mixing.first_mixing``) the record says
    where, under ``"mixing"``, and the gap is the model's, not the loss's (``split_weighting``).

    Under ``randomness.state_kept``: the real run's state and generators do not move. Rank side
    (the floor's twin)."""
    import torch

    half: set[str] = set()  # the half-precision dtypes a module's output had (autocast)
    zeros: list[Any] = []  # the zeros added to this call's outputs

    def watch(module: Any, args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.dtype in (torch.float16, torch.bfloat16):
            half.add(str(output.dtype))

    def plus_zero(module: Any, args: Any, output: Any) -> Any:
        # Per-sample outputs only: a scalar (a loss the model computes itself) is the batch's.
        if isinstance(output, torch.Tensor) and output.is_floating_point() and output.dim() > 0:
            zeros.append(torch.zeros_like(output, requires_grad=True))
            return output + zeros[-1]
        if type(output) in (tuple, list):
            return type(output)(plus_zero(module, args, o) for o in output)
        if type(output) is dict:
            return {k: plus_zero(module, args, v) for k, v in output.items()}
        return output

    def measure(inputs: Any, targets: Any, scale: float) -> tuple[float, float | None]:
        zeros.clear()
        value = loss(model, inputs, targets)
        if not (zeros and value.requires_grad):
            return float(value.detach().double()), None
        grads = torch.autograd.grad(value, zeros, allow_unused=True)
        return float(value.detach().double()), sum(float((g.double() * scale).pow(2).sum())
                                                   for g in grads if g is not None)

    hooks = [torch.nn.modules.module.register_module_forward_hook(watch), model.register_forward_hook(plus_zero)]
    cut = _cut(whole, parts)
    try:
        with state_kept(model, device=device):
            # The same forwards fingerprint every module call per sample (``mixing``): no forward
            # of its own, and the model's outputs compared before the loss is blamed.
            with row_prints(model, rows=cut[1], dim=cut[0]) as whole_calls:
                full, full_sq = measure(*whole, 1.0)
            pieces, part_calls = [], []
            for i, p in enumerate(parts):
                with row_prints(model, rows=cut[2], dim=cut[0]) as calls:
                    pieces.append(measure(*p, 1.0 / len(parts)))
                part_calls.append((i * cut[2], calls))
    finally:
        for hook in hooks:
            hook.remove()
    mixed = first_mixing(whole_calls, part_calls) if cut[1] else None
    mean = sum(v for v, _ in pieces) / len(pieces)
    gap = abs(full - mean) / abs(full) if full else abs(mean)
    squares = [q for _, q in pieces]
    grad_gap = None
    if full_sq is not None and None not in squares:
        parts_sq = sum(q for q in squares if q is not None)
        grad_gap = abs(full_sq - parts_sq) / full_sq if full_sq else None
    split = LossSplit(whole=full, parts_mean=mean, parts=len(pieces), rel_gap=gap, grad_gap=grad_gap,
                      half=sorted(half), threshold=SPLIT_GAP_HALF if half else SPLIT_GAP,
                      parts_min=min(v for v, _ in pieces), parts_max=max(v for v, _ in pieces))
    if mixed is not None:
        split["mixing"] = mixed.to_json()
    return split


def _cut(whole: tuple[Any, Any], parts: list[tuple[Any, Any]]) -> tuple[int, int, int]:
    """(batch dimension, the whole batch's samples, a part's): the one dimension along which the
    first batched input tensor was cut into the parts (the target's ``batch_dim``, as ``shard``
    cut it); (0, 0, 0) when it cannot be told (no such tensor, unequal parts): no mixing probe."""
    from ...harness.batches import tensors

    pieces = [tensors(p[0]) for p in parts]
    for i, w in enumerate(tensors(whole[0])):
        got = [p[i] for p in pieces if i < len(p) and p[i].dim() == w.dim()]
        if len(got) != len(parts) or not w.dim():
            return 0, 0, 0
        dims = [d for d in range(w.dim()) if w.shape[d] != got[0].shape[d]]
        if not dims:
            continue  # not batched (passed whole to every part)
        sizes = {int(g.shape[dims[0]]) for g in got}
        if len(dims) == 1 and len(sizes) == 1 and int(w.shape[dims[0]]) == len(parts) * min(sizes):
            return dims[0], int(w.shape[dims[0]]), min(sizes)
        return 0, 0, 0
    return 0, 0, 0


def split_weighting(split: LossSplit | None) -> str | None:
    """Measured: the loss is not a mean over samples (its whole-batch value, or its gradient
    with respect to the outputs, is not its equal microbatches' mean, nor a sum), or None.

    A loss that is a mean over a count that varies per microbatch (tokens not ignored by
    ``ignore_index``, a mask's sum) weighs each microbatch's tokens by 1/(its own count): DDP
    averages the ranks' means, accumulation the microbatches' means, and the tokens of short
    microbatches weigh more than in the large-batch step. A summed loss is not this (its
    whole is the sum of its parts: the uniform factor 1/(N·K) of ``scale_causes``)."""
    if split is None or split.get("mixing"):
        # The model's outputs already differ between the whole batch and its parts (``mixing``):
        # the loss may well be a mean; its whole-vs-parts gap is the model's.
        return None
    whole, mean, m, limit = split["whole"], split["parts_mean"], split["parts"], split["threshold"]
    if mean and abs(whole / (mean * m) - 1) <= limit:
        return None  # a summed loss
    grad_gap = split.get("grad_gap")
    off = [g for g in (split["rel_gap"], grad_gap) if g is not None and math.isfinite(g) and g > limit]
    if not off:
        return None
    if batch_term(split):
        return (f"{measured_split(split)}; the whole batch's loss lies outside its microbatches' "
                f"({split['parts_min']:.4g} to {split['parts_max']:.4g}), where any weighting of per-sample "
                f"terms would keep it: each sample's term depends on the rest of its batch (a contrastive "
                f"loss's in-batch negatives, a statistic of the batch inside the loss), and DDP computes it "
                f"over each rank's share, accumulation over each microbatch: fewer samples than the "
                f"large-batch step")
    return (f"{measured_split(split)}: the loss is not a mean over samples — a mean over a count "
            f"that varies per microbatch (ignore_index, a padding mask's sum) or a batch-level term; "
            f"DDP averages the ranks' means and accumulation the microbatches' means, so the "
            f"samples of microbatches with fewer counted targets weigh more than in the "
            f"large-batch step")


def batch_term(split: LossSplit | None) -> bool:
    """Measured: the whole batch's loss lies outside the range of its microbatches' losses.

    A mean over samples, a sum, and a mean over a count that varies per microbatch all make the
    whole batch's loss a positive weighting of its parts' (the weights: each part's share of the
    counted samples), which lies between the smallest and the largest part's: outside them, no
    weighting of per-sample terms explains it, and a sample's term depends on the others in its
    batch. Seen on HobbitLong/SupContrast's SupConLoss (in-batch negatives): the whole batch
    3.46, its two halves' mean 2.73 (fewer negatives, a lower loss), both halves below it."""
    if split is None or split.get("mixing") or "parts_min" not in split or "parts_max" not in split:
        return False
    whole, lo, hi, limit = split["whole"], split["parts_min"], split["parts_max"], split["threshold"]
    return whole > hi + limit * abs(hi) or whole < lo - limit * abs(lo)


def split_fix(split: LossSplit | None) -> str:
    """What to do about ``split_weighting``: gather the batch for a batch-level term, else
    normalise by the global count."""
    return BATCH_TERM_FIX if batch_term(split) else GLOBAL_COUNT


#: What to do about a batch-level term (``batch_term``).
BATCH_TERM_FIX = ("to compute the loss over the global batch, gather the features from every rank "
                  "before it with torch.distributed.nn.functional.all_gather (it carries the gradient "
                  "back to each rank), with the labels or positives' indices the loss pairs them by, as "
                  "SimCLR and MoCo v3 do (examples/train_contrastive.py); or accept the deviation, which "
                  "production DDP training has too, knowing its size")


def _percent(x: float) -> str:
    return f"{100 * x:.2g} %"


def measured_split(split: LossSplit) -> str:
    """``loss_split``'s figures in words."""
    m, grad_gap = split["parts"], split.get("grad_gap")
    text = (f"the loss of the whole batch is {split['whole']:.4g} but the mean of its {m} "
            f"microbatches' losses is {split['parts_mean']:.4g} ({_percent(split['rel_gap'])} apart)")
    if grad_gap is not None:
        text += (f"; its gradient with respect to the model's outputs weighs the samples otherwise: "
                 f"Σ|∂L/∂out|² of the whole batch differs by {_percent(grad_gap)} from its "
                 f"microbatches' (each loss divided by {m})")
    return text + " (measured at the initial weights, with no backward through the model)"


#: What to do about ``split_weighting``: normalise by the global count.
GLOBAL_COUNT = ("sum the per-token loss and divide by the count of counted targets of the whole "
                "optimizer step, summed over the K microbatches and all-reduced over the ranks "
                "(times the world size, since DDP divides by it): `n = sum((y != PAD).sum() for _, y "
                "in microbatches); dist.all_reduce(n)`, then per microbatch `loss = "
                "F.cross_entropy(logits, y, ignore_index=PAD, reduction='sum') * world_size / n` "
                "(what Hugging Face transformers does since 2024); or accept the deviation, which "
                "production DDP training with per-microbatch means has, knowing its size")
