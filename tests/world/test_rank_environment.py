"""Every rank sees the world that torchrun gives (docs/rank-environment.md): the variables
torch's elastic agent sets for a worker, consistent with the rank and its world, in a world of
N and in a world of 1; nothing of a launcher that started the supervisor (torchrun's, Slurm's,
MPI's) and none of the suite's own settings but its containment cookie; MASTER_ADDR and
MASTER_PORT are the world's own rendezvous, which torch's ``env://`` reaches."""

from __future__ import annotations

import os

import pytest

from conformance.harness.world import World, unavailable_reason
from conformance.harness.world._containment import COOKIE_VAR
from conformance.harness.world._launch_env import TORCHRUN_WORKER_VARS, rank_environment, worker_env

from ._env_work import rendezvous_from_env, what_the_rank_sees

DEADLINE_S = 60.0

#: What a launcher may leave in the supervisor's environment: an srun task's, a torchrun
#: worker's (attach mode's rank 0, which starts the 1-rank reference), an mpirun rank's.
LAUNCHER = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
            "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "trainer",
            "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "launcher-job",
            "TORCHELASTIC_RESTART_COUNT": "3", "TORCHELASTIC_ERROR_FILE": "/nonexistent/error.json",
            "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
            "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMI_RANK": "1", "NODE_RANK": "0"}


def _assert_torchrun_worker(seen: list[dict], world_size: int) -> None:
    """Each rank's variables are what torchrun gives worker r of a one-node job of world_size."""
    assert [s["ctx_rank"] for s in seen] == list(range(world_size))
    for r, s in enumerate(seen):
        env = s["env"]
        assert s["rank"] == r and s["world_size"] == world_size  # what dist.* says
        assert {k: env.get(k) for k in ("RANK", "LOCAL_RANK", "ROLE_RANK")} == dict.fromkeys(
            ("RANK", "LOCAL_RANK", "ROLE_RANK"), str(r))
        assert {k: env.get(k) for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE")} == dict.fromkeys(
            ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE"), str(world_size))
        assert (env.get("GROUP_RANK"), env.get("GROUP_WORLD_SIZE"), env.get("ROLE_NAME")) == ("0", "1", "default")
        assert env.get("MASTER_ADDR") == "127.0.0.1" and int(env.get("MASTER_PORT", "0")) > 0
        assert env.get("TORCHELASTIC_RESTART_COUNT") == "0" and env.get("TORCHELASTIC_MAX_RESTARTS") == "0"
        assert env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    # One job: the same rendezvous and run id on every rank.
    assert len({(s["env"]["MASTER_PORT"], s["env"]["TORCHELASTIC_RUN_ID"]) for s in seen}) == 1


def test_every_rank_of_a_two_rank_world_sees_a_torchrun_worker_environment() -> None:
    with World(2, deadline=DEADLINE_S) as world:
        seen = [r.value for r in world.run(what_the_rank_sees)]
        _assert_torchrun_worker(seen, 2)
        # MASTER_ADDR:MASTER_PORT is the world's rendezvous: torch's env:// reaches it, as the
        # user's code would to build a store or a second process group.
        answers = [r.value for r in world.run(rendezvous_from_env)]
    assert [(rank, size) for rank, size, _ in answers] == [(0, 2), (1, 2)]
    assert answers[0][2] == answers[1][2] and len(set(answers[0][2])) == 2


def test_a_one_rank_world_under_a_launcher_is_a_one_process_job(monkeypatch: pytest.MonkeyPatch) -> None:
    # The supervisor is rank 1 of a launched job of 2 (attach mode's rank 0 starts its
    # reference this way; an srun task runs the CLI this way): the reference's rank must see a
    # 1-process torchrun job, not the launcher's world, and none of the suite's settings.
    for name, value in {**LAUNCHER, "DDP_CONFORMANCE_SHM": "off"}.items():
        monkeypatch.setenv(name, value)
    with World(1, deadline=DEADLINE_S) as world:
        seen = [r.value for r in world.run(what_the_rank_sees)]
        _assert_torchrun_worker(seen, 1)
        env = seen[0]["env"]
        assert env["TORCHELASTIC_RUN_ID"] != "launcher-job"
        leaked = sorted(k for k in env if k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_ERROR"))
                        or k == "NODE_RANK")
        assert leaked == []
        assert sorted(k for k in env if k.startswith("DDP_CONFORMANCE_")) == [COOKIE_VAR]
        assert [r.value[:2] for r in world.run(rendezvous_from_env)] == [(0, 1)]
    assert os.environ["WORLD_SIZE"] == "2"  # the supervisor's own environment is untouched


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"no private network: {unavailable_reason()}")
def test_a_private_network_world_names_its_own_rendezvous() -> None:
    # The supervisor's store is out of reach from the namespace: MASTER_ADDR:MASTER_PORT is a
    # store rank 0 serves on the namespace's own loopback.
    with World(2, deadline=DEADLINE_S, private_network=True) as world:
        seen = [r.value for r in world.run(what_the_rank_sees)]
        _assert_torchrun_worker(seen, 2)
        answers = [r.value for r in world.run(rendezvous_from_env)]
    assert [(rank, size) for rank, size, _ in answers] == [(0, 2), (1, 2)]
    assert answers[0][2] == answers[1][2]


def test_a_rank_environment_is_a_torchrun_workers_over_what_is_left_of_the_supervisors() -> None:
    worker = worker_env(1, 2, master_addr="127.0.0.1", master_port=4242, run_id="job")
    assert set(worker) == set(TORCHRUN_WORKER_VARS)
    inherited = {**LAUNCHER, "PATH": "/bin", "DDP_CONFORMANCE_SHM": "off", COOKIE_VAR: "theirs"}
    env = rank_environment(inherited, {"GLOO_SOCKET_IFNAME": "lo", "WORLD_SIZE": "7"}, worker)
    assert env == {"PATH": "/bin", "GLOO_SOCKET_IFNAME": "lo", **worker}  # the worker's win
    assert env["WORLD_SIZE"] == "2" and env["MASTER_PORT"] == "4242"


def test_a_rank_outside_its_world_is_refused_with_the_rule() -> None:
    with pytest.raises(ValueError, match=r"rank=2 is outside a world of 2; pass 0 <= rank < world_size"):
        worker_env(2, 2, master_addr="127.0.0.1", master_port=1, run_id="job")


def test_the_variables_are_the_ones_this_torchs_elastic_agent_sets() -> None:
    # Read from torch's own agent, so a torch upgrade that adds a worker variable fails here.
    import inspect
    import re

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    source = inspect.getsource(LocalElasticAgent._start_workers)
    block = source[source.index("worker_env = {"):source.index("}", source.index("worker_env = {"))]
    agent = set(re.findall(r'"([A-Z_]+)":', block)) | {"LOCAL_RANK"}  # _set_local_rank_env
    # TORCH_NCCL_ASYNC_ERROR_HANDLING is left as the user has it (docs/rank-environment.md).
    assert agent - {"TORCH_NCCL_ASYNC_ERROR_HANDLING"} == set(TORCHRUN_WORKER_VARS)
