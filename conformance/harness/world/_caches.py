"""Where torch's compile cache goes: into a folder the run removes, never ``$TMPDIR/torchinductor_<user>``.

    env = compile_cache_env(session_tmp)   # {"TORCHINDUCTOR_CACHE_DIR": ".../torchinductor"} or {}

Importing ``torch._dynamo`` (DDP's constructor does, and so does every zygote and persistent
rank's preload) creates inductor's cache folder, ``$TMPDIR/torchinductor_<user>`` unless
``TORCHINDUCTOR_CACHE_DIR`` names another (torch/_inductor/runtime/cache_dir_utils.py), and a
compiled target fills it. A run removes its temp dirs at exit (docs/architecture.md), so
every process of the run that may import it is pointed into one of the run's folders: a world's
ranks into the session's temp dir (``Session.new_world``: one cache for the run's worlds, so a
fresh world finds what an earlier one compiled) or their world's own, a zygote into its private
folder, the child that validates the target into a folder of its own. Inductor's Triton
kernels go below the same folder (``triton_cache_dir``).

A ``TORCHINDUCTOR_CACHE_DIR`` in the user's environment is the user's choice (a warm cache kept
across runs): left as it is, and nothing is set.
"""

from __future__ import annotations

import os

INDUCTOR_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache_env(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The environment that puts inductor's cache below ``folder``; empty when the user's
    environment names one."""
    if _users_choice():
        return {}
    return {INDUCTOR_CACHE_VAR: os.path.join(os.fspath(folder), "torchinductor")}


def _users_choice() -> bool:
    value = os.environ.get(INDUCTOR_CACHE_VAR)
    if not value:
        return False
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # torch writes its default back into os.environ when this process first imports
    # torch._dynamo (cache_dir()): that value is torch's, not a choice of the user's.
    return os.path.abspath(value) != os.path.abspath(default_cache_dir())
