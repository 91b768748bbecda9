"""Pieces shared by the FLUID methods: class memory, cosine scores, unseen-class detectors.

- ``ClassMemory``: running sums of L2-normalised features and counts per
  stream class (fixed shape [K, D] / [K]); a class is *seen* once its count is
  positive. Its mean is the NCM class mean; running sums make the mean after
  t updates equal to the batch mean of those t features.
- Predictions are restricted to seen classes; before any class is seen the
  predicted label is -1 (always wrong).
- Unseen-class scores (higher = more likely a class not seen so far):
  ``mdt`` (Minimum Distance Thresholding): the Euclidean distance from the
  normalised feature to the nearest normalised class representation of a
  seen class (+inf when none is seen); ``softmax`` (Hendrycks & Gimpel's
  maximum softmax probability): ``1 - max softmax`` over the seen classes'
  logits (1 when none is seen). A threshold on either score is the detector;
  the protocol reports the threshold-free AUROC.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

DETECTORS = ("mdt", "softmax")
_EPS = 1e-12


class ClassMemory(NamedTuple):
    sums: jax.Array  # float32 [K, D] sum of the L2-normalised features of each class
    counts: jax.Array  # float32 [K] samples of each class seen so far


def memory_init(num_classes: int, dim: int) -> ClassMemory:
    return ClassMemory(jnp.zeros((num_classes, dim), jnp.float32),
                       jnp.zeros((num_classes,), jnp.float32))


def memory_add(memory: ClassMemory, feature: jax.Array, label: jax.Array) -> ClassMemory:
    """Absorb one normalised feature [D] of class ``label`` (int32 scalar)."""
    return ClassMemory(memory.sums.at[label].add(feature), memory.counts.at[label].add(1.0))


def class_means(memory: ClassMemory) -> jax.Array:
    """float32 [K, D]: mean normalised feature per class (0 for unseen classes)."""
    return memory.sums / jnp.maximum(memory.counts, 1.0)[:, None]


def seen(memory: ClassMemory) -> jax.Array:
    return memory.counts > 0  # bool [K]


def normalise(x: jax.Array) -> jax.Array:
    """L2-normalise the last axis (a zero vector stays zero)."""
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), _EPS))


def cosine_logits(features: jax.Array, representations: jax.Array, scale: float) -> jax.Array:
    """``scale * cos(feature, representation)``: [n, D] x [K, D] -> [n, K]."""
    return scale * normalise(features) @ normalise(representations).T


def mask_unseen(logits: jax.Array, seen_mask: jax.Array) -> jax.Array:
    return jnp.where(seen_mask, logits, -jnp.inf)


def decide(logits: jax.Array, seen_mask: jax.Array) -> jax.Array:
    """int32 label: argmax of [K] logits over the seen classes, -1 if none is seen."""
    label = jnp.argmax(mask_unseen(logits, seen_mask)).astype(jnp.int32)
    return jnp.where(jnp.any(seen_mask), label, -1)


def mdt_score(feature: jax.Array, representations: jax.Array, seen_mask: jax.Array) -> jax.Array:
    """Distance from normalised ``feature`` [D] to the nearest seen representation [K, D]."""
    distances = jnp.linalg.norm(normalise(feature)[None] - normalise(representations), axis=-1)
    return jnp.min(jnp.where(seen_mask, distances, jnp.inf))


def max_softmax_score(logits: jax.Array, seen_mask: jax.Array) -> jax.Array:
    """``1 - max softmax`` of [K] logits over the seen classes (1 if none is seen)."""
    probabilities = jax.nn.softmax(mask_unseen(logits, seen_mask))  # NaN if none is seen
    return jnp.where(jnp.any(seen_mask), 1.0 - jnp.max(probabilities), 1.0)


def unseen_score(detector: str, feature: jax.Array, logits: jax.Array,
                 representations: jax.Array, seen_mask: jax.Array) -> jax.Array:
    if detector == "mdt":
        return mdt_score(feature, representations, seen_mask)
    return max_softmax_score(logits, seen_mask)


def check_detector(detector: str) -> None:
    if detector not in DETECTORS:
        raise ValueError(f"detector={detector!r}; valid: {DETECTORS}")


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, sample_mask: jax.Array,
                         seen_mask: jax.Array) -> jax.Array:
    """Mean CE over the masked samples of [B, K] logits, softmax over the seen classes only."""
    # A large negative (not -inf) keeps the gradient finite for masked-out samples.
    logits = jnp.where(seen_mask, logits, -1e9)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    weights = sample_mask.astype(logits.dtype)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)
