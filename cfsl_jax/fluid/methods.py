"""FLUID methods on one pretrained Conv-4 backbone, from one factory.

Every method L2-normalises the backbone's features, keeps a ``ClassMemory``
(running sums/counts of the normalised features per stream class, updated on
every sample) and predicts among the classes seen so far. They differ in the
classifier and in what training phases learn:

| method            | class score for feature f                        | trained every U samples  |
| ----------------- | ------------------------------------------------ | ------------------------ |
| ``ncm``           | s * cos(f, mean_k)                               | nothing (instance-based) |
| ``exemplar_tuning`` | s * cos(f, normalise(mean_k) + r_k)            | residuals r (init 0)     |
| ``imprinting``    | s * cos(f, w_k); w_k = normalise(mean_k) until   | w                        |
|                   | class k's first training phase imprints it there |                          |
| ``finetune``      | linear head W f + b (fresh init)                 | the head                 |
| ``standard``      | linear head on a backbone that is trained too    | backbone + head (images) |

``s`` = ``scale`` (10; the linear heads ignore it). ``mean_k`` is the running mean of normalised features,
so Exemplar Tuning with zero residuals is exactly NCM, and imprinting is NCM
until a phase trains. Frozen-backbone methods train on stored features;
``standard`` trains on images, and its class memory (used by ``mdt``) holds
features from the backbone as it was when each sample arrived.

Training: optax SGD with momentum (``learning_rate``, ``momentum`` = 0.9),
softmax cross-entropy over the seen classes, the optimiser state carried
across phases. Default learning rates (chosen on synthetic streams, 20-100
classes, pretrained and random backbones): ``exemplar_tuning`` and
``imprinting`` 1e-3 -- cosine logits at scale 10 give residual gradients of
order 10, and at 1e-2 the CE on the head-dominated buffer drags tail classes'
representations away (accuracy and MDT AUROC fall well below NCM's);
``finetune`` 3.0 -- a fresh linear head on unit-norm features needs large
steps to learn anything in a few hundred steps; ``standard`` 0.1.

Unseen-class detector (``detector``): ``mdt`` (distance to the nearest class
representation -- the cosine methods' own representations, the class means
for the linear-head methods) or ``softmax`` (maximum softmax probability).
Defaults: ``mdt`` for the cosine methods, ``softmax`` for the linear heads.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from cfsl_jax.fluid import classifiers as cls
from cfsl_jax.fluid.backbone import conv4_backbone, feature_dim
from cfsl_jax.fluid.protocol import Method

Weights = Any  # what training phases learn: a pytree ({} for NCM)


class FluidState(NamedTuple):
    memory: cls.ClassMemory  # float32 running sums [K, D] and counts [K] of normalised features
    weights: Weights  # float32 pytree trained by train_step ({} if none)
    opt_state: optax.OptState  # SGD momentum for ``weights``


class _Classifier(NamedTuple):
    """How a method scores classes; shared by predict and train_step."""

    init_weights: Callable[[Any, jax.Array, int], Weights]  # (params, key, D) -> weights
    logits: Callable[[Weights, cls.ClassMemory, jax.Array], jax.Array]  # f [n, D] -> [n, K]
    representations: Callable[[Weights, cls.ClassMemory], jax.Array]  # [K, D] for MDT
    prepare: Callable[[Weights, cls.ClassMemory], Weights] | None = None  # before each step
    trains_backbone: bool = False


def _factory(name: str, classifier: Callable[[int, float], _Classifier], default_detector: str,
             default_learning_rate: float | None) -> Callable[..., Method]:
    """A factory ``(num_classes, image_shape, **options) -> Method`` for one method family."""

    def build(num_classes: int, image_shape: tuple[int, ...] = (28, 28, 1), *, filters: int = 64,
              activation: str = "relu", scale: float = 10.0, detector: str = default_detector,
              learning_rate: float | None = None, momentum: float = 0.9) -> Method:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes={num_classes!r} is invalid: must be an int >= 1")
        cls.check_detector(detector)
        if default_learning_rate is None and learning_rate is not None:
            raise ValueError(f"{name} is instance-based: it takes no learning_rate "
                             f"(got {learning_rate!r})")
        learning_rate = default_learning_rate if learning_rate is None else learning_rate
        if not scale > 0:
            raise ValueError(f"scale={scale!r} is invalid: must be > 0")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum={momentum!r} is invalid: must be in [0, 1)")
        if learning_rate is not None and not learning_rate > 0:
            raise ValueError(f"learning_rate={learning_rate!r} is invalid: must be > 0")
        head = classifier(num_classes, scale)
        init_params, embed_apply = conv4_backbone(image_shape, filters, activation)
        optimizer = (optax.sgd(learning_rate, momentum=momentum)
                     if learning_rate is not None else None)

        def init(params, key):
            dim = feature_dim(embed_apply, params["embed"], image_shape)
            weights = head.init_weights(params, key, dim)
            return FluidState(cls.memory_init(num_classes, dim), weights,
                              optimizer.init(weights) if optimizer else ())

        def embed_with(params, weights, x):
            embed_params = weights["embed"] if head.trains_backbone else params["embed"]
            return cls.normalise(embed_apply(embed_params, x))

        def embed(params, state, x):
            chex.assert_rank(x, 4)
            return embed_with(params, state.weights, x)

        def predict(params, state, feature):
            chex.assert_rank(feature, 1)
            seen = cls.seen(state.memory)
            logits = head.logits(state.weights, state.memory, feature[None])[0]
            score = cls.unseen_score(detector, feature, logits,
                                     head.representations(state.weights, state.memory), seen)
            return cls.decide(logits, seen), score

        def update(params, state, feature, label):
            chex.assert_rank([feature, label], [1, 0])
            return state._replace(memory=cls.memory_add(state.memory, feature, label))

        def train_step(params, state, inputs, labels, mask, key):
            del key  # the protocol draws the minibatch; SGD itself is deterministic
            chex.assert_equal_shape_prefix([inputs, labels, mask], 1)
            weights = head.prepare(state.weights, state.memory) if head.prepare else state.weights

            def loss_fn(weights):
                features = embed_with(params, weights, inputs) if head.trains_backbone else inputs
                logits = head.logits(weights, state.memory, features)
                return cls.masked_cross_entropy(logits, labels, mask, cls.seen(state.memory))

            grads = jax.grad(loss_fn)(weights)
            updates, opt_state = optimizer.update(grads, state.opt_state, weights)
            return state._replace(weights=optax.apply_updates(weights, updates),
                                  opt_state=opt_state)

        return Method(name, init_params, init, embed, predict, update,
                      train_step if optimizer else None,
                      "images" if head.trains_backbone else "features", embed_apply,
                      detector=detector)

    build.__name__ = name
    build.__doc__ = f"The ``{name}`` FLUID method for ``num_classes`` stream classes (module doc)."
    return build


def _cosine(representations: Callable[[Weights, cls.ClassMemory], jax.Array], scale: float,
            init_weights=lambda params, key, dim: {}, prepare=None) -> _Classifier:
    """A cosine classifier ``scale * cos(f, representation_k)`` over given representations."""

    def logits(weights, memory, features):
        return cls.cosine_logits(features, representations(weights, memory), scale)

    return _Classifier(init_weights, logits, representations, prepare)


def _ncm(num_classes: int, scale: float) -> _Classifier:
    return _cosine(lambda weights, memory: cls.class_means(memory), scale)


def _exemplar_tuning(num_classes: int, scale: float) -> _Classifier:
    def representations(weights, memory):
        return cls.normalise(cls.class_means(memory)) + weights["residuals"]

    def init_weights(params, key, dim):
        return {"residuals": jnp.zeros((num_classes, dim), jnp.float32)}

    return _cosine(representations, scale, init_weights)


def _imprinting(num_classes: int, scale: float) -> _Classifier:
    # A zero row is a class not imprinted yet: it is represented by its centroid.
    def representations(weights, memory):
        imprinted = jnp.any(weights["classifier"] != 0, axis=-1, keepdims=True)
        return jnp.where(imprinted, weights["classifier"], cls.normalise(cls.class_means(memory)))

    def init_weights(params, key, dim):
        return {"classifier": jnp.zeros((num_classes, dim), jnp.float32)}

    def prepare(weights, memory):  # imprint every seen class that is not yet imprinted
        return {"classifier": jnp.where(cls.seen(memory)[:, None],
                                        representations(weights, memory), 0.0)}

    return _cosine(representations, scale, init_weights, prepare)


def _linear(trains_backbone: bool) -> Callable[[int, float], _Classifier]:
    """A linear head W f + b over the K stream classes (and, optionally, the backbone)."""

    def build(num_classes: int, scale: float) -> _Classifier:
        del scale
        dense = nn.Dense(num_classes)

        def logits(weights, memory, features):
            return dense.apply(weights["head"], features)

        def init_weights(params, key, dim):
            weights = {"head": dense.init(key, jnp.zeros((1, dim), jnp.float32))}
            if trains_backbone:  # a copy: the stream trains it, params stay the pretrained net
                weights["embed"] = jax.tree.map(jnp.copy, params["embed"])
            return weights

        return _Classifier(init_weights, logits, lambda weights, memory: cls.class_means(memory),
                           trains_backbone=trains_backbone)

    return build


ncm = _factory("ncm", _ncm, "mdt", None)
exemplar_tuning = _factory("exemplar_tuning", _exemplar_tuning, "mdt", 1e-3)
imprinting = _factory("imprinting", _imprinting, "mdt", 1e-3)
finetune = _factory("finetune", _linear(trains_backbone=False), "softmax", 3.0)
standard = _factory("standard", _linear(trains_backbone=True), "softmax", 0.1)

METHODS: dict[str, Callable[..., Method]] = {
    "ncm": ncm, "exemplar_tuning": exemplar_tuning, "imprinting": imprinting,
    "finetune": finetune, "standard": standard}


def get_method(name: str, num_classes: int, image_shape: tuple[int, ...] = (28, 28, 1),
               **options) -> Method:
    """The method ``name`` (one of ``METHODS``) for ``num_classes`` stream classes."""
    if name not in METHODS:
        raise ValueError(f"unknown FLUID method {name!r}; valid: {sorted(METHODS)}")
    return METHODS[name](num_classes, image_shape, **options)
