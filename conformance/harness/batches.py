"""A batch's parts as the target makes them: a tensor, or a tuple/list/dict of tensors.

    make_batch(generator, 8) -> (x, y)                          # one tensor each
    make_batch(generator, 8) -> ((left, right), label)          # a siamese pair
    make_batch(generator, 8) -> ({"ids": ids, "mask": m}, y)    # named inputs

Every tensor in ``inputs`` and ``targets`` holds the batch on dim 0, or on the dimension the
target's ``batch_dim`` declares (``dims`` below); the suite splits the global batch by rank and
microbatch by slicing every tensor along its batch dimension alike, moves every tensor to the
rank's device, and hands the parts back in the same structure: to
``forward_loss(model, (inputs, targets))`` and to ``train_step`` unchanged, and, without a
``forward_loss``, to the model the way Python calls unpack them: ``model(*inputs)`` for a
tuple or list, ``model(**inputs)`` for a dict, ``model(inputs)`` for a tensor. Anything in
the structure that is not a tensor (``None`` for a fresh RNN hidden state, an int) passes
through unchanged. See the README section 'Writing a target'.

``dims``, the declared batch dimensions, mirrors the batch as far as the target spells it out:

    batch_dim = 1                                   # every tensor: time-major (T, B, ...)
    batch_dim = ((1, 1), 1)                         # ((tokens, hidden), targets)
    batch_dim = ({"ids": 0, "mask": None}, 0)       # None: passed whole to every microbatch

An int (or None) where the batch has a structure applies to every tensor below it; ``None``
there means "not batched": the tensor goes unsplit to every rank and microbatch. A tuple/list
must have the batch's length, a dict its keys. Undeclared (``dims`` None at the top): dim 0.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


class DimsMismatch(ValueError):
    """``dims`` does not fit the batch: the message says where (``at``) and how."""


def _rebuild(value: Any, items: Any) -> Any:
    if isinstance(value, dict):
        return type(value)(items)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*items)
    return type(value)(items)


def _children(value: Any, dims: Any, at: str) -> list[tuple[Any, Any, Any, str]]:
    """(key, child, child's dims, child's path) for a tuple/list/dict ``value``."""
    spread = dims is None or isinstance(dims, int)
    if isinstance(value, dict):
        if not spread and (not isinstance(dims, dict) or set(dims) != set(value)):
            raise DimsMismatch(f"{at} is a dict with keys {sorted(map(str, value))} but batch_dim gives "
                               f"{_shown(dims)} there")
        return [(k, v, dims if spread else dims[k], f"{at}[{k!r}]") for k, v in value.items()]
    if not spread and (not isinstance(dims, (tuple, list)) or len(dims) != len(value)):
        raise DimsMismatch(f"{at} is a {type(value).__name__} of {len(value)} but batch_dim gives "
                           f"{_shown(dims)} there")
    return [(i, v, dims if spread else dims[i], f"{at}[{i}]") for i, v in enumerate(value)]


def _shown(dims: Any) -> str:
    return f"a {type(dims).__name__} of {len(dims)}" if isinstance(dims, (tuple, list)) else \
        f"a dict with keys {sorted(map(str, dims))}" if isinstance(dims, dict) else repr(dims)


def walk(value: Any, dims: Any, at: str = "") -> list[tuple[str, Any, int | None]]:
    """(path, tensor, its batch dimension or None when not batched) for every tensor of
    ``value``, in order; raises DimsMismatch where ``dims`` does not mirror ``value``."""
    if _is_tensor(value):
        if not (dims is None or isinstance(dims, int)):
            raise DimsMismatch(f"{at or 'it'} is a tensor but batch_dim gives {_shown(dims)} there")
        return [(at, value, dims)]
    if isinstance(value, (tuple, list, dict)):
        return [leaf for _, v, d, path in _children(value, dims, at) for leaf in walk(v, d, path)]
    return []


def _map(value: Any, fn: Callable[[Any, int | None], Any], dims: Any = 0) -> Any:
    """``fn(tensor, its batch dimension)`` applied to every tensor of ``value``, the structure kept."""
    if _is_tensor(value):
        return fn(value, dims)
    if isinstance(value, (tuple, list, dict)):
        mapped = [(k, _map(v, fn, d)) for k, v, d, _ in _children(value, dims, "")]
        return _rebuild(value, mapped if isinstance(value, dict) else [v for _, v in mapped])
    return value


def tensors(value: Any) -> list[Any]:
    """Every tensor of ``value``, in order (a dict's in its own order)."""
    if _is_tensor(value):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return [t for item in items for t in tensors(item)]


def is_batch_part(value: Any) -> bool:
    """A tensor, or a (nested) tuple/list/dict holding at least one tensor."""
    return bool(tensors(value))


def part_dims(dims: Any, index: int) -> Any:
    """The declared dims of ``make_batch``'s part ``index`` (0: inputs, 1: targets): an int or
    None applies to both parts; undeclared (None) is dim 0."""
    if dims is None:
        return 0
    return dims[index] if isinstance(dims, (tuple, list)) else dims


def rows(value: Any, dims: Any = 0) -> int:
    """The batch size of a part: the size of its first batched tensor along its batch dimension."""
    for _, t, dim in walk(value, dims):
        if dim is not None:
            return int(t.shape[dim]) if t.dim() else 0
    return 0


def take_rows(value: Any, start: int, stop: int, dims: Any = 0) -> Any:
    """Samples ``[start, stop)`` of every batched tensor along its batch dimension (dim 0
    unless ``dims`` says otherwise); a tensor declared not batched (None) is passed whole."""
    def cut(t: Any, d: int | None) -> Any:
        # Python slicing along dimension d (negative counts from the end), as t[start:stop] is on dim 0.
        return t if d is None else t[(slice(None),) * (d % t.dim()) + (slice(start, stop),)]

    return _map(value, cut, dims)


def first_dim(dims: Any) -> int:
    """The batch dimension of the first tensor ``dims`` declares batched (0 when undeclared): for
    a model's own inputs, whose structure the declaration does not describe."""
    found = _first_declared(dims)
    return 0 if found is None else found


def _first_declared(dims: Any) -> int | None:
    if isinstance(dims, int) and not isinstance(dims, bool):
        return dims
    items = dims.values() if isinstance(dims, dict) else dims if isinstance(dims, (tuple, list)) else ()
    return next((d for d in map(_first_declared, items) if d is not None), None)


def sample_rows(tensor: Any, dim: int) -> Any:
    """``tensor`` as one row per sample (the batch dimension moved first, the rest flattened)."""
    t = tensor.detach().cpu()
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.movedim(dim, 0).contiguous().reshape(t.shape[dim], -1)


def move(value: Any, device: Any) -> Any:
    return _map(value, lambda t, _: t.to(device), None)


def digest(value: Any) -> str:
    """Exact identity of every tensor of a part, in order (dtype and shape included)."""
    import torch

    h = hashlib.sha1()
    for t in tensors(value):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:16]


def call_model(model: Any, inputs: Any) -> Any:
    """The model's forward on ``inputs`` as training calls it without a ``forward_loss``:
    a tuple/list unpacked as positional arguments, a dict as keywords, a tensor as is."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)
