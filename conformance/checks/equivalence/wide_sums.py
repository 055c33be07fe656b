"""Float64 sums and norms of a model's tensors, widened one cache-sized chunk at a time.

``t.sum(dtype=torch.float64)`` and ``torch.linalg.vector_norm(t, dtype=torch.float64)``
widen the whole tensor before reducing it: on a CPU they cost 176 ms and 148 ms for a
34 M-element float32 tensor (a fresh float64 buffer twice the tensor's size, page-faulted in
on every call), against 24 ms and 42 ms widened a chunk at a time, where the chunk stays in
the core's cache; the accumulation is float64 either way (the sums agreed to 1e-15). The
recorded run takes such a reduction of every parameter or gradient at several points of a step
(the fingerprints of ``recording``, the gradient norms of ``adaptive``, the reference's
snapshot norms), so at 34 M parameters the whole-tensor form was ~1 s of each rank's run.

Float64, not float32: the float32 norm of the same tensor was off by 2e-3 relative, 200x the
fp32 gradient rtol the later steps' norms are judged against (``adaptive``), and a fingerprint
must change with any update of any element (``recording``), which a float32 sum of millions of
elements can round away.
"""

from __future__ import annotations

from typing import Any

from .tensors import chunk_for


def _chunks(tensor: Any) -> Any:
    """``tensor``'s elements as consecutive views of ``chunk_for`` its device, or None when it
    is not a plain dense contiguous tensor (sparse, a view with strides, a tensor subclass):
    then the caller reduces it whole, as before."""
    import torch

    if (type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.layout != torch.strided
            or not tensor.is_contiguous()):
        return None
    flat = tensor.detach().reshape(-1)
    step = chunk_for(flat.device)
    return (flat[start:start + step] for start in range(0, flat.numel(), step))


def sum64(tensor: Any) -> float:
    """The sum of ``tensor``'s elements, accumulated in float64 (NaN/Inf propagate)."""
    import torch

    chunks = _chunks(tensor)
    if chunks is None:
        return float(tensor.detach().sum(dtype=torch.float64))
    total = torch.zeros((), dtype=torch.float64, device=tensor.device)
    for chunk in chunks:
        total += chunk.sum(dtype=torch.float64)
    return float(total)


def norm64(tensor: Any) -> float:
    """The 2-norm of ``tensor``, its squares accumulated in float64 (NaN/Inf propagate)."""
    import torch

    chunks = _chunks(tensor)
    if chunks is None:
        return float(torch.linalg.vector_norm(tensor.detach(), dtype=torch.float64))
    squares = torch.zeros((), dtype=torch.float64, device=tensor.device)
    for chunk in chunks:
        squares += torch.linalg.vector_norm(chunk, dtype=torch.float64).square()
    return float(squares.sqrt())
