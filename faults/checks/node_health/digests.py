"""Node-health's tensors: which a module's output holds, and how two ranks' copies differ.

Each is digested by the suite's one digest (``conformance.harness.digest``: exact and
order-sensitive, computed where the tensor lives); ``difference`` says, for a digest that
disagrees, how many elements differ and by how much.
"""

from __future__ import annotations

from typing import Any

from conformance.harness.digest import INT_OF_WIDTH


def leaves(value: Any, name: str) -> list[tuple[str, Any]]:
    """The tensors in a module's output (a tensor, or tuples, lists and dicts of them), each with
    its name: ``name``, ``name[0]``, ``name[key]``; anything else is not digested."""
    import torch

    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in leaves(v, f"{name}[{i}]")]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in leaves(v, f"{name}[{k}]")]
    return []


def difference(tensors: list[Any], reference: int) -> dict[int, dict[str, Any]]:
    """Per rank (index into ``tensors``), how it differs from ``tensors[reference]``: elements
    whose bits differ and the largest absolute difference (``inf`` where a value is not finite)."""
    import torch

    # Sparse gradients compared as the dense tensors they stand for (an embedding table's size).
    tensors = [t.to_dense() if t.layout == torch.sparse_coo else t for t in tensors]
    ref = tensors[reference]
    out: dict[int, dict[str, Any]] = {}
    for rank, t in enumerate(tensors):
        if rank == reference:
            continue
        if t.shape != ref.shape or t.dtype != ref.dtype:
            out[rank] = {"elements": None, "of": int(t.numel()), "max_abs_diff": None,
                         "shape": list(t.shape), "reference_shape": list(ref.shape)}
            continue
        width = INT_OF_WIDTH[max(t.element_size(), 1)]
        a = t.contiguous().view(-1).view(getattr(torch, width))
        b = ref.contiguous().view(-1).view(getattr(torch, width))
        differs = a != b
        n = int(differs.sum().item())
        worst = 0.0
        if n:
            x, y = t.reshape(-1)[differs].double(), ref.reshape(-1)[differs].double()
            gap = (x - y).abs()
            worst = float("inf") if not bool(torch.isfinite(gap).all()) else float(gap.max().item())
        out[rank] = {"elements": n, "of": int(t.numel()), "max_abs_diff": worst}
    return out
