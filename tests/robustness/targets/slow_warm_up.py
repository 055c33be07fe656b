"""FAULT (a module the suite's warm-up imports, issue 18 probe 14): its import takes 2 s, as
``import torch._dynamo`` does on a loaded host. A world that preloads it must not charge that
to the first call's deadline.

    World(1, "gloo", deadline=1.0, preload=("tests.robustness.targets.slow_warm_up",))
"""

from __future__ import annotations

import time

time.sleep(2.0)
