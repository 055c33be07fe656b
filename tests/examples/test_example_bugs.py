"""Bug variants of the examples, each caught by the check that owns it, with the hint naming
the real cause. Every variant is the example with one deliberate change (``_variants.py``),
run on the shared gloo 2-rank session."""

from __future__ import annotations

import re

import pytest

from conformance.harness.registry import BY_ID

from ._variants import variant

BYPASSED = r"forward bypassed DDP: .*0 all-reduces were observed"
STATIC_GRAPH_DID_NOT_FIX = (r"static_graph=True: did not fix \(with the step's no_sync accumulation over K=4 "
                            r"microbatches DDP's reducer raised .*pytorch/pytorch#143580\)")
#: Where a cause is named in the recommendation rather than the message.
ADVICE = {"gpt_untied_on_one_rank": r"build_model must not depend on the rank",
          "resnet_no_broadcast_buffers": r"keep broadcast_buffers=True"}

#: case -> (example, check id, edits, regex the message must match: the real cause)
CASES = {
    # -- train_gpt.py ------------------------------------------------------------------------
    # The loss not divided by the K micro-steps, with clipping that engages on both sides:
    # the clipped gradients agree in direction, only the gradients before clipping show it.
    "gpt_loss_not_divided_by_k": (
        "train_gpt.py", "no-sync-equivalence",
        [("loss = loss / k  # the mean over the whole accumulated batch", "loss = loss  # BUG"),
         ("GRAD_CLIP = 1.0", "GRAD_CLIP = 0.05")],
        r"not divided by the K=4 accumulation steps"),
    "gpt_forward_through_module": (
        "train_gpt.py", "gradient-equivalence",
        [("            _, loss = model(inputs, targets)\n", "            _, loss = model.module(inputs, targets)\n")],
        BYPASSED),
    "gpt_untied_on_one_rank": (
        "train_gpt.py", "rank-consistency",
        [("    return GPT(CONFIG)\n",
          "    import torch.distributed as dist\n"
          "    return GPT(CONFIG, tie_weights=not dist.is_initialized() or dist.get_rank() == 0)\n")],
        r"structure differs on rank 1.*lm_head\.weight"),
    "gpt_sync_every_micro_step": (
        "train_gpt.py", "no-sync-equivalence",
        [("model.require_backward_grad_sync = i == k - 1", "model.require_backward_grad_sync = True")],
        r"4 all-reduce rounds .*per optimizer step for K=4 microbatches instead of 1"),
    # -- train_split.py ----------------------------------------------------------------------
    # The realistic form of the bug: the script seeds torch per rank (for its own augmentation
    # or dropout), then splits without a generator, so each rank trains on another split.
    "split_unseeded_random_split": (
        "train_split.py", "gradient-equivalence",
        [("TRAIN_SET, VAL_SET = random_split(_dataset(), [DATASET_SIZE - VAL_SIZE, VAL_SIZE],\n"
          "                                  generator=torch.Generator().manual_seed(SPLIT_SEED))",
          "import torch.distributed as dist  # noqa: E402\n"
          "torch.manual_seed(1337 + (dist.get_rank() if dist.is_initialized() else 0))\n"
          "TRAIN_SET, VAL_SET = random_split(_dataset(), [DATASET_SIZE - VAL_SIZE, VAL_SIZE])")],
        r"rank 1's data differs from rank 0's: .*random_split without a generator"),
    "split_sampler_seed_per_rank": (
        "train_split.py", "sampler-coverage",
        [("num_replicas=world_size, rank=rank, shuffle=True, seed=0)",
          "num_replicas=world_size, rank=rank, shuffle=True, seed=rank)")],
        r"(?i)(sampler )?seed (differs|per rank)|different (sampler )?seeds?"),
    "split_no_set_epoch": (
        "train_split.py", "sampler-coverage",
        [("    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]\n    return loader",
          "    return loader")],
        r"repeat the previous epoch's order — set_epoch\(epoch\) is not called"),
    "split_forward_through_module": (
        "train_split.py", "gradient-equivalence",
        [("output = self.model(source)", "output = self.model.module(source)")],
        BYPASSED),
    # -- train_resnet.py ---------------------------------------------------------------------
    "resnet_sum_loss": (
        "train_resnet.py", "gradient-equivalence",
        [("criterion = nn.CrossEntropyLoss()", "criterion = nn.CrossEntropyLoss(reduction=\"sum\")")],
        r"sum over samples \(reduction='sum'\), not a mean"),
    "resnet_forward_through_module": (
        "train_resnet.py", "gradient-equivalence",
        [("output = model(images)", "output = model.module(images)")],
        BYPASSED),
    "resnet_no_broadcast_buffers": (
        "train_resnet.py", "rank-consistency",
        [('ddp_kwargs = {"find_unused_parameters": False}',
          'ddp_kwargs = {"find_unused_parameters": False, "broadcast_buffers": False}')],
        r"buffer 'stem\.1\.running_(mean|var)' differs between rank 0 and rank 1"),
    # -- train_checkpointed.py ---------------------------------------------------------------
    # The classic reentrant-checkpointing failures, named, with both remedies re-run on the
    # example's accumulating step: use_reentrant=False fixes it; static_graph=True does not
    # survive no_sync in torch 2.13 (pytorch/pytorch#143580), and the re-run shows it.
    "checkpointed_reentrant_find_unused": (
        "train_checkpointed.py", "gradient-equivalence",
        [("USE_REENTRANT = False", "USE_REENTRANT = True"),
         ('ddp_kwargs = {"find_unused_parameters": False}', 'ddp_kwargs = {"find_unused_parameters": True}')],
        r"reentrant activation checkpointing in blocks\.0, blocks\.1, blocks\.2, blocks\.3 with ddp_kwargs "
        r"\{'find_unused_parameters': True\}: DDP marks a parameter ready twice .*find_unused_parameters=True "
        r"searches the autograd graph.*" + STATIC_GRAPH_DID_NOT_FIX + r".*use_reentrant=False: verified fix"),
    # Without no_sync (every micro-step all-reduces) static_graph=True is a verified fix too.
    "checkpointed_reentrant_find_unused_no_no_sync": (
        "train_checkpointed.py", "gradient-equivalence",
        [("USE_REENTRANT = False", "USE_REENTRANT = True"),
         ('ddp_kwargs = {"find_unused_parameters": False}', 'ddp_kwargs = {"find_unused_parameters": True}'),
         ("sync = contextlib.nullcontext() if i == k - 1 else model.no_sync()", "sync = contextlib.nullcontext()")],
        r"reentrant activation checkpointing in blocks\.0, blocks\.1, blocks\.2, blocks\.3 .*"
        r"static_graph=True: verified fix \(2 steps of K=4 microbatches completed on 2 ranks.*"
        r"use_reentrant=False: verified fix"),
    "checkpointed_reentrant_shared_block": (
        "train_checkpointed.py", "no-sync-equivalence",
        [("USE_REENTRANT = False", "USE_REENTRANT = True"),
         ("nn.ModuleList(Block(WIDTH) for _ in range(DEPTH))", "nn.ModuleList([Block(WIDTH)] * DEPTH)")],
        r"reentrant activation checkpointing in blocks\.0 with ddp_kwargs \{'find_unused_parameters': False\}: "
        r"DDP marks a parameter ready twice .*blocks\.0 \(4 reentrant calls per forward\)"
        r".*" + STATIC_GRAPH_DID_NOT_FIX + r".*use_reentrant=False: verified fix"),
    "resnet_no_set_epoch": (
        "train_resnet.py", "sampler-coverage",
        [("    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]\n", "")],
        r"repeat the previous epoch's order — set_epoch\(epoch\) is not called"),
}


#: Variants whose cause the checks do not name yet (strict: an unexpected pass fails, so the
#: mark is removed the day the check learns it).
WAITING: dict[str, str] = {}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=WAITING[c]))
                                  if c in WAITING else c for c in CASES])
def test_bug_is_caught_with_its_cause(suite_session, tmp_path, case):
    example, check_id, edits, cause = CASES[case]
    target = variant(tmp_path, example, case, *edits)
    record, _ = suite_session.run_check(BY_ID[check_id], target)
    assert record.status == "failed", (record.status, record.message)
    assert re.search(cause, record.message), record.message
    if case in ("checkpointed_reentrant_find_unused", "checkpointed_reentrant_shared_block"):
        assert re.search(r"verified here by re-running the failing step: use_reentrant=False; re-run and did "
                         r"not fix: static_graph=True", record.recommendation or ""), record.recommendation
    if case in ADVICE:
        assert re.search(ADVICE[case], record.recommendation or ""), record.recommendation
