"""The metric and evidence keys that the report reads, named once for writer and reader.

A check writes these keys into its record's ``metrics`` or ``evidence``; the recommendations
(:mod:`reports.recommend`), the key-figure column and the charts read them back. Both sides
import the constant, so a rename on either side is a NameError in CI instead of a rule that
silently never fires (docs/architecture.md, "Where a new piece goes": a new recommendation is
keyed on evidence constants that the producing check imports).

Every constant names its producer; ``tests/reports/test_recommendations.py`` checks that each
one is imported by that producer and that :mod:`reports.recommend` reads no key from anywhere
else. A check that starts emitting a new hint adds its constant here, beside its producer.
"""

from __future__ import annotations

# conformance/checks/equivalence/presentation.py (gradient-equivalence, no-sync-equivalence), evidence.
WARNINGS = "warnings"  # list[str]: a passed check that still has something to say
BATCHNORM_PER_RANK = "batchnorm_per_rank_statistics"  # bool: plain BatchNorm, statistics per rank
# dict: the measured noise floor, margin, bounds and observed differences (and a comm hook's
# compression error against the uncompressed run), equivalence/floor.py / compression.py
NOISE_FLOOR = "noise_floor"
# dict: {feature: {"used", "value", "where"}} the N-rank run's step used (autocast, GradScaler,
# compile, checkpointing, comm hook, static_graph, …), conformance/harness/features.py
FEATURES = "features"
# list of dicts: the collectives rank 0's first step called in its forward, loss and the
# backward of an autograd.Function (op, api, phase, module, requires_grad, shape, ...),
# conformance/harness/observe/step_collectives.py; the configuration table's row
STEP_COLLECTIVES = "step_collectives"

# What a passed correctness check compared, counted (dict[str, int]), evidence: the ready
# rule reads it (reports/verdict.py, ``unverified``): ``ranks`` at least 2, every other count at
# least 1. The equivalence checks count ``ranks``, ``optimizer_steps`` (the fewest any rank or
# the reference took), ``nonzero_gradients`` and ``allreduce_rounds`` (the fewest any rank saw);
# rank-consistency, shared-weights and sampler-coverage count their own subject.
VERIFIED = "verified"

# conformance/harness/failures.py (world_error_outcome) and conformance/harness/session.py,
# evidence. str: the host ran out of a resource (disk, /dev/shm, file descriptors), one line
# naming it and the fix (conformance/harness/exhaustion.py). The record is inconclusive and
# the verdict says the line first (reports/verdict.py).
EXHAUSTED = "environment_exhausted"

# conformance/harness/outcome.py (``Outcome.not_run_here``), evidence of a skipped record:
# {"mode", "command"}: the target has the check's subject (a run_loop, a model to sweep) but
# this mode (--attach) cannot run the check; the verdict lists it with the command that runs it
# (reports/verdict.py, ``not_run``) and the run is inconclusive unless it was deselected.
NOT_RUN_HERE = "not_run_here"

# conformance/checks/equivalence/ (presentation.py, verdict.py), measured hypotheses behind a gradient mismatch.
DROPOUT_DISABLED = "dropout_disabled"  # evidence list[str]: dropout switched off in both runs
GRADIENT_FACTOR = "gradient_factor"  # metric float | None: one N-rank/reference factor on every gradient
HYPOTHESES = "hypotheses"  # evidence list[str]: causes a measurement supports (empty: none matched)
DDP_BYPASSED = "ddp_bypassed"  # evidence bool: forwards reached the inner module only, 0 all-reduces
# conformance/checks/equivalence/verdict.py, rank_consistency.py and shared_weights.py, evidence.
NONFINITE = "nonfinite"  # dict: first NaN/Inf {"step", "rank", "kind", "name"}

# conformance/checks/sampler_coverage.py (and equivalence/presentation.py for DATASET_DIFFERS_ON_RANKS), evidence.
DATASET_DIFFERS_ON_RANKS = "dataset_differs_on_ranks"  # list[int]: ranks whose dataset is not rank 0's
SAMPLER_SEEDS = "sampler_seeds"  # list: DistributedSampler seed per rank, present only when they differ

# faults/checks/unused_parameters.py.
UNUSED_TABLE = "unused"  # evidence: {parameter name: {"ranks", "steps", ...}} of unused parameters
FIND_UNUSED_TAX = "find_unused_tax"  # metric: step time with find_unused_parameters=True / False

# faults/checks/straggler.py and faults/checks/hang_detection.py, metrics.
CULPRIT_RANK = "culprit_rank"  # int | None: the rank named as the cause

# faults/checks/node_health/judge.py, metrics. list[{"rank", "host", "device", "device_name",
# "digests_agree", "software", "named"}]: the per-rank health table of the report.
NODE_HEALTH = "node_health"

# faults/checks/bucket_config.py, metrics.
BEST_BUCKET_CAP_MB = "best_bucket_cap_mb"  # float: the fastest cap of the sweep
CONFIGURED_BUCKET_CAP_MB = "configured_bucket_cap_mb"  # float: the target's cap (25 when unset)

# conformance/harness/remedies.py (written by conformance/checks/equivalence/checkpointing.py,
# faults/checks/unused_parameters.py and faults/checks/bucket_config.py), evidence.
REMEDIES = "remedies"  # list[{"change", "status", "evidence"}]: recommended changes re-run or not

# conformance/checks/equivalence/compiled.py (the equivalence checks on a compiled target), evidence.
COMPILED = "compiled"  # dict: form of torch.compile, backend, how ranks and reference ran, graphs
GRAPH_BREAKS = "graph_breaks"  # list[{"where", "count", "reasons"}]: dynamo graph breaks in user code
DDP_BUCKET_SPLITS = "ddp_bucket_splits"  # list[list[int]]: per rank, DDPOptimizer subgraphs per graph

# conformance/perf/allreduce_bandwidth.py, metrics.
CLIFF_WORLD_SIZE = "cliff_world_size"  # int | None: first projected world size that stops overlapping
SIMULATOR_ERROR = "simulator_error"  # float: |predicted - measured| / measured step time
# bool: the simulator matched the measured step within its bound; False: the message calls the
# projection unreliable, and the report's chart must not draw it as a prediction
PROJECTION_RELIABLE = "projection_reliable"

# conformance/harness/resources.py, metrics of every record (what the check cost, on what model).
MODEL_PARAMETERS = "model_parameters"  # int: parameters of the target's model (absent for vehicles)
MODEL_BYTES = "model_bytes"  # int: bytes of those parameters
SUPERVISOR_PEAK_RSS = "supervisor_peak_rss_bytes"  # int | None: the supervisor's peak RSS during the check
TREE_PEAK_RSS = "tree_peak_rss_bytes"  # int | None: peak RSS of supervisor + ranks + their children, summed
# dict[str(pid), int]: each process under the supervisor (ranks, references, what they started;
# not the idle zygotes), its own peak RSS during the check (VmHWM, reset at the check's start)
PROCESS_PEAK_RSS = "process_peak_rss_bytes"

# conformance/perf/scaling_cliff.py, metrics.
CLIFF_SWEEP = "cliff_sweep"  # list[{"rate_gbps" (None: unshaped), "measured_step_s", "predicted_step_s", ...}]
CLIFF_KNEE = "cliff_knee"  # {"measured_gbps", "predicted_gbps", "measured_index", "predicted_index"}
CLIFF_RATIO = "cliff_ratio"  # float: step at the lowest rate / unshaped step
CLIFF_MAX_ERROR = "cliff_max_error"  # float: the simulator's largest relative error at a shaped rate
LINK_PROJECTION = "link_projection"  # {"link_gbps", "projection", "validated", "bandwidth_factor", ...}: --link-gbps
CLIFF_VALIDATED = "cliff_simulator_validated"  # bool: every shaped rate within the bound, knee within a point

# conformance/checks/resume_equivalence.py, metrics.
# {scenario: {"uninterrupted", "before_kill", "resumed" (rank 0's parameter norm per step),
# "resumed_from", "kill_after", "kill"}}: the report's resume chart
RESUME_TRAJECTORIES = "resume_trajectories"

# conformance/perf/migration.py (ddp-migration, --compare-ddp), metrics. list[{"wrapper", "rank",
# "peak_rss", "step_rss", "cuda_peak", "step_s", "collectives_per_step"}]: the side-by-side table.
MIGRATION = "migration"

# Which module produces which key: what the test of this module holds the producers to.
PRODUCERS: dict[str, tuple[str, ...]] = {
    WARNINGS: ("conformance.checks.equivalence.presentation", "conformance.checks.resume_equivalence"),
    BATCHNORM_PER_RANK: ("conformance.checks.equivalence.presentation",),
    NOISE_FLOOR: ("conformance.checks.equivalence.presentation",),
    FEATURES: ("conformance.checks.equivalence.presentation", "conformance.checks.rank_consistency",
               "ddp_conformance.faults.checks.hang_detection", "conformance.checks.equivalence.checkpointing"),
    STEP_COLLECTIVES: ("conformance.checks.equivalence.presentation",),
    VERIFIED: ("conformance.checks.equivalence.presentation", "conformance.checks.rank_consistency",
               "conformance.checks.shared_weights", "conformance.checks.sampler_coverage",
               "conformance.checks.evaluation.verdict", "conformance.checks.resume_equivalence"),
    EXHAUSTED: ("conformance.harness.failures", "conformance.harness.session"),
    NOT_RUN_HERE: ("conformance.harness.outcome",),
    DROPOUT_DISABLED: ("conformance.checks.equivalence.presentation",),
    GRADIENT_FACTOR: ("conformance.checks.equivalence.presentation",),
    HYPOTHESES: ("conformance.checks.equivalence.verdict",),
    DDP_BYPASSED: ("conformance.checks.equivalence.presentation",),
    NONFINITE: ("conformance.checks.equivalence.verdict", "conformance.checks.rank_consistency",
                "conformance.checks.shared_weights"),
    DATASET_DIFFERS_ON_RANKS: ("conformance.checks.sampler_coverage", "conformance.checks.equivalence.presentation"),
    SAMPLER_SEEDS: ("conformance.checks.sampler_coverage",),
    UNUSED_TABLE: ("ddp_conformance.faults.checks.unused_parameters",),
    FIND_UNUSED_TAX: ("ddp_conformance.faults.checks.unused_parameters",),
    CULPRIT_RANK: ("ddp_conformance.faults.checks.straggler", "ddp_conformance.faults.checks.hang_detection",
                   "conformance.checks.evaluation.verdict", "ddp_conformance.faults.checks.node_health.judge"),
    NODE_HEALTH: ("ddp_conformance.faults.checks.node_health.judge",),
    BEST_BUCKET_CAP_MB: ("ddp_conformance.faults.checks.bucket_config",),
    CONFIGURED_BUCKET_CAP_MB: ("ddp_conformance.faults.checks.bucket_config",),
    REMEDIES: ("conformance.harness.remedies", "conformance.checks.equivalence.checkpointing",
               "ddp_conformance.faults.checks.unused_parameters", "ddp_conformance.faults.checks.bucket_config",
               "conformance.perf.scaling_cliff"),
    COMPILED: ("conformance.checks.equivalence.compiled",),
    RESUME_TRAJECTORIES: ("conformance.checks.resume_equivalence",),
    MIGRATION: ("conformance.perf.migration",),
    GRAPH_BREAKS: ("conformance.checks.equivalence.compiled",),
    DDP_BUCKET_SPLITS: ("conformance.checks.equivalence.compiled",),
    CLIFF_WORLD_SIZE: ("conformance.perf.allreduce_bandwidth",),
    SIMULATOR_ERROR: ("conformance.perf.allreduce_bandwidth",),
    PROJECTION_RELIABLE: ("conformance.perf.allreduce_bandwidth",),
    MODEL_PARAMETERS: ("conformance.harness.resources",),
    MODEL_BYTES: ("conformance.harness.resources",),
    SUPERVISOR_PEAK_RSS: ("conformance.harness.resources",),
    TREE_PEAK_RSS: ("conformance.harness.resources",),
    PROCESS_PEAK_RSS: ("conformance.harness.resources",),
    CLIFF_SWEEP: ("conformance.perf.scaling_cliff",),
    CLIFF_KNEE: ("conformance.perf.scaling_cliff",),
    CLIFF_RATIO: ("conformance.perf.scaling_cliff",),
    CLIFF_MAX_ERROR: ("conformance.perf.scaling_cliff",),
    CLIFF_VALIDATED: ("conformance.perf.scaling_cliff",),
    LINK_PROJECTION: ("conformance.perf.scaling_cliff",),
}
