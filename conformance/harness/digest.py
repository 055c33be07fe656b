"""Exact, order-sensitive digests of a tensor's bit patterns, computed where the tensor lives.

The suite's one digest of a tensor: node-health's of every module output, gradient and bucket,
rank-consistency's of every parameter at every checkpoint, the equivalence engine's for a rank
that cannot read the reference (``ddp.tensor_digest`` around it). Two ranks that computed the
same thing hold the same bits; a digest must tell any other tensor apart, and it must be cheap
enough to take of every module output and every gradient, and of a production-size model's
parameters several times a check (no copy to the host: a GPU's tensor is digested there).
``torch.hash_tensor``'s XOR reduction is not enough alone: it ignores where a value sits and
two equal flips cancel. Every rank of a comparison digests on the same kind of device (a mixed
world is a software mismatch: node-health's ``software.py``), with one of two exact,
order-sensitive digests:

- **CPU**: CRC-32 of the tensor's bytes and the sum of its 64-bit words modulo 2**64, both read
  in place (``zlib``, ``numpy``). CRC-32 catches every single flipped bit, every burst up to 32
  bits, and every pair of flips in a tensor under 512 MB (its polynomial's period), with
  certainty; the sum catches any change confined to one word, and flips elsewhere must cancel
  in both to go unseen (CRC-32 alone: a 2**-32 event). Measured for 400 MB on this host: CRC-32
  0.13-0.17 s, the sum 0.03 s (Adler-32, the second digest before, 0.12-0.22 s: half the
  digest time for a weaker second check; docs/node-health.md, "The numbers").
- **GPU** (no host copy): each element's bit pattern, read as an integer, weighted by an odd
  number that depends on its position and summed modulo 2**64 (integer addition is
  associative: the kernel's reduction order does not matter). A single flipped bit changes the
  sum by an odd multiple of a power of two below 2**64, never by 0: caught with certainty; two
  weightings make a cancellation of several flips a 2**-128 event.

Digest and shape/dtype travel as a short string.

    digest(torch.ones(3)) != digest(torch.ones(3).neg())
"""

from __future__ import annotations

import zlib
from typing import Any

#: The integer dtype (its name in torch) of each element width, to read bit patterns as integers.
INT_OF_WIDTH = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
# Odd multipliers (golden-ratio and a 64-bit prime's low bits), taken as signed 64-bit values.
_A = 0x9E3779B97F4A7C15 - (1 << 64)
_B = 0x2545F4914F6CDD1D
_MASK = (1 << 64) - 1
#: Elements per chunk of the device-side digest (its int64 temporaries: ~4 x 8 bytes each).
CHUNK = 1 << 22


def digest(tensor: Any) -> str:
    """``dtype/shape/hex``: equal digests mean bit-identical tensors (module docstring)."""
    import torch

    t = tensor.detach()
    head = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
    if t.layout == torch.sparse_coo:
        # A sparse gradient (EmbeddingBag(sparse=True)) as stored, uncoalesced: the same work
        # stores the same indices and values in the same order, with no arithmetic of ours.
        return f"{head}/sparse:{digest(t._indices())}:{digest(t._values())}"
    if t.numel() == 0:
        return head
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t)
    flat = t.contiguous().view(-1)
    if flat.device.type == "cpu":
        data = memoryview(flat.view(torch.uint8).numpy())
        return f"{head}/{zlib.crc32(data):08x}{_word_sum(data):016x}"
    return f"{head}/{weighted_sum(flat)}"


def _word_sum(data: memoryview) -> int:
    """The sum of ``data``'s little-endian 64-bit words modulo 2**64, a short tail zero-padded
    (numpy reads unaligned words; its unsigned sum wraps)."""
    import numpy as np

    whole = len(data) // 8 * 8
    total = int(np.frombuffer(data, dtype="<u8", count=whole // 8).sum(dtype=np.uint64)) if whole else 0
    tail = bytes(data[whole:])
    return (total + int.from_bytes(tail.ljust(8, b"\0"), "little")) & _MASK if tail else total


def weighted_sum(flat: Any) -> str:
    """The device-side digest of a flat tensor (module docstring), as 32 hex digits."""
    import torch

    view = flat.view(getattr(torch, INT_OF_WIDTH[flat.element_size()]))
    first = torch.zeros((), dtype=torch.int64, device=flat.device)
    second = torch.zeros_like(first)
    # In chunks: the int64 temporaries stay a few times CHUNK elements, never a few times a large
    # activation (the suite must fit where the training fits); the sums still wrap mod 2**64.
    for start in range(0, view.numel(), CHUNK):
        ints = view[start:start + CHUNK].to(torch.int64)
        # (2i+1)*A and (2i+1)*B are odd: a weight that can never turn a change into 0 mod 2**64.
        odd = torch.arange(start, start + ints.numel(), device=flat.device, dtype=torch.int64) * 2 + 1
        first += (ints * (odd * _A)).sum()
        second += (ints * (odd * _B)).sum()
    return f"{int(first.item()) & _MASK:016x}{int(second.item()) & _MASK:016x}"
