"""node-health's judges without a world: the comparison's naming rules, what explains a
disagreement before any rank is blamed (software, determinism, different work), and the
injected-fault judge fed wrong diagnoses (as ``test_judges.py`` does for every chaos judge)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ddp_conformance.faults import Injection
from ddp_conformance.faults.checks.node_health import judge, judge_injected, locate
from ddp_conformance.faults.corruption import BitFlip, CorruptAllReduce

NAMES = ["input", "output:0", "loss", "grad:0.weight"]
CLEAN = ["d0", "d1", "d2", "d3"]


def _rank(digests: list[list[str]], *, threads: int = 1, located: list[Any] | None = None) -> dict[str, Any]:
    return {"fingerprint": {"torch": "2.13", "cuda": None, "threads": threads, "env": {}}, "hostname": "h",
            "device": "cpu", "not_deterministic": None, "injections": [],
            "repeats": [{"digests": d, "names": NAMES if i == 0 else None,
                         "located": None if located is None else located[i]} for i, d in enumerate(digests)],
            "buckets": {"count": 1, "parameters": {0: ["0.weight"]}, "located": None}}


def _world(per_rank: list[list[list[str]]], **kw: Any) -> list[dict[str, Any]]:
    """Every rank's data as node_rank returns it, the comparison computed as the ranks do."""
    repeats = len(per_rank[0])
    located = []
    for i in range(repeats):
        found = locate([r[i] for r in per_rank], NAMES)
        located.append(None if found is None else found.to_json())
    threads = kw.get("threads", [1] * len(per_rank))
    return [_rank(d, threads=threads[r], located=located) for r, d in enumerate(per_rank)]


FLIPPED = ["d0", "X1", "X2", "X3"]


def test_majority_names_the_departing_rank_and_its_first_tensor() -> None:
    found = locate([CLEAN, CLEAN, ["d0", "d1", "d2", "X"], CLEAN], NAMES)
    assert found is not None and found.ranks == (2,) and found.tensor == "grad:0.weight" and found.how == "majority"
    assert locate([CLEAN, CLEAN, CLEAN], NAMES) is None


def test_no_majority_and_pair_name_a_set() -> None:
    found = locate([CLEAN, FLIPPED], NAMES)
    assert found is not None and found.ranks == (0, 1) and found.how == "pair" and found.tensor == "output:0"
    found = locate([CLEAN, FLIPPED, ["d0", "Y1", "d2", "d3"]], NAMES)
    assert found is not None and found.ranks == (0, 1, 2) and found.how == "no-majority"


def test_persistent_and_transient_are_told_apart() -> None:
    persistent = judge(_world([[CLEAN] * 3, [CLEAN] * 3, [FLIPPED] * 3]))
    assert persistent.status == "failed" and "in every repeat (persistent: drain it)" in persistent.message
    transient = judge(_world([[CLEAN] * 3, [CLEAN] * 3, [CLEAN, FLIPPED, CLEAN]]))
    assert transient.status == "failed"
    assert "in 1 of 3 repeats (repeat 1: transient): first at output:0" in transient.message


def test_a_software_mismatch_explains_a_disagreement_instead_of_a_fault() -> None:
    outcome = judge(_world([[CLEAN] * 3, [CLEAN] * 3, [FLIPPED] * 3], threads=[1, 1, 2]))
    assert outcome.status == "inconclusive"
    assert outcome.message.startswith("software differs across ranks: threads (1 on ranks [0, 1]; 2 on ranks [2])")
    assert "without any fault" in outcome.message
    # The same mismatch without a disagreement: healthy, the mismatch said.
    agreed = judge(_world([[CLEAN] * 3] * 3, threads=[1, 1, 2]))
    assert agreed.status == "passed" and "note: software differs across ranks: threads" in agreed.message


def test_nondeterministic_work_and_a_refused_op_are_inconclusive_never_a_fault() -> None:
    changing = judge(_world([[CLEAN, FLIPPED], [FLIPPED, CLEAN], [["d0", "Z", "Z", "Z"], CLEAN]]))
    assert changing.status == "inconclusive" and "not deterministic here" in changing.message
    refused = _world([[CLEAN]] * 3)
    refused[1]["not_deterministic"] = "index_add_cuda_ does not have a deterministic implementation"
    outcome = judge(refused)
    assert outcome.status == "inconclusive"
    assert outcome.message.startswith("bitwise agreement cannot hold here: index_add_cuda_")


def test_a_pair_that_disagrees_where_the_loss_calls_collectives_is_inconclusive_a_majority_still_named() -> None:
    pair = _world([[CLEAN] * 2, [FLIPPED] * 2])
    for r in pair:
        r["forward_collectives"] = ["all_gather"]
    outcome = judge(pair)
    assert outcome.status == "inconclusive"
    assert outcome.message.startswith("ranks [0, 1] disagree bitwise (first at output:0), and the target's forward "
                                      "or loss calls all_gather: its results mix the ranks' data")
    three = _world([[CLEAN] * 2, [CLEAN] * 2, [FLIPPED] * 2])
    for r in three:
        r["forward_collectives"] = ["all_gather_into_tensor"]  # SyncBatchNorm's
    assert judge(three).status == "failed" and judge(three).metrics["culprit_rank"] == 2


def test_different_work_on_the_ranks_is_not_a_node_fault() -> None:
    found = locate([CLEAN, CLEAN, CLEAN[:3]], [NAMES, NAMES, NAMES[:2] + ["grad:other"]])
    assert found is not None and found.how == "structure"
    data = _world([[CLEAN]] * 3)
    for r in data:
        r["repeats"][0]["located"] = found.to_json()
    outcome = judge(data)
    assert outcome.status == "inconclusive" and "did not run the same work" in outcome.message



def test_a_forward_that_reads_its_rank_is_not_a_node_fault() -> None:
    """Two ranks that disagree every time: a pair to drain, unless the forward asked for its
    rank (MoCo's shuffle BN takes its rank's share): then other work by design, inconclusive."""
    data = _world([[CLEAN] * 2, [FLIPPED] * 2])
    assert judge(data).status == "failed"
    data[1]["reads_rank"] = ["builder.py:107 in _batch_shuffle_ddp"]
    outcome = judge(data)
    assert outcome.status == "inconclusive", outcome.message
    assert outcome.message.startswith("the target's forward reads its rank (torch.distributed.get_rank() at "
                                      "builder.py:107 in _batch_shuffle_ddp)")
    assert "they part at output:0" in outcome.message and "not a node fault" in outcome.message
    assert "--checks node-health" in (outcome.recommendation or "")

# -- the injected-fault judge ---------------------------------------------------------------------

FLIP = BitFlip(rank=2, tensor="output:0", bit="mantissa", steps=(1,))


def _fired(fault: Any) -> list[Injection]:
    return [Injection(fault.name, fault.rank, 1, "forward", 0.0, 0.0, {})]


def _right() -> Any:
    return judge(_world([[CLEAN] * 3, [CLEAN] * 3, [CLEAN, FLIPPED, CLEAN]]))


def test_the_injected_judge_passes_the_right_diagnosis() -> None:
    verdict = judge_injected(FLIP, _right(), _fired(FLIP), world_size=3, repeats=3)
    assert verdict.status == "passed", verdict.message


@pytest.mark.parametrize("change, said", [
    (lambda d: {**d, "ranks": [1]}, "named ranks [1], injected on rank 2"),
    (lambda d: {**d, "tensor": "output:2"}, "located at output:2, injected at output:0"),
    (lambda d: {**d, "repeats": {"2": [0, 1, 2]}}, "differed in repeats [0, 1, 2], injected in [1]"),
    (lambda d: {**d, "persistent": True}, "called persistent, injected in repeats [1]"),
    (lambda d: {**d, "how": "pair"}, "named by pair, expected majority"),
])
def test_the_injected_judge_fails_a_wrong_diagnosis(change: Any, said: str) -> None:
    right = _right()
    wrong = dataclasses.replace(right, metrics={**right.metrics, "diagnosis": change(right.metrics["diagnosis"])})
    verdict = judge_injected(FLIP, wrong, _fired(FLIP), world_size=3, repeats=3)
    assert verdict.status == "failed" and said in verdict.message


def test_the_injected_judge_fails_a_fault_that_never_fired_or_a_clean_verdict() -> None:
    verdict = judge_injected(FLIP, _right(), [], world_size=3, repeats=3)
    assert verdict.status == "failed" and "never fired" in verdict.message
    clean = judge(_world([[CLEAN] * 3] * 3))
    verdict = judge_injected(FLIP, clean, _fired(FLIP), world_size=3, repeats=3)
    assert verdict.status == "failed" and "the check said passed, not failed" in verdict.message
    bucket = CorruptAllReduce(rank=1, bucket=2)
    verdict = judge_injected(bucket, _right(), _fired(bucket), world_size=3, repeats=3)
    assert verdict.status == "failed" and "located at output:0, injected at bucket:2" in verdict.message


def test_fault_arguments_are_checked_at_the_edge() -> None:
    with pytest.raises(ValueError, match=r"tensor='fc1' is not '<kind>:<name>' with kind in output, grad"):
        BitFlip(rank=0, tensor="fc1")
    with pytest.raises(ValueError, match=r"bit='middle' is not one of mantissa, exponent, sign"):
        BitFlip(rank=0, tensor="output:fc1", bit="middle")
    assert BitFlip(rank=1, tensor="grad:w", steps=[2]).fires(1, 2, "backward")
    assert not BitFlip(rank=1, tensor="grad:w", steps=[2]).fires(1, 2, "forward")


# -- throughput and links -------------------------------------------------------------------------

def _link(pair: list[int], seconds: list[float], wrong: int = 0) -> dict[str, Any]:
    return {"pair": pair, "sizes": [4 << 20], "times": [seconds], "wrong": [wrong]}


def _timed(timing: dict[int, list[float]], links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    data = _world([[CLEAN]] * len(timing))
    for rank, r in enumerate(data):
        r["timing"] = timing[rank]
        r["links"] = [link for link in links if rank == link["pair"][0]]
    return data


FAST = [0.010, 0.011, 0.010, 0.012, 0.010]
RING = [[0, 1], [1, 2], [0, 3], [2, 3]]


def test_a_rank_slower_in_every_step_is_named_and_one_slower_sometimes_is_noise() -> None:
    slow = judge(_timed({0: FAST, 1: FAST, 2: [t * 6 for t in FAST], 3: FAST}, []))
    assert slow.status == "failed" and slow.message.startswith("rank 2 (h, cpu) runs the same work x6.00 slower")
    assert slow.metrics["culprit_rank"] == 2
    sometimes = {0: FAST, 1: FAST, 2: [0.09, 0.009, 0.09, 0.009, 0.09], 3: FAST}
    assert judge(_timed({0: FAST, 1: FAST, 2: [t * 2 for t in FAST], 3: FAST}, [])).status == "passed"  # shared cores
    # A GPU rank slow in some repeats: the host's noise cannot be told from its device.
    on_gpus = _timed(sometimes, [])
    for rank, r in enumerate(on_gpus):
        r["device"] = f"cuda:{rank}"
    noisy = judge(on_gpus)
    assert noisy.status == "inconclusive" and noisy.message.startswith("slower ranks (rank 2 x")
    # CPU ranks share the host's cores and have no device to drain: a busy host's noise is said
    # in the pass, never an inconclusive node (a user's first run on a busy machine).
    shared = judge(_timed(sometimes, []))
    assert shared.status == "passed", shared.message
    assert "rank 2 x" in shared.message and "slower in some repeats only: the shared host's noise, not judged" \
        in shared.message


def test_a_slow_link_and_a_corrupting_link_are_named_by_their_pair() -> None:
    links = [_link(p, [0.004] * 5) for p in RING[:3]] + [_link(RING[3], [0.080] * 5)]
    outcome = judge(_timed({r: FAST for r in range(4)}, links))
    assert outcome.status == "failed"
    assert outcome.message.startswith("the link between ranks [2, 3] (within a host) reaches 0.05 GB/s at best, x0.05")
    # A pair at 0.3 of the others: the busy loopback of CPU ranks (passed), a slow link between GPUs.
    links = [_link(p, [0.004] * 5) for p in RING[:3]] + [_link(RING[3], [0.013] * 5)]
    assert judge(_timed({r: FAST for r in range(4)}, links)).status == "passed"
    gpus = _timed({r: FAST for r in range(4)}, links)
    for rank, r in enumerate(gpus):
        r["device"] = f"cuda:{rank}"
    assert judge(gpus).status == "failed"
    # Across hosts is compared with across hosts only: the slower inter-node pairs are not named
    # against the fast pairs within each host (two hosts of 3 GPUs, a ring of 6).
    two_hosts = _timed({r: FAST for r in range(6)}, [])
    ring = [_link([0, 1], [0.004] * 5), _link([1, 2], [0.004] * 5), _link([3, 4], [0.004] * 5),
            _link([4, 5], [0.004] * 5), _link([2, 3], [0.013] * 5), _link([0, 5], [0.013] * 5)]
    for rank, r in enumerate(two_hosts):
        r.update(device=f"cuda:{rank % 3}", hostname="a" if rank < 3 else "b",
                 links=[link for link in ring if rank == link["pair"][0]])
    assert judge(two_hosts).status == "passed", judge(two_hosts).message
    links = [_link(p, [0.004] * 5) for p in RING[:3]] + [_link(RING[3], [0.004] * 5, wrong=2)]
    outcome = judge(_timed({r: FAST for r in range(4)}, links))
    assert outcome.status == "failed"
    assert outcome.message == "all-reduce results wrong on the link between ranks [2, 3] (2 wrong): corruption on that link"
    healthy = judge(_timed({r: FAST for r in range(4)}, [_link(p, [0.004] * 5) for p in RING]))
    assert healthy.status == "passed" and "4 ring link(s) 1.05-1.05 GB/s" in healthy.message


def test_with_a_device_per_rank_a_quarter_slower_in_every_step_is_named() -> None:
    data = _timed({0: FAST, 1: FAST, 2: [t * 1.5 for t in FAST], 3: FAST}, [])
    for rank, r in enumerate(data):
        r["device"] = f"cuda:{rank}"
    outcome = judge(data)
    assert outcome.status == "failed" and outcome.message.startswith("rank 2 (h, cuda:2) runs the same work x1.50")


def test_both_digests_catch_every_single_flip_and_keep_equal_tensors_equal() -> None:
    import torch

    from conformance.harness.digest import digest, weighted_sum
    from ddp_conformance.faults.corruption import flipped

    x = torch.randn(257)
    for bit in ("mantissa", "exponent", "sign", 13):
        for element in (0, 128, 256):
            y = flipped(x, element, bit)[0]
            assert digest(y) != digest(x) and weighted_sum(y) != weighted_sum(x)
    assert digest(x.clone()) == digest(x) and weighted_sum(x.clone()) == weighted_sum(x)
    # Order-sensitive: the same values in another order differ (an XOR or a plain sum would not).
    assert digest(x.flip(0)) != digest(x) and weighted_sum(x.flip(0)) != weighted_sum(x)


def test_a_sparse_gradient_is_digested_as_stored_and_differences_compare_densely() -> None:
    import torch

    from conformance.harness.digest import digest
    from ddp_conformance.faults.checks.node_health.digests import difference

    # EmbeddingBag(sparse=True)'s gradient: COO, an index repeated (uncoalesced).
    def grad(values: torch.Tensor, rows: list[int]) -> torch.Tensor:
        return torch.sparse_coo_tensor(torch.tensor([rows]), values, (10, 3))

    values = torch.randn(3, 3)
    x = grad(values, [4, 1, 4])
    assert digest(grad(values.clone(), [4, 1, 4])) == digest(x)
    flipped_value = values.clone()
    flipped_value[1, 1] = torch.nextafter(flipped_value[1, 1], torch.tensor(9.0))  # row 1: not summed with another
    assert digest(grad(flipped_value, [4, 1, 4])) != digest(x)
    assert digest(grad(values, [4, 1, 5])) != digest(x)  # another row
    diff = difference([x, grad(flipped_value, [4, 1, 4])], 0)
    assert diff[1]["elements"] == 1 and 0 < diff[1]["max_abs_diff"] < 1e-5


def test_the_cpu_digest_catches_flips_that_cancel_in_its_word_sum_and_covers_a_short_tail() -> None:
    import torch

    from conformance.harness.digest import _word_sum, digest

    x = torch.zeros(5, dtype=torch.float32)  # 20 bytes: two 64-bit words and a 4-byte tail
    y = x.clone()
    words = y.view(torch.int32)
    words[0], words[2] = 1, -1  # word 0 is 1, word 1 is 0xFFFFFFFF (its low half all ones)
    data = memoryview(y.view(torch.uint8).numpy())
    assert _word_sum(memoryview(x.view(torch.uint8).numpy())) == 0
    assert _word_sum(data) == (1 + 0xFFFFFFFF) & (2**64 - 1)  # the words' sum, wrapping
    z = x.clone()
    z.view(torch.int32)[4] = 7  # only the tail changes
    assert _word_sum(memoryview(z.view(torch.uint8).numpy())) == 7
    # Two changes whose words sum to zero: the sum cannot see them; the CRC-32 does.
    w = x.clone()
    pairs = w[:4].view(torch.int64)  # the two whole words
    pairs[0], pairs[1] = 5, -5
    assert _word_sum(memoryview(w.view(torch.uint8).numpy())) == 0 and digest(w) != digest(x)


def test_corruption_acts_only_at_its_labelled_tensor_site_where_its_schedule_fires() -> None:
    import torch

    from ddp_conformance.faults import PHASES, SITE_KINDS, Site

    def sites(label: str) -> list[Site]:
        return [Site(kind, rank, step, phase, label=label, tensor=torch.ones(8))
                for kind in SITE_KINDS for rank in (0, 1) for step in (0, 1) for phase in PHASES]

    flip = BitFlip(rank=1, tensor="grad:w", bit="exponent", steps=(1,))
    fired = [(s.kind, s.rank, s.step, s.phase) for s in sites("grad:w") if flip.inject(s)]
    assert fired == [("tensor", 1, 1, "backward")]
    assert not any(flip.inject(s) for s in sites("grad:v"))  # another tensor: untouched
    site = Site("tensor", 1, 1, "backward", label="grad:w", tensor=torch.ones(8))
    assert flip.inject(site) and site.tensor[0].item() == 0.5 and site.tensor[1:].eq(1).all()
    assert site.log.items[0].data["value_changed"] is True and site.log.items[0].data["before"] == 1.0
    bucket = CorruptAllReduce(rank=0, bucket=3)
    fired = [(s.kind, s.rank, s.step, s.phase) for s in sites("bucket:3") if bucket.inject(s)]
    assert fired == [("tensor", 0, 0, "backward"), ("tensor", 0, 1, "backward")]


def test_the_device_digest_is_the_same_in_chunks_as_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from conformance.harness import digest as digests

    x = torch.randn(1000)
    whole = digests.weighted_sum(x)
    monkeypatch.setattr(digests, "CHUNK", 7)  # the sums wrap mod 2**64 alike, chunk by chunk
    assert digests.weighted_sum(x) == whole


# -- the all-reduced buckets, repeat by repeat ----------------------------------------------------

BUCKETS = ["b0", "b1"]


def _reduced(per_rank: list[list[list[str]]]) -> list[dict[str, Any]]:
    """Every rank's data with agreeing compute and, per repeat, each rank's bucket digests
    compared as the ranks compare them."""
    data = _world([[CLEAN] * len(per_rank[0])] * len(per_rank))
    for i in range(len(per_rank[0])):
        found = locate([r[i] for r in per_rank], ["bucket:0", "bucket:1"])
        for r in data:
            r["repeats"][i]["buckets"] = None if found is None else found.to_json()
    return data


ONCE = CorruptAllReduce(rank=1, bucket=0, steps=(1,))


def test_a_bucket_corrupted_every_repeat_or_once_is_persistent_or_transient() -> None:
    wrong = ["X", "b1"]
    persistent = judge(_reduced([[BUCKETS] * 3, [wrong] * 3, [BUCKETS] * 3]))
    assert persistent.status == "failed" and persistent.message.startswith(
        "all-reduced bucket 0 (parameters 0.weight) differs on rank 1 after the all-reduce in every repeat "
        "(persistent: drain it), while every rank's local gradients agreed")
    transient = judge(_reduced([[BUCKETS] * 3, [BUCKETS, wrong, BUCKETS], [BUCKETS] * 3]))
    assert "differs on rank 1 after the all-reduce in 1 of 3 repeats (repeat 1: transient)" in transient.message
    assert transient.metrics["diagnosis"] == {"ranks": [1], "how": "bucket", "tensor": "bucket:0",
                                              "repeats": {"1": [1]}, "total": 3, "persistent": False,
                                              "ratio": None}
    verdict = judge_injected(ONCE, transient, _fired(ONCE), world_size=3, repeats=3)
    assert verdict.status == "passed", verdict.message
    pair = judge(_reduced([[BUCKETS] * 2, [wrong] * 2]))
    assert "differs on ranks [0, 1] (a set: pair) after the all-reduce in every repeat" in pair.message
    assert "culprit_rank" not in pair.metrics


@pytest.mark.parametrize("change, said", [
    (lambda d: {**d, "persistent": True, "repeats": {"1": [0, 1, 2]}},
     "differed in repeats [0, 1, 2], injected in [1]; called persistent, injected in repeats [1]"),
    (lambda d: {**d, "ranks": [2], "repeats": {"2": [1]}}, "named ranks [2], injected on rank 1"),
    (lambda d: {**d, "tensor": "bucket:1"}, "located at bucket:1, injected at bucket:0"),
])
def test_the_injected_judge_fails_a_wrong_bucket_diagnosis(change: Any, said: str) -> None:
    right = judge(_reduced([[BUCKETS] * 3, [BUCKETS, ["X", "b1"], BUCKETS], [BUCKETS] * 3]))
    wrong = dataclasses.replace(right, metrics={**right.metrics, "diagnosis": change(right.metrics["diagnosis"])})
    verdict = judge_injected(ONCE, wrong, _fired(ONCE), world_size=3, repeats=3)
    assert verdict.status == "failed" and said in verdict.message, verdict.message


# -- a slow pair ----------------------------------------------------------------------------------

def test_the_injected_judge_names_a_slow_pair_and_fails_a_wrong_diagnosis() -> None:
    from ddp_conformance.faults import SlowPair

    pair = SlowPair(pair=(3, 2), rate_gbps=0.2)
    assert pair.pair == (2, 3)  # a pair has no direction
    fired = [Injection(pair.name, 0, 0, "data", 0.0, 0.0, {"pair": [2, 3]})]
    links = [_link(p, [0.004] * 5) for p in RING[:3]] + [_link(RING[3], [0.080] * 5)]
    right = judge(_timed({r: FAST for r in range(4)}, links))
    assert right.metrics["diagnosis"] == {"ranks": [2, 3], "how": "link", "tensor": "link:2-3", "repeats": {},
                                          "total": 0, "persistent": False, "ratio": 0.05}
    assert judge_injected(pair, right, fired, world_size=4, repeats=3).status == "passed"
    for change, said in [({"ranks": [1, 2], "tensor": "link:1-2"}, "named ranks [1, 2], injected on ranks"),
                         ({"how": "majority"}, "named by majority, expected link"),
                         ({"ratio": None}, "bandwidth ratio None, expected the pair's share")]:
        wrong = dataclasses.replace(right, metrics={**right.metrics, "diagnosis": {**right.metrics["diagnosis"],
                                                                                   **change}})
        verdict = judge_injected(pair, wrong, fired, world_size=4, repeats=3)
        assert verdict.status == "failed" and said in verdict.message, verdict.message
    verdict = judge_injected(pair, right, [], world_size=4, repeats=3)
    assert verdict.status == "failed" and "the slow-pair never fired (no injection recorded)" in verdict.message
    healthy = judge(_timed({r: FAST for r in range(4)}, [_link(p, [0.004] * 5) for p in RING]))
    assert judge_injected(pair, healthy, fired, world_size=4, repeats=3).status == "failed"
    with pytest.raises(ValueError, match=r"pair=\(1, 1\) must be two different ranks"):
        SlowPair(pair=(1, 1), rate_gbps=0.2)


# -- the GPU path, what of it runs on CPU ---------------------------------------------------------

def test_on_nccl_the_check_runs_deterministic_in_a_fresh_world_with_the_cublas_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from conformance.harness.context import CheckContext
    from ddp_conformance.faults.checks.node_health import check
    from ddp_conformance.faults.checks.node_health.rank import CUBLAS_WORKSPACE

    spawned: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []

    class FakeWorld:
        def run(self, fn: Any, *args: Any, **kwargs: Any) -> list[Any]:
            calls.append(kwargs)
            return [SimpleNamespace(value=v) for v in _world([[CLEAN]] * 2)]

        def close(self) -> None:
            pass

    def new_world(**kwargs: Any) -> FakeWorld:
        spawned.append(kwargs)
        return FakeWorld()

    def shared() -> FakeWorld:
        raise AssertionError("the shared world was used: cuBLAS there started without its setting")

    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    ctx = SimpleNamespace(world_size=2, injected=False, target=SimpleNamespace(spec="my_target.py"), backend="nccl",
                          world=shared, new_world=new_world, deadline=60.0)
    ctx.fresh_world = lambda **kw: CheckContext.fresh_world(ctx, **kw)  # the harness's own spawning rule
    outcome = check.run(ctx)  # type: ignore[arg-type]
    assert outcome.status == "passed", outcome.message
    assert spawned and spawned[0]["env"] == {**CUBLAS_WORKSPACE, "NCCL_DEBUG": "WARN"}
    assert calls == [{"repeats": 3, "fault": None, "buckets": True, "deterministic": True, "speed": True,
                      "private_network": False}]


def test_determinism_is_turned_on_only_with_the_cublas_setting_and_says_why_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from ddp_conformance.faults.checks.node_health.rank import _determinism

    assert _determinism(False) is None
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert _determinism(True) == ("CUBLAS_WORKSPACE_CONFIG is not :4096:8 in this process (cuBLAS reads it when "
                                  "it starts): set it in the launcher's environment")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    try:
        assert _determinism(True) is None
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]


def test_the_device_digest_is_exact_on_every_dtype_it_meets() -> None:
    import torch

    from conformance.harness.digest import weighted_sum
    from ddp_conformance.faults.corruption import flipped

    # The GPU digest is device-agnostic torch: exercised here on CPU tensors of each width.
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        x = torch.randn(300).to(dtype)
        assert weighted_sum(x) == weighted_sum(x.clone())
        for bit in ("mantissa", "exponent", "sign"):
            assert weighted_sum(flipped(x, 299, bit)[0].view(-1)) != weighted_sum(x), (dtype, bit)
    ints = torch.arange(10, dtype=torch.uint8)
    assert weighted_sum(ints) != weighted_sum(ints.flip(0))


@pytest.mark.parametrize("module, as_view, apart", [
    ("linear", False, True),
    ("linear", True, False),  # .grad is the bucket: the all-reduce overwrites it
    ("sparse-embedding", False, False),  # DDP hands the sparse gradient to the comm hook as it is
    ("dense-embedding", False, True),
])
def test_local_gradients_are_kept_in_grad_only_where_ddp_keeps_grad_apart_from_its_buckets(
        module: str, as_view: bool, apart: bool) -> None:
    from types import SimpleNamespace

    from torch import nn

    from ddp_conformance.faults.checks.node_health.probes import keeps_grads_apart

    built = {"linear": nn.Linear(2, 2), "sparse-embedding": nn.Embedding(4, 2, sparse=True),
             "dense-embedding": nn.Embedding(4, 2)}[module]
    ddp = SimpleNamespace(module=nn.Sequential(built), gradient_as_bucket_view=as_view)
    assert keeps_grads_apart(ddp) is apart
