"""Prototypical networks, continual: running per-label prototype sums and counts.

Only the sums [num_outputs, D] and counts [num_outputs] cross support sets (the
ATM); the Conv-4 embedding (64 filters) is meta-trained episodically. Labels
not yet seen in the task are masked out of the prediction.

Batch norm (``bn_stats``): "running" (default, as the authors' ``nn.BatchNorm2d``,
``standard_neural_network_architectures.py`` at FewShotContinualLearning commit
abc7c72): meta-training normalises each support set and the target set with
their own batch statistics and folds those statistics into running averages
(``Recipe.running_bn``, one forward pass after the other); validation and
test (``Recipe.evaluation``) normalise with the running averages, so each
target prediction depends on that sample and the support sets only. "batch":
every set is normalised with its own statistics in evaluation too (the target
set transductively).

Defaults follow the paper (Snell et al.'s ProtoNets, which the paper cites):
a prototype is the mean embedding of a label's support samples, logits are
negative squared Euclidean distances (``metrics.neg_sq_euclidean``). The
embedding's layers are drawn with PyTorch's default (``weight_init="torch"``,
as the authors' ``VGGEmbeddingNetwork`` of plain ``torch.nn`` layers).

"As published" options (off by default; docs/fidelity.md has the authors'
code they follow):

- ``last_sample_prototype=True``: a label's prototype is its most recent
  support embedding divided by NSS*KS (the paper-era code's mean over a
  buffer of NSS*KS slots of which only one was written). The state then
  carries the last embedding per label (same shapes as the sums).
- ``distance="dot"``: logits are dot products with the prototypes, in place
  of ``"squared_euclidean"``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from cfsl_jax.protocol import metrics
from cfsl_jax.learners.shapes import check_image_shape, embedding_dim
from cfsl_jax.protocol.learner import Learner, Recipe, RunningBN
from cfsl_jax.models.conv import CONV_IMPLS
from cfsl_jax.models.conv4 import ACTIVATIONS, BLOCK_ORDERS, Conv4
from cfsl_jax.models.init import WEIGHT_INITS, reinitialize
from cfsl_jax.models.norm import collect_moments
from cfsl_jax.runtime.options import check_fields, option
from cfsl_jax.protocol.spec import TaskSpec

DISTANCES: tuple[str, ...] = ("squared_euclidean", "dot")
BN_STATS: tuple[str, ...] = ("running", "batch")
TASKS_ON_CPU: tuple[str, ...] = ("in_turn", "vmap")


class ProtoState(NamedTuple):
    sums: jax.Array  # float [num_outputs, D] sum of embeddings per label (or the last one)
    counts: jax.Array  # int32 [num_outputs] support samples seen per label


def last_per_label(features: jax.Array, labels: jax.Array, previous: jax.Array) -> jax.Array:
    """[O, D]: each label's last embedding in ``features`` [n, D]; ``previous`` where absent."""
    positions = jnp.where(labels[:, None] == jnp.arange(previous.shape[0]),
                          jnp.arange(labels.shape[0])[:, None], -1)
    last = jnp.max(positions, axis=0)  # [O] index of the label's last sample, -1 if none
    return jnp.where((last >= 0)[:, None], features[jnp.maximum(last, 0)],
                     previous.astype(features.dtype))


@dataclasses.dataclass(frozen=True)
class ProtoNetsOptions:
    """``protonets``: the embedding's and the prototype rule's options (module doc)."""

    filters: int = option(64, "Conv-4 channels.", minimum=1)
    activation: str = option("relu", "Conv-4 activation.", choices=tuple(ACTIVATIONS))
    block_order: str = option("conv_norm_act", "Conv-4 block: conv, batch norm, activation "
                              "(Snell et al.) or conv, activation, batch norm (the authors' "
                              "ConvReLUBatchNorm: a signed embedding).", choices=BLOCK_ORDERS)
    conv_bias: bool = option(True, "Conv-4 convolutions with a bias (the authors' "
                             "ConvReLUBatchNorm has none: bias=False; under conv_norm_act the "
                             "batch norm cancels it, under conv_act_norm it acts before the "
                             "activation).")
    last_sample_prototype: bool = option(False, "A label's prototype is its last support "
                                         "embedding / (NSS*KS), as the paper-era code.")
    distance: str = option("squared_euclidean", "Logits: negative squared Euclidean "
                           "distances or dot products to the prototypes.", choices=DISTANCES)
    weight_init: str = option("torch", "Init of the embedding's layers (models.init).",
                              choices=WEIGHT_INITS)
    bn_stats: str = option("running", "Batch norm at validation and test: running averages "
                           "kept in meta-training (the authors' nn.BatchNorm2d) or each set's "
                           "own statistics.", choices=BN_STATS)
    conv: str = option("auto", "Convolution implementation (models.conv). 'auto': "
                       "im2col in meta-training (models.conv.AUTO_IMPLS, every backend), "
                       "gemm_grad (XLA's convolution) in validation and test, which take no "
                       "gradients; runs saved before this default ran 'gemm_grad'.",
                       choices=CONV_IMPLS)
    tasks_on_cpu: str = option("in_turn", "How a CPU device runs a batch of tasks: one at a "
                               "time ('in_turn', the faster program there) or one 'vmap' (runs "
                               "saved before this option existed; rounding apart, the same "
                               "numbers). "
                               "Accelerators run one vmap either way.", choices=TASKS_ON_CPU)

    def __post_init__(self):
        check_fields(self)


def protonets(spec: TaskSpec, opts: ProtoNetsOptions = ProtoNetsOptions(), *,
              image_shape: tuple[int, int, int] = (28, 28, 1),
              state_dtype: jnp.dtype = jnp.float32) -> Learner:
    """A ProtoNets learner for ``spec`` and inputs of ``image_shape``.

    ``state_dtype`` is the dtype of the carried sums (bf16 halves their bytes);
    counts are int32.
    """
    last_sample_prototype, distance = opts.last_sample_prototype, opts.distance
    running = opts.bn_stats == "running"
    embed = Conv4(filters=opts.filters, activation=opts.activation,
                  norm="train" if running else "batch", conv_impl=opts.conv,
                  block_order=opts.block_order, use_bias=opts.conv_bias)

    def init_params(key, example_x, spec):
        check_image_shape(example_x, image_shape)
        variables = embed.init(key, example_x)
        variables = {k: variables[k] for k in ("params", "batch_stats") if k in variables}
        return reinitialize(variables, jax.random.fold_in(key, 1), opts.weight_init)

    def init(params, key, spec):
        del key
        dim = embedding_dim(embed, params, image_shape)
        return ProtoState(jnp.zeros((spec.num_outputs, dim), state_dtype),
                          jnp.zeros((spec.num_outputs,), jnp.int32))

    def learner(embed: Conv4, recipe: Recipe = Recipe()) -> Learner:
        adapt, predict = _episode_fns(embed, spec, state_dtype, last_sample_prototype, distance)
        return Learner("protonets", spec, init_params, init, adapt, predict,
                       recipe._replace(vmap_on_cpu=opts.tasks_on_cpu == "vmap"))

    # conv=auto: im2col where gradients are taken (meta-training: 1.1-1.2x faster than gemm_grad,
    # and it batches under vmap), gemm_grad -- XLA's convolution forward -- in validation and
    # test, which take none: the same function without im2col's patches (the 50-task test
    # program's temporaries: B3 2.9 against 3.3 GB, B10 9.6 against 11.1), bit-equal to the
    # evaluation of runs saved before auto was the default
    evaluated = embed.clone(conv_impl="gemm_grad") if opts.conv == "auto" else embed
    if not running:
        return learner(embed, Recipe(evaluation=None if evaluated is embed
                                     else learner(evaluated)))

    def moments(params, support_x, target_x):
        def of(x):
            _, variables = embed.apply(params, x, mutable=["intermediates"])
            return collect_moments(variables["intermediates"])
        per_set = jax.vmap(of)(support_x)
        return jax.tree.map(lambda s, t: jnp.concatenate([s, t[None]]), per_set, of(target_x))

    return learner(embed, Recipe(evaluation=learner(evaluated.clone(norm="eval")),
                                 running_bn=RunningBN("batch_stats", moments)))


def _episode_fns(embed: Conv4, spec: TaskSpec, state_dtype, last_sample_prototype: bool,
                 distance: str):
    """ProtoNets' (adapt, predict) with the embedding ``embed``."""

    def adapt(params, state, support_x, support_y):
        features = embed.apply(params, support_x)
        counts = state.counts + jnp.sum(support_y[:, None] == jnp.arange(spec.num_outputs),
                                        axis=0, dtype=jnp.int32)
        if last_sample_prototype:
            return ProtoState(last_per_label(features, support_y, state.sums).astype(state_dtype),
                              counts)
        one_hot = jax.nn.one_hot(support_y, spec.num_outputs, dtype=features.dtype)
        return ProtoState((state.sums + (one_hot.T @ features)).astype(state_dtype), counts)

    def predict(params, state, target_x):
        features = embed.apply(params, target_x)
        divisor = (jnp.full(state.counts.shape, spec.nss * spec.ks) if last_sample_prototype
                   else jnp.maximum(state.counts, 1))
        prototypes = (state.sums.astype(jnp.float32) / divisor[:, None]).astype(features.dtype)
        if distance == "dot":
            logits = features @ prototypes.T
        else:
            logits = metrics.neg_sq_euclidean(features, prototypes)
        return jnp.where(state.counts > 0, logits, jnp.finfo(features.dtype).min)

    return adapt, predict
