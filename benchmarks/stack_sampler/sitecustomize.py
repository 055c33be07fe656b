"""benchmarks/model_scale.py --work: a stack sampler in every rank process, for the training
share of a check's time (``work_share.py`` reads what it writes).

Python imports ``sitecustomize`` at start-up from the first directory of ``sys.path`` that has
one; model_scale.py puts this directory on the ``PYTHONPATH`` of the worlds it starts when
``DDP_CONFORMANCE_SAMPLE_DIR`` is set (it shadows any other ``sitecustomize`` of the
interpreter for those processes). CPU ranks are forked from zygotes: the sampler starts in the child
after a fork, never in the zygote itself (spawned GPU ranks are not sampled). Every 5 ms a
daemon thread reads the main thread's stack and adds the time since its last look to that stack,
so a look delayed by a long operation still counts the time it took; every second it rewrites
``<dir>/<pid>.txt`` with one line per stack: microseconds, then ``file.py:function`` frames from
the outermost. Nothing else of the process is touched.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

_DIR = os.environ.get("DDP_CONFORMANCE_SAMPLE_DIR")
PERIOD_S, FLUSH_S = 0.005, 1.0


def _stack(frame: object) -> str:
    names = []
    while frame is not None:
        code = frame.f_code  # type: ignore[attr-defined]
        names.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
        frame = frame.f_back  # type: ignore[attr-defined]
    return ";".join(reversed(names))


def _sample(out: str) -> None:
    main, pid = threading.main_thread().ident, os.getpid()
    micros: collections.Counter[str] = collections.Counter()
    last = flushed = time.monotonic()
    while True:
        time.sleep(PERIOD_S)
        now = time.monotonic()
        frame = sys._current_frames().get(main or 0)
        if frame is not None:
            micros[_stack(frame)] += int((now - last) * 1e6)
        # Not held over the sleep: a frame keeps its locals (a step's tensors) alive, which
        # would raise the process's memory peak that the same run measures.
        frame = None
        last = now
        if now - flushed >= FLUSH_S:
            flushed = now
            part = os.path.join(out, f"{pid}.txt.part")
            with open(part, "w") as fh:
                fh.writelines(f"{n} {s}\n" for s, n in micros.items())
            os.replace(part, os.path.join(out, f"{pid}.txt"))  # a reader never sees half a file


def start() -> None:
    if _DIR and os.path.isdir(_DIR):
        threading.Thread(target=_sample, args=(_DIR,), name="stack-sampler", daemon=True).start()


if _DIR:
    # After a fork only: the zygotes, exec'd with this environment, stay single-threaded (they
    # fork every CPU rank), and the supervisor sets the variable after its own start-up.
    os.register_at_fork(after_in_child=start)
