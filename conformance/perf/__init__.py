"""The perf checks: one entry module per check id, named after it (``allreduce_bandwidth`` for
``allreduce-bandwidth``, ``scaling_cliff`` for ``scaling-cliff``; see
conformance.harness.registry), beside what they stand on:

- ``maths/``: pure models both checks fit and simulate (nccl-tests bus bandwidth, the ring
  all-reduce's alpha-beta fit, the bucketed overlapped DDP step and its scaling projection);
- ``measure/``: rank-side work functions both checks run (the exact all-reduce sweep, each
  gradient's readiness in backward, DDP steps with DDP's own overlap accounting), module-level
  so a World pickles them by reference;
- ``cliff/``: the scaling-cliff engine (a DDP step behind a shaped link, held to the simulator:
  the link model, the knee, the rank side, the bucket layout re-run, the ``--link-gbps``
  projection).

allreduce-bandwidth runs on ``maths`` and ``measure`` alone; ``cliff`` builds on both. Entries
import the faces of these packages, never each other."""
