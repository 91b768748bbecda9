"""MAML++ learners: ``maml_low`` (Conv-4, all weights adapt) and ``maml_high`` (SE-DenseNet + head).

    learner = maml_low(spec)                          # MAML++ defaults
    learner = maml_high(spec, image_shape=(64, 64, 3), first_order_epochs=10)

``maml_low``: Conv-4 with ``filters`` (48) channels: 4 x [3x3 conv, per-step
batch norm, LeakyReLU, 2x2 max-pool], flattened, then a linear head sized by
the spec; every conv kernel and linear weight/bias adapts (ATM = all of them, plus
the 4-byte step counter; the convs have no bias: batch norm follows them).

``maml_high``: an ``SEDenseNet`` embedding (stem ``embed_filters`` = 64,
``growth`` 64, 2 stages x 2 blocks, transitions keeping all channels: 192
then 320, pooled to 5x5; as the authors' code), meta-learned only and
applied to each support set and to the target set separately, then an
``AdaptableHead`` (``filters`` = 48) whose weights adapt (ATM = the head's
weights, plus the step counter: 976,192 bytes on 28x28 Omniglot B3, ATM 20.75).
Embedding batch norm (``bn_stats``): "running" (default, as the authors'
``nn.BatchNorm2d`` in ``SqueezeExciteDenseNet``, FewShotContinualLearning commit
abc7c72): meta-training normalises each support set and the target set with
their own statistics and folds them into running averages
(``params["embed_stats"]``); validation and test embed every image with the
running averages (``Learner.evaluation``). "batch": every set is normalised with
its own statistics in evaluation too. The head's per-step batch norm uses batch
statistics either way, as the authors' head.
Options of the previous, smaller network (126,896 bytes on B3, ATM 2.70):
``shrink_transitions=True`` (transitions back to ``embed_filters`` = 64
channels) and ``se_mlp=True`` (2-layer squeeze-excite MLPs; see
``models.densenet``).

Inner-loop options are documented in ``inner_loop.InnerLoopOptions``, with
their defaults: ``inner_steps`` (5), ``inner_lr`` (0.01), ``lslr`` (True),
``per_step_bn`` (True), ``target_bn_row`` (True: the target forward after
NSS*S steps uses its own per-step BN row NSS*S; False: reuses the last
support step's row, the previous behaviour), ``first_order`` (False),
``first_order_epochs`` (0), ``multi_step_loss`` (False, as all the released
configs; True: the previous default), ``msl_fraction`` (0.1),
``restart_each_support_set`` (False; True: "as published", each support set
restarts from the meta-weights so only the last one reaches the target, as
the paper-era MAML++ low-end code), ``weight_init`` ("original": Xavier-
uniform adapted layers, PyTorch-default embedding; "lecun": the previous
Flax init), ``remat``, ``unroll``, ``unroll_inner``; ``conv`` picks the
convolution (see ``models.conv``).
"""

from __future__ import annotations

import flax.linen as nn
import jax

from cfsl_jax.learners.base import Learner
from cfsl_jax.learners.inner_loop import InnerLoop, InnerLoopOptions, assemble, make_inner_loop
from cfsl_jax.models.conv import CONV_IMPLS, Conv
from cfsl_jax.models.densenet import AdaptableHead, SEDenseNet, max_pool
from cfsl_jax.models.norm import PerStepBatchNorm
from cfsl_jax.spec import TaskSpec

BN_STATS: tuple[str, ...] = ("running", "batch")  # maml_high / sca embedding (``bn_stats``)


class MamlConv4(nn.Module):
    """The MAML++ low-end network: [n, H, W, C], inner step -> logits [n, num_outputs]."""

    num_outputs: int
    filters: int = 48
    num_blocks: int = 4
    num_steps: int = 1
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array, step: jax.Array | int = 0) -> jax.Array:
        for _ in range(self.num_blocks):
            x = Conv(self.filters, 3, self.conv_impl, use_bias=False)(x)
            x = nn.leaky_relu(PerStepBatchNorm(self.num_steps)(x, step))
            x = max_pool(x)
        return nn.Dense(self.num_outputs)(x.reshape(x.shape[0], -1))


def _check_common(image_shape, filters: int, conv: str) -> tuple[int, int, int]:
    shape = tuple(image_shape)
    if len(shape) != 3 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                              for d in shape):
        raise ValueError(f"image_shape must be (H, W, C) positive integers, got {image_shape!r}")
    if isinstance(filters, bool) or not isinstance(filters, int) or filters < 1:
        raise ValueError(f"filters must be a positive integer, got {filters!r}")
    if conv not in CONV_IMPLS:
        raise ValueError(f"conv must be one of {CONV_IMPLS}, got {conv!r}")
    return shape


def maml_low_loop(spec: TaskSpec, image_shape=(28, 28, 1), filters: int = 48,
                  num_blocks: int = 4, conv: str = "auto", **options) -> InnerLoop:
    """The inner-loop pieces of ``maml_low`` (see ``maml_low``)."""
    shape = _check_common(image_shape, filters, conv)
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
    if min(shape[:2]) < 2**num_blocks:
        raise ValueError(f"image_shape {shape} is too small for {num_blocks} 2x2 max-pools "
                         f"(needs H, W >= {2**num_blocks})")
    opts = InnerLoopOptions(**options)
    steps = spec.nss * opts.inner_steps + opts.target_bn_row if opts.per_step_bn else 1
    net = MamlConv4(spec.num_outputs, filters, num_blocks, steps, conv)
    return make_inner_loop(spec, shape, net, opts)


def maml_high_loop(spec: TaskSpec, image_shape=(28, 28, 1), filters: int = 48,
                   embed_filters: int = 64, growth: int = 64, conv: str = "auto",
                   extra_steps: int = 0, se_mlp: bool = False, shrink_transitions: bool = False,
                   bn_stats: str = "running", **options) -> InnerLoop:
    """The inner-loop pieces of ``maml_high`` (SCA passes ``extra_steps=1``)."""
    if bn_stats not in BN_STATS:
        raise ValueError(f"bn_stats must be one of {BN_STATS}, got {bn_stats!r}")
    shape = _check_common(image_shape, filters, conv)
    for name, value in (("embed_filters", embed_filters), ("growth", growth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if min(shape[:2]) < 4:
        raise ValueError(f"image_shape {shape} is too small for the SE-DenseNet (needs H, W >= 4)")
    for name, value in (("se_mlp", se_mlp), ("shrink_transitions", shrink_transitions)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")
    opts = InnerLoopOptions(**options)
    steps = (spec.nss * opts.inner_steps + extra_steps + opts.target_bn_row
             if opts.per_step_bn else 1)
    running = bn_stats == "running"
    embed = SEDenseNet(embed_filters, growth, conv_impl=conv, se_mlp=se_mlp,
                       shrink_transitions=shrink_transitions,
                       norm="train" if running else "batch")
    head = AdaptableHead(spec.num_outputs, filters, steps, conv, se_mlp=se_mlp)
    return make_inner_loop(spec, shape, head, opts, embed=embed, extra_steps=extra_steps,
                           embed_eval=embed.clone(norm="eval") if running else None)


def maml_low(spec: TaskSpec, image_shape=(28, 28, 1), filters: int = 48, num_blocks: int = 4,
             conv: str = "auto", **options) -> Learner:
    """MAML++ low-end: Conv-4 (``filters`` 48), every weight adapts; options: module doc."""
    return assemble("maml_low", maml_low_loop(spec, image_shape, filters, num_blocks, conv,
                                              **options))


def maml_high(spec: TaskSpec, image_shape=(28, 28, 1), filters: int = 48,
              embed_filters: int = 64, growth: int = 64, conv: str = "auto",
              **options) -> Learner:
    """MAML++ high-end: SE-DenseNet embedding (outer loop only) + adaptable head."""
    return assemble("maml_high", maml_high_loop(spec, image_shape, filters, embed_filters,
                                                growth, conv, **options))
