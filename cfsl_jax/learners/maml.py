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
``nn.BatchNorm2d`` in ``SqueezeExciteDenseNet``): meta-training normalises each support set and the target set with
their own statistics and folds them into running averages
(``params["embed_stats"]``); validation and test embed every image with the
running averages (``Recipe.evaluation``). "batch": every set is normalised with
its own statistics in evaluation too. The head's per-step batch norm uses batch
statistics either way, as the authors' head.
``shrink_transitions=True`` (transitions back to ``embed_filters`` = 64
channels: 126,896 bytes on B3, ATM 2.70) and ``se_mlp=True`` (2-layer
squeeze-excite MLPs; see ``models.densenet``) make the network smaller.

Options: ``MamlLowOptions`` and ``MamlHighOptions`` (each the inner-loop
options of ``InnerLoopOptions``, described in ``inner_loop``'s module doc, plus
its network's). ``weight_init`` ("xavier") draws the adapted layers
Xavier-uniform and ``embed_init`` ("torch") the SE-DenseNet with PyTorch's
default, as the authors' code (``models.init``).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from cfsl_jax.runtime.errors import UserError
from cfsl_jax.protocol.learner import Learner
from cfsl_jax.learners.assemble import assemble
from cfsl_jax.learners.inner_loop import InnerLoop, InnerLoopOptions, make_inner_loop
from cfsl_jax.models.conv import CONV_IMPLS, Conv
from cfsl_jax.models.densenet import AdaptableHead, SEDenseNet, max_pool
from cfsl_jax.models.init import WEIGHT_INITS
from cfsl_jax.models.norm import PerStepBatchNorm
from cfsl_jax.runtime.options import option, positive_int
from cfsl_jax.protocol.spec import TaskSpec

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


@dataclasses.dataclass(frozen=True)
class MamlLowOptions(InnerLoopOptions):
    """``maml_low``: the inner-loop options and the Conv-4's."""

    filters: int = option(48, "Conv-4 channels.", minimum=1)
    num_blocks: int = option(4, "Conv-4 blocks (each halves H and W).", minimum=1)
    conv: str = option("auto", "Convolution implementation (models.conv).", choices=CONV_IMPLS)


@dataclasses.dataclass(frozen=True)
class MamlHighOptions(InnerLoopOptions):
    """``maml_high``: the inner-loop options, the SE-DenseNet's and the head's."""

    filters: int = option(48, "Adaptable head channels.", minimum=1)
    embed_filters: int = option(64, "SE-DenseNet stem channels.", minimum=1)
    growth: int = option(64, "SE-DenseNet growth rate.", minimum=1)
    conv: str = option("auto", "Convolution implementation (models.conv).", choices=CONV_IMPLS)
    se_mlp: bool = option(False, "2-layer squeeze-excite MLPs (models.densenet).")
    shrink_transitions: bool = option(False, "Transitions back to embed_filters channels.")
    embed_init: str = option("torch", "Init of the meta-learned-only layers (the embedding; "
                             "SCA's critic).", choices=WEIGHT_INITS)
    bn_stats: str = option("running", "Embedding batch norm at validation and test: running "
                           "averages kept in meta-training (the authors' nn.BatchNorm2d) or each "
                           "set's own statistics.", choices=BN_STATS)


def _check_image_shape(image_shape) -> tuple[int, int, int]:
    shape = tuple(image_shape)
    if len(shape) != 3:
        raise UserError(f"image_shape={image_shape!r}: must be (H, W, C)")
    for dim in shape:
        positive_int("image_shape", dim)
    return shape


def maml_low_loop(spec: TaskSpec, image_shape=(28, 28, 1),
                  opts: MamlLowOptions = MamlLowOptions()) -> InnerLoop:
    """The inner-loop pieces of ``maml_low`` (see ``maml_low``)."""
    shape = _check_image_shape(image_shape)
    if min(shape[:2]) < 2**opts.num_blocks:
        raise UserError(f"image_shape {shape} is too small for {opts.num_blocks} 2x2 max-pools "
                        f"(needs H, W >= {2**opts.num_blocks})")
    steps = spec.nss * opts.inner_steps + opts.target_bn_row if opts.per_step_bn else 1
    net = MamlConv4(spec.num_outputs, opts.filters, opts.num_blocks, steps, opts.conv)
    return make_inner_loop(spec, shape, net, opts)


def maml_high_loop(spec: TaskSpec, image_shape=(28, 28, 1), extra_steps: int = 0,
                   opts: MamlHighOptions = MamlHighOptions()) -> InnerLoop:
    """The inner-loop pieces of ``maml_high`` (SCA passes ``extra_steps=1``)."""
    shape = _check_image_shape(image_shape)
    if min(shape[:2]) < 4:
        raise UserError(f"image_shape {shape} is too small for the SE-DenseNet (needs H, W >= 4)")
    steps = (spec.nss * opts.inner_steps + extra_steps + opts.target_bn_row
             if opts.per_step_bn else 1)
    running = opts.bn_stats == "running"
    embed = SEDenseNet(opts.embed_filters, opts.growth, conv_impl=opts.conv, se_mlp=opts.se_mlp,
                       shrink_transitions=opts.shrink_transitions,
                       norm="train" if running else "batch")
    head = AdaptableHead(spec.num_outputs, opts.filters, steps, opts.conv, se_mlp=opts.se_mlp)
    return make_inner_loop(spec, shape, head, opts, embed=embed, extra_steps=extra_steps,
                           embed_init=opts.embed_init,
                           embed_eval=embed.clone(norm="eval") if running else None)


def maml_low(spec: TaskSpec, opts: MamlLowOptions = MamlLowOptions(), *,
             image_shape=(28, 28, 1)) -> Learner:
    """MAML++ low-end: Conv-4, every weight adapts."""
    return assemble("maml_low", maml_low_loop(spec, image_shape, opts))


def maml_high(spec: TaskSpec, opts: MamlHighOptions = MamlHighOptions(), *,
              image_shape=(28, 28, 1)) -> Learner:
    """MAML++ high-end: SE-DenseNet embedding (outer loop only) + adaptable head."""
    return assemble("maml_high", maml_high_loop(spec, image_shape, opts=opts))
