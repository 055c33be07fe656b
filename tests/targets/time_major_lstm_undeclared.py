"""The time-major LSTM LM of ``time_major_lstm.py`` without ``batch_dim = 1``: its tokens are
``(T, B)`` with T != B, so make_batch's tensors do not hold the batch on dim 0 and the target is
refused (exit 2) with the measured hint: dim 1 has the batch size, declare ``batch_dim = 1``.

    ddp-conformance run --target tests/targets/time_major_lstm_undeclared.py --checks gradient-equivalence
"""

from __future__ import annotations

from time_major_lstm import build_model, forward_loss, global_batch_size, make_batch  # noqa: F401
