"""The options of the MAML++ inner loop (``inner_loop.make_inner_loop``), checked on
construction; ``maml.MamlLowOptions``, ``maml.MamlHighOptions`` and ``sca.ScaOptions`` add
their networks' options. ``inner_loop``'s module docstring says what each does."""

from __future__ import annotations

import dataclasses

from cfsl_jax.models.init import WEIGHT_INITS
from cfsl_jax.runtime.options import check_fields, option

REMAT_POLICIES: tuple[str, ...] = ("full", "dots", "none")


@dataclasses.dataclass(frozen=True)
class InnerLoopOptions:
    """Options of the MAML++ inner loop (defaults: the authors' released configs)."""

    inner_steps: int = option(5, "S: SGD steps on each support set.", minimum=1)
    inner_lr: float = option(0.01, "Initial (LSLR) or fixed inner learning rate.", above=0)
    lslr: bool = option(True, "Learnable per-layer, per-step inner learning rates.")
    per_step_bn: bool = option(True, "Per-step batch-norm scale/bias.")
    first_order: bool = option(False, "First-order meta-gradients throughout.")
    first_order_epochs: int = option(0, "First-order for epochs < this, then second-order.",
                                     minimum=0)
    multi_step_loss: bool = option(False, "Per-support-set multi-step loss (cfsl_jax's, not "
                                   "the authors' per-inner-step one): a target loss after every "
                                   "support set on the labels seen so far, annealed to the "
                                   "final loss.")
    msl_fraction: float = option(0.1, "Fraction of meta-training over which the "
                                 "per-support-set multi-step loss anneals.", above=0, maximum=1)
    remat: str = option("full", "jax.checkpoint of adapt: save its inputs (full), also its "
                        "matmuls (dots), or no checkpoint (none).", choices=REMAT_POLICIES)
    unroll: int | bool = option(1, "lax.scan unroll over support sets in meta_loss (true: "
                                "all).", minimum=1)
    unroll_inner: bool = option(True, "Unroll the S inner steps of a support set (else a "
                                "lax.scan).")
    target_bn_row: bool = option(True, "The target forward after NSS*S steps has its own "
                                 "per-step BN row (else the last support step's).")
    restart_each_support_set: bool = option(False, "Every support set restarts from the "
                                            "meta-weights (the paper-era code).")
    weight_init: str = option("xavier", "Init of the adapted network's layers.",
                              choices=WEIGHT_INITS)

    def __post_init__(self):
        check_fields(self)
