"""What can be wrong with a target's ``batch_dim`` declaration, and with a batch against it.

``batch_dim`` says on which dimension each tensor of ``make_batch``'s ``(inputs, targets)``
holds the batch (``harness.batches``: an int for every tensor, or a structure mirroring the
return, None for a tensor passed whole). Both functions return what is wrong in words, or
None; ``targets`` turns the words into a TargetError with the target's name and the README
citation. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

from .batches import DimsMismatch, part_dims, walk

PARTS = ("inputs", "targets")
_EXAMPLE = "e.g. batch_dim = 1 for time-major (T, B, ...) tensors, or ((1, 1), 1) for ((tokens, hidden), targets)"


def declaration_error(dims: Any) -> str | None:
    """What is wrong with a declared ``batch_dim`` itself (before any batch is drawn), or None."""
    if dims is None:
        return None
    bad = _bad_leaf(dims)
    if bad is not None:
        held = "" if bad is dims else f" holds {bad!r}, which"
        return (f"batch_dim = {dims!r}{held} is not an int, None, or a tuple/list/dict "
                f"of them; declare one int for every tensor, or the structure of make_batch's "
                f"(inputs, targets) with an int or None per tensor ({_EXAMPLE})")
    if isinstance(dims, dict) or (isinstance(dims, (tuple, list)) and len(dims) != 2):
        return (f"batch_dim = {dims!r} does not have the shape of make_batch's return, a pair "
                f"(inputs, targets); declare one int for every tensor or a pair ({_EXAMPLE})")
    return None


def _bad_leaf(dims: Any) -> Any:
    if isinstance(dims, bool):
        return dims
    if dims is None or isinstance(dims, int):
        return None
    if isinstance(dims, (tuple, list, dict)):
        items = dims.values() if isinstance(dims, dict) else dims
        for item in items:
            bad = _bad_leaf(item)
            if bad is not None:
                return bad
        return None
    return dims


def batch_error(batch: tuple[Any, Any], dims: Any, batch_size: int) -> str | None:
    """What is wrong with ``make_batch(generator, batch_size)``'s ``batch`` under the declared
    ``dims`` (a declaration that does not mirror it, a dimension out of range or of another
    size than ``batch_size``, no batched tensor at all), or None."""
    batched = 0
    for index, part in enumerate(PARTS):
        try:
            leaves = walk(batch[index], part_dims(dims, index), part)
        except DimsMismatch as exc:
            return (f"returned what batch_dim = {dims!r} does not match: {exc}; give "
                    f"batch_dim the structure of (inputs, targets), or one int for every tensor")
        for path, tensor, dim in leaves:
            if dim is None:
                continue
            batched += 1
            wrong = _dim_error(path, tuple(tensor.shape), dim, batch_size, declared=dims is not None)
            if wrong is not None:
                return wrong
    if not batched:
        return (f"returned no tensor that batch_dim = {dims!r} declares batched (it says None "
                f"everywhere); declare the dimension that holds the batch ({_EXAMPLE})")
    return None


def _dim_error(path: str, shape: tuple[int, ...], dim: int, batch_size: int, *, declared: bool) -> str | None:
    holds = [d for d, size in enumerate(shape) if size == batch_size]
    hint = f" (its dim {holds[0]} has size {batch_size}: declare batch_dim = {holds[0]} if that is the batch)" \
        if holds else _flat_hint(shape, batch_size)
    if not declared:
        if shape and shape[0] == batch_size:
            return None
        # The undeclared contract's own words (tests hold them); the measured hint only when a
        # dimension of the batch's size exists (a time-major tensor), never a guess.
        hint = (f"; its dim {holds[0]} has size {batch_size}: if the batch is on dim {holds[0]} "
                f"(time-major), declare batch_dim = {holds[0]}") if holds else _flat_hint(shape, batch_size)
        return (f"returned {path.split('[')[0]} with a tensor of shape {shape}; dim 0 of every tensor "
                f"must be the batch size {batch_size}{hint}")
    if not -len(shape) <= dim < len(shape):
        return (f"returned {path} of shape {shape}, but batch_dim declares dim {dim} for it, which "
                f"it does not have{hint}; declare a dimension it has, or None to pass it whole")
    if shape[dim] != batch_size:
        return (f"returned {path} of shape {shape}, but batch_dim declares dim {dim} for it, of size "
                f"{shape[dim]}, not the batch size {batch_size}{hint}; declare the dimension "
                f"that holds the batch, or None to pass it whole to every microbatch")
    return None


def _flat_hint(shape: tuple[int, ...], batch_size: int) -> str:
    """A 1-D tensor of a multiple of the batch size (a ``(T, B)`` target flattened with
    ``view(-1)``, as RNN trainers feed ``NLLLoss``): the measured sizes, and the fix if it is."""
    if len(shape) != 1 or shape[0] <= batch_size or shape[0] % batch_size:
        return ""
    return (f" (its {shape[0]} elements are {shape[0] // batch_size} × the batch size {batch_size}: if it is "
            f"a (T, B) tensor flattened, return it unflattened and flatten it in forward_loss)")
