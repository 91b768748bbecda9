"""Pieces shared by the FLUID methods: class memory, similarities, unseen-class detectors.

- ``ClassMemory``: per stream class, running sums of raw features, of
  L2-normalised features, and counts (fixed shapes [K, D] / [K]), plus
  ``known`` [K]: the classes known when the stream starts (the pretrain
  classes, whose pretraining images filled the sums). A class is *seen* once it
  is known or its count is positive; predictions are restricted to seen
  classes (before any is seen the predicted label is -1, always wrong).
- Similarities (``logits`` [n, K], higher = closer): ``euclidean`` = minus the
  squared distance to the raw class means (the paper's NCM, Appendix D),
  ``cosine`` = ``scale * cos``, ``dot`` = ``C_k . f``.
- Unseen-class scores (higher = more likely a class not seen so far):
  ``mdt`` (Minimum Distance Thresholding): how far the feature is from the
  nearest class representation of a seen class, in one of ``MDT_METRICS``:
  ``euclidean`` (raw vectors), ``cosine`` (Euclidean between unit vectors, a
  monotone function of the cosine distance), ``dot`` (minus the maximum
  similarity ``c_k . f``: the paper's MDT for Exemplar Tuning and linear layers,
  its Figure 5 b-c); +inf when none is seen. ``softmax`` (Hendrycks & Gimpel):
  ``1 - max softmax`` over the seen classes' logits (1 when none is seen).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


DETECTORS = ("mdt", "softmax")
MDT_METRICS = ("euclidean", "cosine", "dot")
_EPS = 1e-12


class ClassMemory(NamedTuple):
    sums: jax.Array  # float32 [K, D] sum of the raw features of each class
    unit_sums: jax.Array  # float32 [K, D] sum of the L2-normalised features of each class
    counts: jax.Array  # float32 [K] samples absorbed per class (pretraining images included)
    known: jax.Array  # bool [K] classes known at the stream start


def memory_init(num_classes: int, dim: int, known: "KnownClasses | None" = None) -> ClassMemory:
    """An empty memory, or one holding the pretraining statistics of the known classes."""
    memory = ClassMemory(jnp.zeros((num_classes, dim), jnp.float32),
                         jnp.zeros((num_classes, dim), jnp.float32),
                         jnp.zeros((num_classes,), jnp.float32),
                         jnp.zeros((num_classes,), bool))
    if known is None:
        return memory
    p = known.counts.shape[0]
    return ClassMemory(memory.sums.at[:p].set(known.sums),
                       memory.unit_sums.at[:p].set(known.unit_sums),
                       memory.counts.at[:p].set(known.counts),
                       memory.known.at[:p].set(known.counts > 0))  # a class with images


class KnownClasses(NamedTuple):
    """Feature statistics of the P pretrain classes over their pretraining images."""

    sums: jax.Array  # float32 [P, D]
    unit_sums: jax.Array  # float32 [P, D]
    counts: jax.Array  # float32 [P]


def memory_add(memory: ClassMemory, feature: jax.Array, label: jax.Array) -> ClassMemory:
    """Absorb one raw feature [D] of class ``label`` (int32 scalar)."""
    return memory._replace(sums=memory.sums.at[label].add(feature),
                           unit_sums=memory.unit_sums.at[label].add(normalise(feature)),
                           counts=memory.counts.at[label].add(1.0))


def class_means(memory: ClassMemory) -> jax.Array:
    """float32 [K, D]: mean raw feature per class (0 for classes with no samples)."""
    return memory.sums / jnp.maximum(memory.counts, 1.0)[:, None]


def unit_means(memory: ClassMemory) -> jax.Array:
    """float32 [K, D]: mean L2-normalised feature per class (0 for classes with no samples)."""
    return memory.unit_sums / jnp.maximum(memory.counts, 1.0)[:, None]


def seen(memory: ClassMemory) -> jax.Array:
    return memory.known | (memory.counts > 0)  # bool [K]


def normalise(x: jax.Array) -> jax.Array:
    """L2-normalise the last axis (a zero vector stays zero)."""
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), _EPS))


def cosine_logits(features: jax.Array, representations: jax.Array, scale) -> jax.Array:
    """``scale * cos(feature, representation)``: [n, D] x [K, D] -> [n, K]."""
    return scale * normalise(features) @ normalise(representations).T


def mask_unseen(logits: jax.Array, seen_mask: jax.Array) -> jax.Array:
    return jnp.where(seen_mask, logits, -jnp.inf)


def decide(logits: jax.Array, seen_mask: jax.Array) -> jax.Array:
    """int32 label: argmax of [K] logits over the seen classes, -1 if none is seen."""
    label = jnp.argmax(mask_unseen(logits, seen_mask)).astype(jnp.int32)
    return jnp.where(jnp.any(seen_mask), label, -1)


def mdt_score(feature: jax.Array, representations: jax.Array, seen_mask: jax.Array,
              metric: str) -> jax.Array:
    """How far ``feature`` [D] is from the nearest seen representation [K, D] (``MDT_METRICS``)."""
    if metric == "dot":
        return -jnp.max(jnp.where(seen_mask, representations @ feature, -jnp.inf))
    if metric == "cosine":
        feature, representations = normalise(feature), normalise(representations)
    distances = jnp.linalg.norm(feature[None] - representations, axis=-1)
    return jnp.min(jnp.where(seen_mask, distances, jnp.inf))


def max_softmax_score(logits: jax.Array, seen_mask: jax.Array) -> jax.Array:
    """``1 - max softmax`` of [K] logits over the seen classes (1 if none is seen)."""
    probabilities = jax.nn.softmax(mask_unseen(logits, seen_mask))  # NaN if none is seen
    return jnp.where(jnp.any(seen_mask), 1.0 - jnp.max(probabilities), 1.0)


def unseen_score(detector: str, feature: jax.Array, logits: jax.Array,
                 representations: jax.Array, seen_mask: jax.Array, metric: str) -> jax.Array:
    if detector == "mdt":
        return mdt_score(feature, representations, seen_mask, metric)
    return max_softmax_score(logits, seen_mask)
