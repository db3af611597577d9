"""FSDP2 wrapping: the model's parameters, gradients and optimizer state sharded over the ranks.

``train.strategy: fsdp`` (or ``s.wrap(model, strategy="fsdp")``) applies
``torch.distributed.fsdp.fully_shard`` per block and then to the root, as torchtitan does: each
block's parameters are gathered just before it runs and freed right after, so a rank holds one
block's full parameters at a time, not the model's. The blocks (:func:`shard_units`):

* the names given (``shard=``): class names (``"TransformerBlock"``: every module of that
  class) or attribute paths (``"encoder.layers.0"``);
* else a torchvision ResNet's residual stages ``layer1`` .. ``layer4``;
* else the root's direct children that hold parameters (an ``nn.Sequential``'s layers).

``fully_shard`` changes the module's class in place (no wrapper object): the model keeps its
attribute names and its state-dict keys, and :func:`is_sharded` tells a sharded one. Its
``state_dict()`` holds DTensor shards; :func:`full_state_dict` gathers the whole state on every
rank (a collective), for a digest or an export of a small model, never for checkpoints, which
each rank writes its own shard of (:mod:`hpc_ddp.checkpoint.sharded`).

Mixed precision (``train.amp`` on a GPU) is FSDP's ``MixedPrecisionPolicy``: parameters
gathered in bfloat16, gradients reduced in float32, the sharded parameters and the optimizer
state kept in float32. On CPU it is off, as for DDP: gloo reduces bfloat16 slowly, and exact
resume is promised in float32 (torch 2.14 runs the policy on CPU too, so a test may set it).
FSDP2's counterpart of DDP's ``no_sync`` is ``set_requires_gradient_sync(False)``
(:func:`no_sync`).

torch is imported inside the functions, as in :mod:`hpc_ddp.runtime.procgroup`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from hpc_ddp.errors import ConfigError
from hpc_ddp.runtime.procgroup import unwrap

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger("hpc_ddp")

STRATEGIES = ("ddp", "fsdp")
RESNET_STAGES = ("layer1", "layer2", "layer3", "layer4")
"""A torchvision ResNet's residual stages: its FSDP blocks."""


def shard_units(
    model: nn.Module, shard: Sequence[str] | None = None
) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` blocks that :func:`shard_model` shards one by one before the
    root, outermost first (see the module docstring). A name in ``shard`` that matches nothing
    is a :class:`ConfigError` naming what there is."""
    from torch import nn

    named = dict(model.named_modules())
    if shard:
        units: dict[str, nn.Module] = {}
        for want in shard:
            found = [
                (n, m) for n, m in named.items() if n and (n == want or type(m).__name__ == want)
            ]
            if not found:
                classes = sorted({type(m).__name__ for n, m in named.items() if n})
                raise ConfigError(
                    f"shard={want!r} names no submodule of {type(model).__name__}. HINT: give "
                    "attribute paths (e.g. 'layers.0') or class names; its classes are "
                    f"{', '.join(classes[:20])}."
                )
            units.update(found)
        # A block inside another block is sharded first (FSDP needs the inner ones first).
        return sorted(units.items(), key=lambda item: -item[0].count("."))
    if all(isinstance(named.get(stage), nn.Module) for stage in RESNET_STAGES):
        return [(stage, named[stage]) for stage in RESNET_STAGES]
    return [
        (name, child)
        for name, child in model.named_children()
        if any(True for _ in child.parameters())
    ]


def mixed_precision(amp: bool, device: torch.device) -> Any:
    """FSDP's ``MixedPrecisionPolicy`` for ``train.amp`` on ``device``: bfloat16 parameters and
    float32 gradient reduction on a GPU with native bfloat16, else None (float32)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not amp:
        return None
    if device.type != "cuda":
        log.warning("train.amp needs a GPU; FSDP trains in float32 on %s", device)
        return None
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        log.warning("train.amp: this GPU has no native bfloat16; FSDP trains in float32")
        return None
    log.info("train.amp: FSDP gathers parameters in bfloat16, reduces gradients in float32")
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_model(
    model: nn.Module,
    device: torch.device,
    *,
    shard: Sequence[str] | None = None,
    mp_policy: Any = None,
) -> nn.Module:
    """``model`` moved to ``device`` and sharded with FSDP2 per block, then at the root
    (collective: every rank calls it with the same model). Returns the same object."""
    from torch.distributed.fsdp import fully_shard

    model = model.to(device)
    kwargs: dict[str, Any] = {} if mp_policy is None else {"mp_policy": mp_policy}
    units = shard_units(model, shard)
    for _, unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    log.info(
        "fsdp: %d block(s) sharded, then the root: %s",
        len(units),
        ", ".join(name for name, _ in units) or "none",
    )
    return model


def is_sharded(model: Any) -> bool:
    """Whether ``model`` (or the module inside its ``torch.compile`` wrapper) is FSDP2-sharded."""
    from torch import nn
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, nn.Module) and isinstance(unwrap(model), FSDPModule)


def full_state_dict(model: nn.Module) -> dict[str, Any]:
    """The whole model state on every rank, on the CPU (collective for a sharded model; a
    plain ``state_dict()`` otherwise)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    inner = unwrap(model)
    if not is_sharded(inner):
        return inner.state_dict()
    import torch

    state = get_model_state_dict(inner, options=StateDictOptions(full_state_dict=True))
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Accumulate gradients without reducing them (DDP's ``no_sync``; for a sharded model
    FSDP2's ``set_requires_gradient_sync(False)``, undone on leaving)."""
    inner: Any = unwrap(model)
    if is_sharded(inner):
        inner.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            inner.set_requires_gradient_sync(True)
    elif hasattr(model, "no_sync"):
        ddp: Any = model
        with ddp.no_sync():
            yield
    else:
        yield
