"""The environment a rank sees: a torchrun worker's, for the world the rank is in.

Production code reads its launcher's variables (``loss * int(os.environ["WORLD_SIZE"])``, a
module-level ``LOCAL_RANK``, ``if "SLURM_PROCID" in os.environ``). A rank that lacks them, or
inherits another world's, runs a different program from the one torchrun runs: the N ranks
would see ×1 where production sees ×N, or a 1-rank reference would see the launcher's ×N too,
and a bug that scales by the world size would compare equal on both sides. So every rank of
every world the suite starts gets exactly what torch's elastic agent gives a worker
(``LocalElasticAgent._start_workers`` in ``torch/distributed/elastic/agent/server/
local_elastic_agent.py``), for its own rank and world; whatever another launcher left in the
supervisor's environment (torchrun's, Slurm's, MPI's) is cleared first, and so are the suite's
own ``DDP_CONFORMANCE_*`` settings (the supervisor's business) except the containment cookie.
docs/rank-environment.md lists what each side sees.

No torch here: the supervisor builds each rank's environment (``world_environments``), the
rank applies it to its own before any of the user's code runs (``apply_environment``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, MutableMapping

from ._containment import COOKIE_VAR

#: What ``LocalElasticAgent._start_workers`` sets for every worker (torch 2.13), in its order.
#: ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (torchrun: "1" unless set) is left as the user has it:
#: "1" makes NCCL's watchdog abort a rank whose collective timed out, so a rank blocked on a
#: dead peer would die instead of raising, and the supervisor would name it as a culprit.
TORCHRUN_WORKER_VARS = ("RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                        "TORCHELASTIC_USE_AGENT_STORE", "LOCAL_RANK")
#: A launcher's variables by name: torchrun's, and the node rank Lightning and torchrun's
#: ``--node-rank`` users export.
LAUNCHER_NAMES = frozenset({*TORCHRUN_WORKER_VARS, "NODE_RANK"})
#: ... and by family: torchelastic's (error file, timer, health check), Slurm's task layout
#: (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``...), Open MPI's,
#: PMI's and MVAPICH's ranks. A world the suite starts is none of these jobs.
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_", "MV2_COMM_WORLD_")
#: The suite's own settings (DDP_CONFORMANCE_SHM, _START, _PROGRESS_S...) are read by the
#: supervisor only; a rank keeps none of them, so a target sees as little of the suite as it can.
SUITE_PREFIX = "DDP_CONFORMANCE_"
#: torchrun's default role name (``--role``).
ROLE = "default"
#: Where a describing child (the target imported before any world exists) is told the rendezvous
#: would be: torchrun's default ``--master-addr``/``--master-port``; nothing listens there.
UNSTARTED_MASTER = ("127.0.0.1", 29500)


def new_run_id() -> str:
    """A world's TORCHELASTIC_RUN_ID: as ``torchrun --standalone``, a fresh uuid per job."""
    return str(uuid.uuid4())


def worker_env(rank: int, world_size: int, *, master_addr: str, master_port: int | None,
               run_id: str, use_agent_store: bool = True) -> dict[str, str]:
    """What torchrun's agent sets for worker ``rank`` of a one-node job of ``world_size``
    workers whose rendezvous store is at ``master_addr:master_port``.

    ``use_agent_store``: the store is served by someone other than rank 0's worker (the
    suite's supervisor, as torchrun's agent serves its own), so torch's ``env://`` rendezvous
    connects to it as a client instead of trying to serve it on a port already taken.
    ``master_port`` None: the rank learns it when its world's rendezvous exists (a private
    network's, which rank 0 serves inside the namespace: ``_rank.py``).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is outside a world of {world_size}; pass 0 <= rank < world_size")
    env = {
        "RANK": str(rank),
        "GROUP_RANK": "0",  # one node: the suite's local worlds are one worker group
        "ROLE_RANK": str(rank),
        "ROLE_NAME": ROLE,
        "LOCAL_WORLD_SIZE": str(world_size),
        "WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        # A persistent world replaced after a failure is not the user's job restarting: its
        # code must not take a checkpoint-resume path it would not take in the first world.
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(use_agent_store),
        "LOCAL_RANK": str(rank),
    }
    if master_port is not None:
        env["MASTER_PORT"] = str(master_port)
    return env


def world_environments(inherited: Mapping[str, str], settings: Mapping[str, str], *, world_size: int,
                       master_addr: str, master_port: int | None) -> list[dict[str, str]]:
    """Every rank's whole environment for one world (``rank_environment``), one job: one run id."""
    run_id = new_run_id()
    return [rank_environment(inherited, settings, worker_env(r, world_size, master_addr=master_addr,
                                                             master_port=master_port, run_id=run_id))
            for r in range(world_size)]


def describing_environment(inherited: Mapping[str, str], world_size: int) -> dict[str, str]:
    """What a child that imports the target to describe it sees: rank 0's variables of the
    run's world, before that world's rendezvous exists (torchrun's default address and port,
    where nothing listens), so module-level code that reads WORLD_SIZE or LOCAL_RANK loads
    there as it loads on the ranks."""
    addr, port = UNSTARTED_MASTER
    return rank_environment(inherited, {}, worker_env(0, world_size, master_addr=addr, master_port=port,
                                                      run_id=new_run_id()))


def is_cleared(name: str) -> bool:
    """Whether a rank drops ``name`` from what it inherits: a launcher's or the suite's own."""
    if name == COOKIE_VAR:
        return False  # containment: every process of a world carries it (_containment.py)
    return name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES) or name.startswith(SUITE_PREFIX)


def rank_environment(inherited: Mapping[str, str], settings: Mapping[str, str],
                     worker: Mapping[str, str]) -> dict[str, str]:
    """A rank's whole environment: what it ``inherited`` (the supervisor's) less every launcher
    and suite variable, then the world's ``settings`` (GLOO_SOCKET_IFNAME, TORCH_DISTRIBUTED_DEBUG,
    a test hook), then its ``worker`` variables, which nothing overrides. The cookie is not
    in it: each process is given its own world's (``World``, ``_zygote.adopt``)."""
    kept = {k: v for k, v in inherited.items() if not is_cleared(k) and k != COOKIE_VAR}
    return {**kept, **{k: v for k, v in settings.items() if k != COOKIE_VAR}, **worker}


def apply_environment(environ: MutableMapping[str, str], env: Mapping[str, str]) -> None:
    """Give ``environ`` (``os.environ``: each change reaches the C environment torch reads)
    ``env``'s values, and no launcher or suite variable that ``env`` lacks.

    Not a wholesale replacement: a forked rank's environment is its zygote's, whose imports
    may have set variables (``torch._dynamo`` sets TORCHINDUCTOR_CACHE_DIR) that a spawned rank
    sets again in its own imports; removing them would make the two kinds of rank differ. The
    cookie this process already carries is kept."""
    for name in [k for k in environ if k not in env and is_cleared(k)]:
        del environ[name]
    environ.update({k: v for k, v in env.items() if k != COOKIE_VAR})
