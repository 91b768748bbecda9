"""Prototypical networks, continual: running per-label prototype sums and counts.

Only the sums [num_outputs, D] and counts [num_outputs] cross support sets (the
ATM); the Conv-4 embedding (64 filters) is meta-trained episodically. Labels
not yet seen in the task are masked out of the prediction.

Batch norm (``bn_stats``): "running" (default, as the authors' ``nn.BatchNorm2d``,
``standard_neural_network_architectures.py`` at FewShotContinualLearning commit
abc7c72): meta-training normalises each support set and the target set with
their own batch statistics and folds those statistics into running averages
(``Learner.running_bn``, one forward pass after the other); validation and
test (``Learner.evaluation``) normalise with the running averages, so each
target prediction depends on that sample and the support sets only. "batch":
every set is normalised with its own statistics in evaluation too (the target
set transductively).

Defaults follow the paper (Snell et al.'s ProtoNets, which the paper cites):
a prototype is the mean embedding of a label's support samples, logits are
negative squared Euclidean distances. The embedding is initialised as the
authors' ``VGGEmbeddingNetwork`` (plain ``torch.nn`` layers: PyTorch's default
uniform +-1/sqrt(fan_in), ``weight_init="original"``; "lecun": Flax's default,
the previous init).

"As published" options (off by default), from the paper-era code
(FewShotContinualLearning commit 39025a3, ``few_shot_learning_system.py``,
``MatchingNetworkFewShotClassifier.forward``):

- ``last_sample_prototype=True``: a label's prototype is its most recent
  support embedding divided by NSS*KS. The code meant to average the
  embeddings, but counted them in a dict keyed by label *tensors*, which
  never compare equal as keys: every sample was written to slot 0 of a
  zero buffer of NSS*KS slots, and the mean over the slots is the last
  sample / (NSS*KS). The state then carries the last embedding per label
  (same shapes as the sums).
- ``distance="dot"``: logits are dot products with the prototypes
  (``calculate_cosine_distance`` computes an unnormalised dot product), in
  place of ``"squared_euclidean"``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cfsl_jax.learners.base import Learner, RunningBN, check_image_shape, embedding_dim
from cfsl_jax.models.conv4 import Conv4
from cfsl_jax.models.init import reinitialize
from cfsl_jax.models.norm import collect_moments
from cfsl_jax.spec import TaskSpec

DISTANCES: tuple[str, ...] = ("squared_euclidean", "dot")
WEIGHT_INITS: tuple[str, ...] = ("original", "lecun")
BN_STATS: tuple[str, ...] = ("running", "batch")


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


def protonets(spec: TaskSpec, image_shape: tuple[int, int, int] = (28, 28, 1),
              filters: int = 64, activation: str = "relu",
              state_dtype: jnp.dtype = jnp.float32, last_sample_prototype: bool = False,
              distance: str = "squared_euclidean", weight_init: str = "original",
              bn_stats: str = "running") -> Learner:
    """A ProtoNets learner for ``spec`` and inputs of ``image_shape``.

    ``state_dtype`` is the dtype of the carried sums (bf16 halves their bytes);
    counts are int32. ``last_sample_prototype`` (False), ``distance``
    ("squared_euclidean" or "dot"), ``weight_init`` ("original" or "lecun") and
    ``bn_stats`` ("running" or "batch"): see the module doc.
    """
    if not isinstance(last_sample_prototype, bool):
        raise ValueError(f"last_sample_prototype must be a bool, got {last_sample_prototype!r}")
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    if weight_init not in WEIGHT_INITS:
        raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {weight_init!r}")
    if bn_stats not in BN_STATS:
        raise ValueError(f"bn_stats must be one of {BN_STATS}, got {bn_stats!r}")
    running = bn_stats == "running"
    embed = Conv4(filters=filters, activation=activation, norm="train" if running else "batch")
    scheme = "torch" if weight_init == "original" else "lecun"

    def init_params(key, example_x, spec):
        check_image_shape(example_x, image_shape)
        variables = embed.init(key, example_x)
        variables = {k: variables[k] for k in ("params", "batch_stats") if k in variables}
        return reinitialize(variables, jax.random.fold_in(key, 1), scheme)

    def init(params, key, spec):
        del key
        dim = embedding_dim(embed, params, image_shape)
        return ProtoState(jnp.zeros((spec.num_outputs, dim), state_dtype),
                          jnp.zeros((spec.num_outputs,), jnp.int32))

    def learner(embed: Conv4, **fields) -> Learner:
        adapt, predict = _episode_fns(embed, spec, state_dtype, last_sample_prototype, distance)
        return Learner("protonets", spec, init_params, init, adapt, predict, **fields)

    if not running:
        return learner(embed)

    def moments(params, support_x, target_x):
        def of(x):
            _, variables = embed.apply(params, x, mutable=["intermediates"])
            return collect_moments(variables["intermediates"])
        per_set = jax.vmap(of)(support_x)
        return jax.tree.map(lambda s, t: jnp.concatenate([s, t[None]]), per_set, of(target_x))

    return learner(embed, evaluation=learner(embed.clone(norm="eval")),
                   running_bn=RunningBN("batch_stats", moments))


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
            logits = -(jnp.sum(features**2, -1, keepdims=True) - 2 * features @ prototypes.T
                       + jnp.sum(prototypes**2, -1))
        return jnp.where(state.counts > 0, logits, jnp.finfo(features.dtype).min)

    return adapt, predict
