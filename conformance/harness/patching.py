"""One attribute replaced for a block, on a rank: how the suite's observers watch the user's code
(``GradScaler.step``, ``torch.save``, a DataLoader iterator's ``_next_index``, ...) without
changing it.

    with replaced(GradScaler, "step", lambda original: counting(original)):
        run_loop(ctx)
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def replaced(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """``owner.name`` replaced by ``make(original)`` for the block, then put back exactly,
    whatever happens in it (an inherited attribute is deleted again rather than copied down)."""
    own = owner.__dict__.get(name)
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        if own is None:
            delattr(owner, name)
        else:
            setattr(owner, name, own)
