"""How each FLUID method scores classes: one ``Head`` per classifier family.

A ``Head`` is what differs between methods (``methods.py`` builds the rest):
``init_weights`` (what training phases learn, from the pretrained params),
``logits`` (features [n, D] -> [n, K]), ``representations`` (the [K, D] class
representations MDT measures distance to; ``mdt`` says in which of
``classifiers.MDT_METRICS``), and, for the methods that need them, ``prepare`` (run on
the weights before each training step: Weight Imprinting imprints new classes)
and ``penalty`` (extra loss: LwF's distillation, EWC's quadratic penalty).

Pretrained params (``fluid.pretraining``): ``params["embed"]`` the backbone,
``params["head"]`` = {"kernel" [D, P], "bias" [P]} the linear head over the P
pretrain classes, optionally ``params["fisher"]`` (EWC) and
``params["temperature"]`` (Meta-Baseline).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from cfsl_jax.protocol import metrics
from cfsl_jax.fluid import classifiers as cls

Weights = Any  # a pytree ({} for instance-based methods)


class Head(NamedTuple):
    init_weights: Callable[[Any, jax.Array, int], Weights]  # (params, key, D) -> weights
    logits: Callable[[Weights, cls.ClassMemory, jax.Array], jax.Array]  # f [n, D] -> [n, K]
    representations: Callable[[Weights, cls.ClassMemory], jax.Array]  # [K, D] for MDT
    mdt: str = "cosine"  # MDT's measure (classifiers.MDT_METRICS)
    prepare: Callable[[Weights, cls.ClassMemory], Weights] | None = None
    trains_backbone: bool = False
    penalty: Callable[..., jax.Array] | None = None  # (params, weights, images, memory) -> loss


def _no_weights(params, key, dim):
    return {}


def ncm(num_classes: int, metric: str = "euclidean", scale: float = 10.0,
        centroid: str = "unit_mean") -> Head:
    """Nearest class mean: ``-||f - m_k||^2`` on raw features (the paper), or ``scale * cos``
    to a centroid per class: ``"unit_mean"`` the mean of the normalised features (NCM's cosine
    option), ``"mean"`` the mean of the raw features (Meta-Baseline, Chen et al.: the centroid
    is the mean feature, then cosine -- as its meta-training, ``fluid.meta_pretraining``)."""
    if metric == "euclidean":
        return Head(_no_weights,
                    lambda w, memory, f: metrics.neg_sq_euclidean(f, cls.class_means(memory)),
                    # MDT: the minimum cosine distance to a class mean (the paper's Figure 5a).
                    lambda w, memory: cls.class_means(memory), mdt="cosine")

    centroids = {"unit_mean": cls.unit_means, "mean": cls.class_means}[centroid]
    # Meta-Baseline's temperature, when meta-training learned one (fixed in the stream).
    return Head(lambda params, key, dim: {"scale": jnp.float32(params.get("temperature", scale))},
                lambda w, memory, f: cls.cosine_logits(f, centroids(memory), w["scale"]),
                lambda w, memory: centroids(memory))


def exemplar_tuning(num_classes: int, similarity: str = "dot", scale: float = 10.0) -> Head:
    """C_k = mean normalised feature + residual r_k (init 0); ``C_k . f`` (paper) or cosine."""

    def representations(weights, memory):
        return cls.unit_means(memory) + weights["residuals"]

    def logits(weights, memory, features):
        if similarity == "dot":
            return features @ representations(weights, memory).T
        return cls.cosine_logits(features, representations(weights, memory), scale)

    def init_weights(params, key, dim):
        return {"residuals": jnp.zeros((num_classes, dim), jnp.float32)}

    # MDT in the classifier's own similarity: the maximum C_k . f (the paper's Figure 5b).
    return Head(init_weights, logits, representations, mdt=similarity)


def _imprinted(weights, memory):
    """Rows not imprinted yet (zero) are represented by the class's normalised mean."""
    imprinted = jnp.any(weights["classifier"] != 0, axis=-1, keepdims=True)
    return jnp.where(imprinted, weights["classifier"], cls.normalise(cls.unit_means(memory)))


def _imprint(weights, memory):
    """Imprint every seen class that is not imprinted yet."""
    return {**weights, "classifier": jnp.where(cls.seen(memory)[:, None],
                                               _imprinted(weights, memory), 0.0)}


def imprinting(num_classes: int, scale: float = 4.0, learn_scale: bool = True,
               mdt_to: str = "means") -> Head:
    """Cosine classifier ``s * cos(f, w_k)``, w_k imprinted with the class mean; s learnable.

    MDT measures the cosine distance to ``mdt_to``: ``"means"`` the normalised
    class means the rows are imprinted from (the default: one scale over the whole
    stream), or ``"weights"`` the rows w_k themselves (the paper's rule for a
    linear layer, its column vectors). Rows trained at lr 0.1 sit farther from
    the features than the means of classes seen since the last phase, so with
    ``"weights"`` the score jumps when training starts and the pooled AUROC
    inverts though each period ranks well (``docs/fidelity.md``).
    """

    def logits(weights, memory, features):
        s = jnp.exp(weights["log_scale"]) if learn_scale else scale
        return cls.cosine_logits(features, _imprinted(weights, memory), s)

    def init_weights(params, key, dim):
        return {"classifier": jnp.zeros((num_classes, dim), jnp.float32),
                "log_scale": jnp.log(jnp.float32(scale))}

    representations = {"weights": _imprinted,
                       "means": lambda weights, memory: cls.unit_means(memory)}[mdt_to]
    return Head(init_weights, logits, representations, prepare=_imprint)


def linear(num_classes: int, trains_backbone: bool, known: bool = True,
           penalty: Callable | None = None) -> Head:
    """A linear head W f + b over the K classes; the pretrain rows start from the pretrained head.

    The novel rows start at zero (the authors' fresh ``nn.Linear`` is random:
    a random row of a class just seen can outvote the pretrained head before
    any training). ``known=False``: every row from flax's default init.
    """
    dense = nn.Dense(num_classes)

    def logits(weights, memory, features):
        return dense.apply({"params": weights["head"]}, features)

    def init_weights(params, key, dim):
        head = dense.init(key, jnp.zeros((1, dim), jnp.float32))["params"]
        if known and "head" in params:
            p = params["head"]["bias"].shape[0]
            head = {"kernel": jnp.zeros_like(head["kernel"]).at[:, :p].set(
                        params["head"]["kernel"]),
                    "bias": jnp.zeros_like(head["bias"]).at[:p].set(params["head"]["bias"])}
        weights = {"head": head}
        if trains_backbone:  # a copy: the stream trains it, params stay the pretrained net
            weights["embed"] = jax.tree.map(jnp.copy, params["embed"])
        return weights

    def representations(weights, memory):  # MDT on a linear layer: its class vectors
        return weights["head"]["kernel"].T

    # MDT: the maximum similarity w_k . f to a class's column (the paper's Figure 5c).
    return Head(init_weights, logits, representations, mdt="dot",
                trains_backbone=trains_backbone, penalty=penalty)


def lwf_penalty(embed_apply, temperature: float = 2.0, weight: float = 1.0) -> Callable:
    """LwF: distil the frozen pretrained model's softmax over the pretrain classes (T = 2)."""

    def penalty(params, weights, images, features, mask):
        p = params["head"]["bias"].shape[0]
        teacher = embed_apply(params["embed"], images) @ params["head"]["kernel"] + \
            params["head"]["bias"]
        student = (features @ weights["head"]["kernel"] + weights["head"]["bias"])[:, :p]
        target = jax.nn.softmax(jax.lax.stop_gradient(teacher) / temperature)
        losses = optax.softmax_cross_entropy(student / temperature, target)
        w = mask.astype(losses.dtype)
        return weight * temperature**2 * jnp.sum(losses * w) / jnp.maximum(jnp.sum(w), 1.0)

    return penalty


def ewc_penalty(weight: float) -> Callable:
    """EWC: ``weight / 2 * sum F (theta - theta*)^2`` over the backbone, theta* pretrained."""

    def penalty(params, weights, images, features, mask):
        terms = jax.tree.map(lambda f, w, w0: jnp.sum(f * (w - w0) ** 2), params["fisher"],
                             weights["embed"], params["embed"])
        return 0.5 * weight * sum(jax.tree.leaves(terms))

    return penalty


def oltr(num_classes: int, scale: float = 16.0) -> Head:
    """OLTR's meta-embedding on frozen features, with a cosine classifier (Liu et al. 2019).

    v_meta = (f + tanh(T_sel f) * (softmax(T_hal f) @ M)) / gamma, M the class
    centroids (raw means), gamma the reachability ``min_k ||f - m_k||``; logits
    ``scale * cos(v_meta, w_k)``, w_k imprinted like Weight Imprinting.
    """

    def meta_embedding(weights, memory, features):
        means = cls.class_means(memory)
        seen = cls.seen(memory)
        attention = jax.nn.softmax(jnp.where(seen, features @ weights["hallucinator"], -1e9))
        selector = jnp.tanh(features @ weights["selector"])
        distances = -metrics.neg_sq_euclidean(features, means)
        reach = jnp.sqrt(jnp.maximum(jnp.min(jnp.where(seen, distances, jnp.inf), -1), 1e-6))
        reach = jnp.where(jnp.isfinite(reach), reach, 1.0)[:, None]
        return (features + selector * (attention @ means)) / reach

    def logits(weights, memory, features):
        return cls.cosine_logits(meta_embedding(weights, memory, features),
                                 _imprinted(weights, memory), scale)

    def init_weights(params, key, dim):
        return {"classifier": jnp.zeros((num_classes, dim), jnp.float32),
                "selector": jnp.zeros((dim, dim), jnp.float32),
                "hallucinator": jnp.zeros((dim, num_classes), jnp.float32)}

    return Head(init_weights, logits, lambda w, memory: cls.class_means(memory), mdt="euclidean",
                prepare=_imprint)
