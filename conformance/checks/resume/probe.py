"""Under --attach: does the target's run_loop save checkpoints at all?

The launcher owns the ranks there, so the experiment (kill, restart) cannot run; what the check
can still learn is whether its subject exists: a loop that saves in ``ctx.checkpoint_dir``.
One uninterrupted run of the loop in the launched world answers it, and decides between
"not verified" (the verdict lists the check with its command) and a plain skip (nothing to
resume), as the local check decides after its own first life.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ...harness.world import RankContext
from .scenarios import files_in


def saves_in_checkpoint_dir(rank_ctx: RankContext, target_spec: str, *, steps: int, every: int) -> int:
    """Run the target's ``run_loop`` once on this rank for ``steps`` optimizer steps, saving
    every ``every``; return how many files it wrote in ``ctx.checkpoint_dir``.

    Each rank gets its own empty folder (ranks on other hosts could not share one): at a first
    start a loop resumes from nothing, so what it writes there is what it saves. The folder is
    removed afterwards: checkpoints are the model's size several times over.
    """
    from ...harness.rank_run import RankRun
    from ...harness.targets import call_target

    run = RankRun.load(rank_ctx, target_spec)
    target = run.target
    if target.run_loop is None:
        raise ValueError(f"target {target.name!r} defines no run_loop: there is no loop to probe")
    scratch = Path(rank_ctx.tmpdir) / f"resume-probe-rank{rank_ctx.rank}"
    try:
        loop = run.loop_context(steps=steps, tmpdir=scratch, checkpoint_every=every)
        call_target(target, "run_loop", target.run_loop, loop)
        assert loop.checkpoint_dir is not None  # set by LoopContext.__post_init__
        return len(files_in(Path(loop.checkpoint_dir)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
