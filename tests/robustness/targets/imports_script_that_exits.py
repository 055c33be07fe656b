"""BROKEN (probe 1, through an import): the target imports a module beside it that runs a
script at import and exits 0 (``train_script_exits.py``: no ``if __name__ == "__main__":``).

    ddp-conformance run --target tests/robustness/targets/imports_script_that_exits.py
"""

from __future__ import annotations

from train_script_exits import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401
