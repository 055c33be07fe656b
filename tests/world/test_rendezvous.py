"""A rank that reaches the rendezvous late is not a failed start (a loaded machine, issue 24).

A chaos world's process-group timeout is seconds on purpose (it bounds collectives), and gloo's
connect used to wait only that long for a peer's address: a peer still importing torch on a busy
runner failed the world's start with "wait timeout after 3200ms". The ranks now meet on the
store first (``_rank.arrive``), bounded by the supervisor's start clock instead.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from pathlib import Path
from typing import Any

from conformance.harness.world import loopback_interface
from conformance.harness.world._rank import RankConfig, _init_process_group

PG_TIMEOUT_S = 1.0
LATE_S = 3.0  # rank 1 arrives three process-group timeouts after rank 0


def _late_rank(rank: int, port: int, tmpdir: str, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
    if rank == 1:
        time.sleep(LATE_S)
    cfg = RankConfig(rank=rank, world_size=2, backend="gloo", store_host="127.0.0.1", store_port=port,
                     store_prefix="g0", tmpdir=tmpdir, generation=0, pg_timeout_s=PG_TIMEOUT_S,
                     device_index=None, env={}, threads=1, parent_pid=os.getppid())
    try:
        _init_process_group(cfg)
        value = torch.ones(1) * (rank + 1)
        dist.all_reduce(value)
        out.put((rank, float(value)))
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the test reads what failed
        out.put((rank, f"{type(exc).__name__}: {exc}"))


def test_a_rank_late_by_three_pg_timeouts_still_joins(tmp_path: Path) -> None:
    import torch.distributed as dist

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          master_listen_fd=listener.fileno())
    listener.detach()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_late_rank, args=(r, port, str(tmp_path), out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=90) for _ in procs)  # the test's own deadline
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        del store
    # Without the rendezvous on the store, rank 0 fails: "wait timeout after ...ms".
    assert results == {0: 3.0, 1: 3.0}, results
