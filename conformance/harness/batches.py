"""A batch's parts as the target makes them: a tensor, or a tuple/list/dict of tensors.

    make_batch(generator, 8) -> (x, y)                          # one tensor each
    make_batch(generator, 8) -> ((left, right), label)          # a siamese pair
    make_batch(generator, 8) -> ({"ids": ids, "mask": m}, y)    # named inputs

Every tensor in ``inputs`` and ``targets`` holds the batch on dim 0; the suite splits the
global batch by rank and microbatch by slicing every tensor along dim 0 alike, moves every
tensor to the rank's device, and hands the parts back in the same structure: to
``forward_loss(model, (inputs, targets))`` and to ``train_step`` unchanged, and, without a
``forward_loss``, to the model the way Python calls unpack them: ``model(*inputs)`` for a
tuple or list, ``model(**inputs)`` for a dict, ``model(inputs)`` for a tensor. Anything in
the structure that is not a tensor (``None`` for a fresh RNN hidden state, an int) passes
through unchanged. See the README section 'Writing a target'.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _map(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied to every tensor of ``value``, the structure kept."""
    if _is_tensor(value):
        return fn(value)
    if isinstance(value, dict):
        return type(value)((k, _map(v, fn)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_map(v, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map(v, fn) for v in value)
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


def rows(value: Any) -> int:
    """The batch size of a part: dim 0 of its (first) tensor."""
    first = tensors(value)[0]
    return int(first.shape[0]) if first.dim() else 0


def take_rows(value: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of every tensor (dim 0)."""
    return _map(value, lambda t: t[start:stop])


def move(value: Any, device: Any) -> Any:
    return _map(value, lambda t: t.to(device))


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
