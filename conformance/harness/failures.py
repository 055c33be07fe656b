"""What a check returns when the world under it failed: one outcome for every check.

A world call that raised or hung on the target (``RankFailure``, ``WorldHang``) is a finding
about the target, whatever the check was doing: :func:`world_error_outcome` makes it a record
with every rank's story. A rank still compiling at the deadline is a slow compile, not a DDP
hang (``slow_compile_outcome``); a host that ran out of a resource is inconclusive. Naming a
known cause and re-running its remedies is the business of the check that knows the cause
(the equivalence checks: ``conformance/checks/equivalence/diagnosis.py``), called by it on
this outcome.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ddp_conformance.reports.keys import EXHAUSTED

from .exhaustion import exhausted
from .outcome import Outcome
from .parallel import gloo_refusal
from .world import RankFailure, WorldError, WorldHang

#: Frames on a rank's stack that only a compilation in progress has: dynamo converting a frame,
#: inductor generating or building kernels. (Running already compiled code shows neither.)
COMPILING_FRAMES = ("torch/_dynamo/convert_frame.py", "torch/_inductor/")
#: DDP's own error when a parameter got no gradient in the previous iteration, and the sentence
#: torch adds only when find_unused_parameters is off: together, the measurement that names the
#: cause (with the flag on, the same error means an output that no loss uses: another fix).
DDP_UNUSED_ERROR = "Expected to have finished reduction in the prior iteration"
DDP_DETECTION_OFF = "You can enable unused parameter detection"
UNUSED_FIX = ("Make every parameter receive a gradient at every step, or set find_unused_parameters=True in "
              "ddp_kwargs: DDP raised its error for a parameter that got no gradient in the previous step "
              "(the unused-parameters check names which, and measures what find_unused_parameters costs).")


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)', re.MULTILINE)


def _suite_roots() -> tuple[str, ...]:
    """The suite's own packages: ``conformance`` (its built-in targets excepted by the caller),
    ``ddp_conformance`` and the folders its subpackages map from, wherever they are installed."""
    import importlib.util

    # Located, not imported: the harness sits under the fault families (the layer rule).
    found = [importlib.util.find_spec(name) for name in ("ddp_conformance", "ddp_conformance.faults",
                                                         "ddp_conformance.reports")]
    return (str(Path(__file__).resolve().parents[1]),
            *(str(Path(loc).resolve()) for spec in found if spec is not None
              for loc in spec.submodule_search_locations or []))


def suite_raised(traceback: str) -> str | None:
    """Where the suite's own instruments raised (``file:line``), or None.

    The innermost frame that is the suite's or the user's (not the standard library's or an
    installed package's) is the suite's, not a built-in target's, and the user's code is
    further out: the user's code called into torch, and torch into a probe's hook, which raised.
    Also the suite's: the innermost frame is a hook of the suite's that an installed package
    (torch) called. Not the suite's: torch raising under the suite's frame (DDP's constructor refusing
    ``ddp_kwargs``), or the suite calling the user's function with arguments it does not take
    (a TypeError raised at the call, in the suite's frame, with no user frame outside it)."""
    roots = _suite_roots()
    targets = os.path.join(roots[0], "targets") + os.sep
    frames = []  # "suite" | "user" | "installed", outermost first, with each frame's place
    for path, line in _FRAME.findall(traceback):
        where = str(Path(path).resolve())
        if any(where.startswith(root + os.sep) for root in roots) and not where.startswith(targets):
            frames.append(("suite", f"{where}:{line}"))
        elif "site-packages" in where or f"{os.sep}lib{os.sep}python" in where or path.startswith("<"):
            frames.append(("installed", where))
        else:
            frames.append(("user", where))
    inner = len(frames)
    while inner and frames[inner - 1][0] == "suite":
        inner -= 1
    if inner < len(frames) and inner and frames[inner - 1][0] == "installed":
        # A hook of the suite's that torch called back (an optimizer step pre-hook, a gradient
        # hook) raised in the suite's own frames: the suite's, even where no user frame is
        # further out (the suite's default train_step, or a check's own loop, drove the step).
        return frames[-1][1]
    kinds = [frame for frame in frames if frame[0] != "installed"]
    if not kinds or kinds[-1][0] != "suite" or all(kind != "user" for kind, _ in kinds):
        return None
    return kinds[-1][1]


def traceback_excerpt(traceback: str, limit: int = 3000) -> str:
    """A traceback cut to about ``limit`` characters that keeps its innermost frames: the frames'
    tail and the start of the exception's message. The plain tail kept only the message when it
    was long (torch's "Could not run ... with arguments from the 'SparseCPU' backend" lists every
    backend: 10 KB), and the frames that say whose code raised were gone."""
    frames = list(_FRAME.finditer(traceback))
    if len(traceback) <= limit or not frames:
        return traceback[-limit:]
    # The exception's message starts on the first line after the last frame that is not
    # indented (a frame's source line and its ^^^ markers are).
    rest = traceback[frames[-1].end():]
    lines = rest.split("\n")
    at = next((i for i, line in enumerate(lines[1:], 1) if line and not line.startswith(" ")), len(lines))
    head, message = traceback[:frames[-1].end()] + "\n".join(lines[:at]), "\n".join(lines[at:])
    keep = min(len(message), limit // 4)
    cut = message[:keep] + (" [...]" if keep < len(message) else "")
    return head[-(limit - len(cut) - 1):] + "\n" + cut


def _compiling(stack: str) -> bool:
    """True when a frame of ``stack`` runs a compilation: a COMPILING_FRAMES file in a function,
    not in ``<module>`` (that frame is only the file being imported: ``import torch._dynamo``,
    which DDP's constructor does, is not a compile, and a model that never compiles is never
    "still compiling")."""
    for line in stack.replace(os.sep, "/").splitlines():
        if any(marker in line for marker in COMPILING_FRAMES) and not line.rstrip().endswith(" in <module>"):
            return True
    return False


def slow_compile_outcome(exc: WorldHang, what: str) -> Outcome | None:
    """A world call past its deadline while a stuck rank was still compiling: ``inconclusive``
    (a slow compile, not a DDP hang), or None when no stuck rank was compiling.

    A first inductor compile builds C++ kernels; on a loaded CPU host it took 70 s for the
    example's 2 MB MLP, past the default 60 s deadline, which must not read as a hang.
    """
    stacks = {int(rank): text for rank, text in (exc.stacks or {}).items()}
    compiling = [r for r in exc.stuck_ranks if _compiling(stacks.get(r, ""))]
    if not compiling:
        return None
    return Outcome.inconclusive(
        f"{what} did not finish within the deadline ({exc.elapsed_s:.0f} s) while rank(s) "
        f"{compiling} were still compiling (torch.compile frames on their stacks): a slow "
        f"compile, not a DDP hang; raise --deadline (a cold inductor compile can take minutes) "
        f"or check with a faster backend (aot_eager)",
        metrics={"key_figure": f"compiling at the {exc.elapsed_s:.0f} s deadline", "compiling_ranks": compiling},
        evidence={"stacks": {str(k): v[-4000:] for k, v in stacks.items()}})


def hang_outcome(exc: WorldHang, what: str) -> Outcome:
    if (compiling := slow_compile_outcome(exc, what)) is not None:
        return compiling  # still compiling at the deadline: not a hang of DDP
    return Outcome.failed(
        f"{what} hung: ranks {exc.stuck_ranks} did not finish within the deadline",
        metrics={"key_figure": f"hang after {exc.elapsed_s:.1f} s", "stuck_ranks": exc.stuck_ranks},
        evidence={"stacks": {str(k): v[-4000:] for k, v in exc.stacks.items()}},
        recommendation="every rank must run the same collectives: make every parameter take "
                       "part in every step, or see the unused-parameters check")


def world_error_outcome(exc: WorldError, what: str) -> Outcome:
    """A DDP run that raised or hung on the target is a failed check, with every rank's story
    (``what``: the run, as the message names it, e.g. "the DDP training step")."""
    if isinstance(exc, WorldHang):
        return hang_outcome(exc, what)
    assert isinstance(exc, RankFailure)
    errors = {str(r.rank): r.error.describe() for r in exc.results if r.error is not None}
    short = next(filter(None, (exhausted(e) for e in errors.values())), None)
    if short is not None:
        # A full disk or /dev/shm, too few file descriptors: the environment, not the target.
        return Outcome.inconclusive(
            f"{what} could not run: {short}",
            metrics={"key_figure": "the host ran out of a resource", "failed_ranks": exc.failed_ranks},
            evidence={EXHAUSTED: short, "rank_errors": errors})
    traces = {str(r.rank): traceback_excerpt(r.error.traceback) for r in exc.results
              if r.error is not None and r.error.traceback}
    if (refused := gloo_refusal(errors.values())) is not None:
        # The backend, not the target: the same step runs on NCCL (docs/running.md).
        return Outcome.inconclusive(
            f"{what} could not run: {refused} (FSDP2 reduces with ReduceOp.PREMUL_SUM when a "
            f"gradient divide factor other than the world size is set, e.g. "
            f"set_gradient_divide_factor(1.0)); this says nothing about your training step",
            metrics={"key_figure": refused, "failed_ranks": exc.failed_ranks},
            evidence={"backend_refused": refused, "rank_errors": errors, "tracebacks": traces},
            recommendation="run this check with --backend nccl on GPUs, where FSDP2's PREMUL_SUM "
                           "reduce-scatter exists")
    # The culprit is the rank that died or failed first (World orders causes before symptoms):
    # with rank 1 exiting, rank 0's "connection reset by peer" is not the headline.
    culprit = exc.culprit
    first = exc.first_error
    rank = str(first.rank) if first is not None else "?"
    verb = "failed" if culprit is not None and culprit.error and culprit.error.kind == "died" else "raised"
    unused = any(DDP_UNUSED_ERROR in e and DDP_DETECTION_OFF in e for e in errors.values())
    ours = suite_raised(first.error.traceback) if first is not None and first.error is not None else None
    if ours is not None:
        # Not the user's DDP step: the suite's own instruments raised (never blame DDP for it).
        return Outcome.inconclusive(
            f"{what} could not be judged: the suite's own instrumentation raised on rank {rank} "
            f"at {ours}: {exc.headline()} — a ddp-conformance bug, not a finding about your "
            f"training step or DDP",
            metrics={"key_figure": "the suite's instrumentation raised", "failed_ranks": exc.failed_ranks},
            evidence={"rank_errors": errors, "tracebacks": traces, "suite_frame": ours},
            recommendation="report it to ddp-conformance with this record's traceback; the "
                           "other checks' verdicts stand")
    return Outcome.failed(
        f"{what} {verb} on rank {rank}: {exc.headline()}",
        metrics={"key_figure": "DDP step raised", "failed_ranks": exc.failed_ranks},
        evidence={"rank_errors": errors, "tracebacks": traces}, recommendation=UNUSED_FIX if unused else None)


#: What gloo ("Timed out waiting 24000ms for recv operation") and NCCL ("Watchdog caught
#: collective operation timeout") say when a collective waited past the group's timeout.
COLLECTIVE_TIMEOUT = ("timed out waiting", "collective operation timeout", "operation timed out")


def probe_timeout_outcome(exc: WorldError, probe: str) -> Outcome | None:
    """A probe's own collective that timed out on some rank (``probe``: its name in the
    message), as the suite's failure: inconclusive, naming the probe — never a finding about
    the user's code, which the probe only watched
    (docs/architecture.md, "The rank side: probes"). None when no rank's error is such a timeout (a real error stays a finding)."""
    if not isinstance(exc, RankFailure):
        return None
    timed = [r for r in exc.results if r.error is not None
             and any(word in r.error.message.lower() for word in COLLECTIVE_TIMEOUT)]
    if not timed:
        return None
    first = timed[0]
    assert first.error is not None
    return Outcome.inconclusive(
        f"{probe} timed out waiting for a collective on rank {first.rank} ({first.error.message[:200]}): "
        f"the suite's probe could not complete, which is no finding about the target — the "
        f"equivalence checks and hang-detection judge the step's own collectives",
        metrics={"key_figure": f"{probe} timed out", "failed_ranks": exc.failed_ranks},
        evidence={"probe_timeout": probe,
                  "rank_errors": {str(r.rank): r.error.describe() for r in exc.results if r.error is not None}})
