"""A comm hook's compression error against the uncompressed run, and the bound it is held to.

A target registers its comm hook in ``configure_ddp`` (README, "Writing a target";
``harness.comm_hooks`` captures it into the model's one hook chain). The equivalence checks run
the single-process reference and its twin *uncompressed* (the hook replaced by the stock
all-reduce, ``RunPlan.uncompressed``) and the N-rank run with the hook, so the N-rank run's
difference from the reference *is* the hook's compression error (plus the configuration's
noise floor, ``floor``). It is reported as a figure and fails only beyond the hook's bound
(docs/numerics.md, "Comm hook compression"):

- ``fp16_compress_hook`` (and the built-in FP16_COMPRESS, ``fp16_compress_wrapper``): each rank
  casts its bucket, divided by N, to float16 (≤ ½ ulp), and the all-reduce adds N float16
  values (≤ ½ ulp per addition). Relative to a tensor's largest element that is at most about N
  ulps of float16 (2^-10), doubled because one rank's gradient can exceed the mean's scale
  (samples that cancel across ranks): bound ``2·N·2^-10`` (3.9e-3 on 2 ranks). Measured on 2
  ranks: ≤ 6e-4.
- ``bf16_compress_hook``: the same with bfloat16's 2^-7: ``2·N·2^-7`` (3.1e-2 on 2 ranks);
  measured ≤ 4e-3. Still 16 times under the smallest scaling bug on 2 ranks (0.5).
- PowerSGD (``powerSGD_hook``, ``batched_powerSGD_hook``): the plain all-reduce until iteration
  ``start_powerSGD_iter`` (1000 by default), then a rank-r approximation whose error is a
  property of the gradient's spectrum, not of rounding, and which error feedback repays over
  later steps. Steps before it are held to the floor (bound 0 here); the parameters after the
  steps that reach it are reported and not judged (``approximate``; a warning says so): no bound
  could tell a bug from the approximation there. The first-step gradients come before it
  (``start_powerSGD_iter`` ≥ 2) and still catch a scaling bug.
- Any other hook: no allowance. Its difference is judged like DDP's own all-reduce, so a hook
  that loses or rescales gradients fails with its name in the record.
"""

from __future__ import annotations

from typing import Any

FP16_ULP = 2.0 ** -10
BF16_ULP = 2.0 ** -7


def comm_hook_of(ddp_model: Any, *, uncompressed: bool) -> dict[str, Any] | None:
    """What the target's hook is (for the judge), replacing it by the stock all-reduce when
    ``uncompressed``; None when the target registered none. Runs on a rank, after wrapping."""
    from ...harness.comm_hooks import UserHook, install_user_hook, user_hook

    hook = user_hook(ddp_model)
    if hook is None:
        return None
    info: dict[str, Any] = {"name": hook.name, "kind": _kind(hook.name), "applied": not uncompressed}
    start = getattr(hook.state, "start_powerSGD_iter", None)
    if start is not None:
        info["start_powerSGD_iter"] = int(start)
        info["matrix_approximation_rank"] = int(getattr(hook.state, "matrix_approximation_rank", 0))
    if uncompressed:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp = getattr(ddp_model, "_orig_mod", ddp_model)
        install_user_hook(ddp_model, UserHook(state=getattr(ddp, "process_group", None),
                                              hook=default_hooks.allreduce_hook,
                                              name=f"allreduce_hook (instead of {hook.name})"))
    return info


def _kind(name: str) -> str:
    low = name.lower()
    if "powersgd" in low:
        return "powersgd"
    if "bf16" in low:
        return "bf16"
    if "fp16" in low:
        return "fp16"
    return "other"


def compression_bound(hook: dict[str, Any] | None, *, world_size: int,
                      steps: int) -> tuple[float, str, bool]:
    """(bound relative to max|ref|, why, approximate) for the hook the N-rank run used.

    ``approximate``: the compared steps reach PowerSGD's low-rank phase, where no bound can
    tell a bug from the approximation."""
    if hook is None:
        return 0.0, "no comm hook", False
    kind, n = hook.get("kind"), world_size
    if kind == "fp16":
        why = f"float16 compression: 2·N·2^-10 (N={n}; ½ ulp per cast and per addition, doubled for per-rank scales)"
        return 2 * n * FP16_ULP, why, False
    if kind == "bf16":
        why = f"bfloat16 compression: 2·N·2^-7 (N={n}; ½ ulp per cast and per addition, doubled for per-rank scales)"
        return 2 * n * BF16_ULP, why, False
    if kind == "powersgd":
        start = int(hook.get("start_powerSGD_iter") or 0)
        if start >= steps:
            why = (f"PowerSGD all-reduces uncompressed until iteration {start}: the {steps} "
                   f"compared steps ran before it (compression not exercised)")
            return 0.0, why, False
        why = (f"PowerSGD compresses from iteration {start} (rank "
               f"{hook.get('matrix_approximation_rank')}): a low-rank approximation, not bounded "
               f"by rounding")
        return 0.0, why, True
    return 0.0, f"{hook.get('name')}: not a known compression, no allowance", False
