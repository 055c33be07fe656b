"""What the perf checks measure on every rank (module-level functions, so a World pickles them
by reference): ``sweep`` (the all-reduce sweep, every result checked exact, each size timed),
``profile`` (when each gradient becomes ready in backward: the simulator's input) and
``overlap`` (timed DDP steps and DDP's own account of its overlap); ``model_step`` (the profile
and the DDP steps on one build of the model, as allreduce-bandwidth measures them)."""

from __future__ import annotations

from .model_step import model_timings
from .overlap import OverlapSample, ddp_steps, parse_bucket_indices, timed_ddp_steps
from .profile import GradReadyRecorder, local_batch, profile_backward, profile_passes, to_profile
from .sweep import ITERS, WARMUP, allreduce_sweep, default_sizes, split_sweep, sweep_on

__all__ = ["ITERS", "WARMUP", "GradReadyRecorder", "OverlapSample", "allreduce_sweep", "ddp_steps", "default_sizes",
           "local_batch", "model_timings", "parse_bucket_indices", "profile_backward", "profile_passes", "split_sweep",
           "sweep_on", "timed_ddp_steps", "to_profile"]
