"""DDP wrapping that resume depends on: the plain module inside wrappers, a fixed bucket layout."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger("hpc_ddp")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (and ``torch.compile``) wrappers."""
    inner: Any = model
    while True:
        if isinstance(inner, nn.parallel.DistributedDataParallel):
            inner = inner.module
        elif hasattr(inner, "_orig_mod"):
            inner = inner._orig_mod
        else:
            return inner  # type: ignore[no-any-return]


def fix_bucket_layout(ddp: nn.parallel.DistributedDataParallel) -> None:
    """Give DDP its final gradient-bucket layout now, the same in every attempt (collective).

    DDP reduces the first backward pass in one bucket holding every gradient and then rebuilds
    its buckets in the order gradients became ready. A resumed attempt's first step would so
    use another layout than the uninterrupted run's step at that point; with 3+ ranks the ring
    all-reduce then adds each gradient's terms in another order, and the weights drift by a few
    ulps. (With 2 ranks a + b == b + a, and nothing changes.) Rebuilding at once, in parameter
    order, makes the layout a function of the model alone.
    """
    reducer: Any = ddp.reducer
    if not all(hasattr(reducer, m) for m in ("_push_all_rebuilt_params", "_rebuild_buckets")):
        log.warning(
            "this torch's DDP cannot fix its bucket layout: resume is exact only on 2 ranks"
        )
        return
    reducer._push_all_rebuilt_params()  # private API, present in torch 1.10 through 2.14
    reducer._rebuild_buckets()


def wrap_model(
    model: nn.Module, device: torch.device, *, exact: bool | None = None, **ddp_kwargs: Any
) -> nn.Module:
    """``model`` moved to ``device`` and wrapped in DistributedDataParallel (see
    :meth:`hpc_ddp.runtime.session.Session.wrap`)."""
    model = model.to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, **ddp_kwargs)
    if exact if exact is not None else device.type == "cpu":
        fix_bucket_layout(ddp)
    return ddp
