"""The built-in targets as target files: determinism, the tie, branchy's branch contract."""

from __future__ import annotations

import pytest
import torch

from conformance.harness.targets import (
    BUILTINS,
    build_model_checked,
    load_target,
    make_batch_checked,
)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_is_a_valid_deterministic_target(name):
    target = load_target(name)
    assert target.module.__doc__.lstrip().startswith("Built-in target")
    assert "ddp-conformance run" in target.module.__doc__
    torch.manual_seed(0)
    model = build_model_checked(target)
    size = target.batch_size_for(2, 4)
    a = make_batch_checked(target, torch.Generator().manual_seed(5), size)
    b = make_batch_checked(target, torch.Generator().manual_seed(5), size)
    c = make_batch_checked(target, torch.Generator().manual_seed(6), size)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    loss = target.loss_fn(model(a[0]), a[1])
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_tied_lm_ties_embedding_and_projection():
    model = build_model_checked(load_target("tied-lm"))
    assert model.embed.weight is model.lm_head.weight
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert "embed.weight" in names and "lm_head.weight" in names


def test_branchy_takes_the_branch_in_every_default_microbatch():
    from conformance.targets import branchy

    inputs, _ = branchy.make_batch(torch.Generator().manual_seed(0), 32)
    # The checks split the global batch into contiguous microbatches of 4 samples.
    assert all(branchy.needs_aux(chunk) for chunk in inputs.split(4))
    no_aux, _ = branchy.make_rows(torch.Generator().manual_seed(0), 4, aux=torch.zeros(4, dtype=torch.bool))
    assert not branchy.needs_aux(no_aux)
    model = branchy.build_model()
    main, aux, _ = model(no_aux)
    assert aux is None  # the aux head's parameters get no gradient on such a rank
    assert all(n.startswith(branchy.AUX_PARAMETER_PREFIX)
               for n, _ in model.aux_head.named_parameters(prefix="aux_head"))
    assert branchy.ddp_kwargs == {"find_unused_parameters": False}
