"""The options of the MAML++ inner loop (``inner_loop.make_inner_loop``), checked on
construction: each is a keyword argument of the ``maml_low``, ``maml_high`` and ``sca``
factories, and ``inner_loop``'s module docstring says what each does and where its default
comes from."""

from __future__ import annotations

import dataclasses

REMAT_POLICIES: tuple[str, ...] = ("full", "dots", "none")
WEIGHT_INITS: tuple[str, ...] = ("original", "lecun")


@dataclasses.dataclass(frozen=True)
class InnerLoopOptions:
    """Options of the MAML++ inner loop (factory keyword arguments; defaults = MAML++)."""

    inner_steps: int = 5  # S: SGD steps on each support set
    inner_lr: float = 0.01  # initial (LSLR) or fixed inner learning rate
    lslr: bool = True  # learnable per-layer, per-step inner learning rates
    per_step_bn: bool = True  # per-step batch-norm scale/bias
    first_order: bool = False  # first-order meta-gradients throughout
    first_order_epochs: int = 0  # first-order for epochs < this, then second-order
    multi_step_loss: bool = False  # target loss after every support set, annealed
    msl_fraction: float = 0.1  # fraction of meta-training over which the MSL anneals
    remat: str = "full"  # jax.checkpoint of adapt: "full" (save inputs), "dots", "none"
    unroll: int | bool = 1  # lax.scan unroll over support sets in meta_loss (True: full)
    unroll_inner: bool = True  # unroll the S inner steps of a support set (else lax.scan)
    target_bn_row: bool = True  # the target forward after NSS*S steps has its own BN row
    restart_each_support_set: bool = False  # as published: each set restarts from params
    weight_init: str = "original"  # "original" (authors' Xavier / PyTorch default), "lecun"

    def __post_init__(self):
        _check_int("inner_steps", self.inner_steps, 1)
        _check_int("first_order_epochs", self.first_order_epochs, 0)
        for name in ("lslr", "per_step_bn", "first_order", "multi_step_loss", "unroll_inner",
                     "target_bn_row", "restart_each_support_set"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if isinstance(self.inner_lr, bool) or not isinstance(self.inner_lr, (int, float)) \
                or not self.inner_lr > 0:
            raise ValueError(f"inner_lr must be a positive number, got {self.inner_lr!r}")
        if isinstance(self.msl_fraction, bool) or not isinstance(self.msl_fraction, (int, float)) \
                or not 0 < self.msl_fraction <= 1:
            raise ValueError(f"msl_fraction must be in (0, 1], got {self.msl_fraction!r}")
        if self.weight_init not in WEIGHT_INITS:
            raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {self.weight_init!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if not isinstance(self.unroll, bool):
            _check_int("unroll", self.unroll, 1)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
