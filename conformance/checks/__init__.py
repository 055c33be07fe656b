"""The conformance checks: one entry module per check id, named after it (``gradient_equivalence``
for ``gradient-equivalence``; see conformance.harness.registry), beside the engines they run on:
``equivalence/`` (the N-rank run against its single-process reference, behind
gradient-equivalence and no-sync-equivalence), ``evaluation/`` and ``resume/`` (the experiments of
eval-equivalence and resume-equivalence), and the helpers of one check each (``sampling.order`` and
``sampling.pipeline``: sampler-coverage's; ``midrun``: rank-consistency's look into the target's loop)."""
