"""Every time limit of the suite, each with the reason for its value.

The rule that ties them together: a timeout *inside* the world (the process group's, a
monitored barrier's) must fire before the supervisor's deadline, so that a blocked rank
reports its own error — with the collective it was stuck in — instead of being killed
silently. Import-light: plain numbers only.
"""

from __future__ import annotations

#: Seconds one distributed call (one check's work on every rank) may take before the
#: supervisor declares a hang. The CLI's ``--deadline`` and pytest's ``--ddp-deadline``
#: default. Long enough for a first NCCL communicator and a cold CUDA context on a GPU node
#: (tens of seconds), short enough that a hung CI job fails in minutes, not in gloo's 30.
DEFAULT_DEADLINE_S = 60.0

#: The process-group timeout of a world, as a share of its deadline: a collective blocked on
#: a live peer raises inside the rank (naming itself) with time to spare before the supervisor
#: kills it at the deadline.
PG_TIMEOUT_SHARE = 0.8
#: ...but never below one second: gloo rounds shorter timeouts up and a loaded CI host can take
#: that long to schedule a rank at all.
MIN_PG_TIMEOUT_S = 1.0


def pg_timeout_for(deadline: float) -> float:
    """The process-group timeout of a world whose calls have ``deadline`` seconds."""
    return max(deadline * PG_TIMEOUT_SHARE, MIN_PG_TIMEOUT_S)

#: How long ``World.close()`` lets *all* ranks together leave the process group after the
#: stop message before they are killed. One shared second: an idle rank exits in ~0.1 s, a
#: busy one never reads the message, and the whole teardown must fit the interrupt budget.
CLOSE_GRACE_S = 1.0

#: Ctrl-C or SIGTERM of a run -> every rank gone, whatever the ranks are doing
#: (benchmarks/interrupt_latency.py measures it).
INTERRUPT_BUDGET_S = 2.0

#: The longest --deadline accepted. A call that may legitimately take longer than an hour is
#: not a check; beyond that the deadline is no longer a deadline, and values near 1e9 s
#: overflow the millisecond timeouts that gloo and the store take.
MAX_DEADLINE_S = 3600.0

# -- chaos scenarios (faults/) ----------------------------------------------------------------
# The model of the rule above, at the scale of one scenario: the scenario's own subgroup
# timeout releases a rank blocked on a live peer, the monitored barrier after it names a rank
# that is alive but stuck, and both fire well before the supervisor's deadline.

#: A gloo collective of a hang scenario, blocked on a live peer, is released after this many
#: seconds (the scenario's fresh subgroup has this timeout); the world deadline is longer, so
#: the blocked rank reports its own timeout instead of being killed. Two seconds: a healthy
#: scenario collective takes milliseconds once the ranks are lined up (faults.scenarios warms
#: them up first), and a hang costs every scenario this much.
SCENARIO_PG_TIMEOUT_S = 2.0
#: ...except in the first step of a target whose model is compiled: each rank compiles in that
#: step at its own pace, and a 4 s skew between two ranks' compiles (a loaded host) tripped the
#: 2 s timeout above and read as a hang of a correct target. Ten seconds covers that skew for a
#: fast backend and leaves the scenario's 20 s deadline room for the steps after it; a cold
#: inductor compile can take longer than the whole scenario (raise --deadline for it).
COMPILE_PG_TIMEOUT_S = 10.0
#: The monitored barrier every rank meets after a scenario: one second past the subgroup
#: timeout, so a rank that timeout released still arrives, and one that never arrives (stuck,
#: frozen) is named by it.
SCENARIO_BARRIER_TIMEOUT_S = SCENARIO_PG_TIMEOUT_S + 1.0
#: torch's flight recorder is dumped once a collective has been in flight this long: far past
#: a healthy collective, before the subgroup timeout ends it (gloo then counts it completed
#: and the recorder forgets that it was stuck).
FLIGHT_SNAPSHOT_AFTER_S = SCENARIO_PG_TIMEOUT_S / 2
#: How long a rank waits for the flight-recorder thread to stop. It polls every 0.1 s, so it
#: stops at once unless a dump is in progress (a private torch API, slow on a full recorder);
#: the thread is a daemon, so one stuck past this never keeps the rank from answering.
FLIGHT_THREAD_JOIN_S = 5.0
#: The deadline of a scenario that freezes a rank. No timeout inside the world reaches a
#: stopped process, so only the supervisor's deadline detects it; its peers are released by
#: the subgroup timeout and answer the monitored barrier in ~5 s. 8 s leaves them 3 s of slack
#: on a loaded host, instead of waiting out the whole scenario deadline for a rank that will
#: never answer.
STALL_DEADLINE_S = SCENARIO_PG_TIMEOUT_S * 3 + 2.0
#: The longest one hang scenario may take (the check's deadline, if shorter): a blocked rank
#: is released in 2 s and answers the barrier by 3 s, and a first DDP construction costs ~2 s
#: (torch 2.13 CPU); 20 s is several times that on a loaded host, while a check that runs six
#: scenarios still ends in about a minute when every one of them hangs.
SCENARIO_DEADLINE_CAP_S = 20.0
#: The default process group of a scenario world: longer than the scenarios' subgroup timeout
#: (the warm-up barrier on it must outlast a rank that is late from the previous scenario's
#: timeout), and never below 5 s, gloo's connect time on a loaded host.
SCENARIO_WORLD_PG_TIMEOUT_S = max(SCENARIO_PG_TIMEOUT_S * 3, 5.0)
#: After a rank of a scenario world died or raised, how long the supervisor still waits for
#: its peers: more than twice the subgroup timeout, so a blocked peer is released by its own
#: timeout and answers the monitored barrier (naming the culprit) before it is killed.
SCENARIO_WORLD_GRACE_S = SCENARIO_PG_TIMEOUT_S * 3 + 2.0
#: A hang counts as detected in time when it was diagnosed within the deadline plus this: the
#: supervisor collects every rank's stack and kills the world after the deadline fired
#: (benchmarks/hang_latency.py measures that fixed cost, well under a second on one host).
DETECTION_SLACK_S = 2.0
#: The bucket-config mismatch reproduction (a bucket_cap_mb that differs across ranks): with
#: find_unused_parameters=True it aborts a process at step 0 and its peers are released by
#: this process-group timeout; 5 s is far beyond the milliseconds a step of its MLP takes.
MISMATCH_PG_TIMEOUT_S = 5.0
#: ...and its world's deadline (the check's, if shorter): one model build, two runs of two
#: steps and, after an abort, the peers' 5 s timeout, with room for a loaded host.
MISMATCH_DEADLINE_CAP_S = 30.0

#: The process-group timeout of the fresh world in which rank-consistency runs a target's
#: run_loop with its mid-run digests (conformance/checks/midrun.py): a loop that hangs (uneven
#: inputs without Join) releases its ranks after this long instead of a deadline's share, and
#: hang-detection is the check that diagnoses it. Ten seconds: a healthy loop's collective waits
#: at most for a peer's step, milliseconds to a few seconds on a loaded CPU host.
MIDRUN_PG_TIMEOUT_S = 10.0

#: How long N spawned ranks (or a validation child) get to import torch and join. Not user
#: code, so not under --deadline: on a loaded 2-core CI host a cold torch import takes
#: several seconds per process, and N of them share the cores.
WORLD_START_S = 120.0

# -- sweeps sized by the measured step time (faults/checks: bucket-config, unused-parameters'
# tax, straggler) ----------------------------------------------------------------------------
# A sweep times R repetitions of each of its P points (bucket caps, find_unused True/False, a
# segment of steps). A fixed R costs P x R x step: seconds on a small MLP, minutes on a
# production model, and past the deadline on a slow one. So the ranks time their warm-up steps
# first and choose R to fill a time budget, within a floor that keeps the statistics meaningful
# and a ceiling past which more samples only cost time.

#: Seconds the timed steps of one sweep aim to take. A fast model fills it up to
#: MAX_SWEEP_REPS; a slow one (1 s a step) still gets MIN_SWEEP_REPS. Ten seconds keeps a full
#: default run's three sweeps under a minute on a CPU host.
SWEEP_BUDGET_S = 10.0
#: The fewest timed repetitions of a point: bucket-config's noise rule compares quartiles, which
#: need at least 4 samples, and a median of 5 survives two outliers from a shared host.
MIN_SWEEP_REPS = 5
#: The most: past ~25 samples a median's run-to-run spread on a shared host is dominated by the
#: host's drift, not by the sample count, so more repetitions buy nothing.
MAX_SWEEP_REPS = 25
#: The share of the world deadline the timed steps of one distributed call may take: the rest
#: is for building the models, the warm-up steps and a loaded host. Above MIN_SWEEP_REPS in
#: priority: a world killed at its deadline measures nothing.
SWEEP_DEADLINE_SHARE = 0.5


def sweep_reps(step_s: float, *, points: int, deadline_s: float, budget_s: float = SWEEP_BUDGET_S,
               min_reps: int = MIN_SWEEP_REPS, max_reps: int = MAX_SWEEP_REPS) -> int:
    """Timed repetitions per point of a sweep of ``points`` points whose one step takes ``step_s``.

    ``budget_s / (points x step_s)``, clamped to [``min_reps``, ``max_reps``], then cut to what
    fits in SWEEP_DEADLINE_SHARE of ``deadline_s`` (at least 1): slow models get the floor, fast
    ones the ceiling, and no sweep outlives its world's deadline.
    """
    if points < 1:
        raise ValueError(f"points={points}: a sweep has at least one point")
    per_rep = max(step_s, 1e-6) * points  # a 0 s step (clock resolution) would divide by zero
    reps = min(max(int(budget_s / per_rep), min_reps), max_reps)
    fits = int(deadline_s * SWEEP_DEADLINE_SHARE / per_rep)
    return max(1, min(reps, fits))

#: Seconds of timed steps one straggler round aims for (faults/checks/straggler.py, target
#: mode), within the sweep's floor and ceiling. What a round measures -- each rank's median
#: compute and wait, the quartiles of a rank's per-step extra compute -- is resolved against
#: the host's scheduling jitter, a few to tens of milliseconds whatever the model: a
#: millisecond step needs the ceiling's 25 steps to see past it, a step of a fifth of a second
#: or more is far past it at the floor's 5. Two seconds gives each its count (25 up to 80 ms
#: a step, 8 at 0.25 s, the floor from 0.4 s); the sweep budget's 10 s over the three rounds
#: a round is sized for gave a 0.43 s step (34 M parameters, 2-core host) 7 steps a round and
#: a 0.1 s step 25: steps that cost the check their time and resolve nothing more.
STRAGGLER_ROUND_S = 2.0


#: The process-group timeout of the fresh world in which eval-equivalence runs the target's
#: ``evaluate`` on N ranks (conformance/checks/eval_equivalence.py): an evaluation on only some
#: ranks leaves the others' next collective waiting, and that collective raises after this long
#: (naming itself) instead of after a deadline's share. Ten seconds, as for the mid-run look: a
#: healthy evaluation's collective waits at most for a peer's forward passes.
EVAL_PG_TIMEOUT_S = 10.0
