"""FLUID methods (Wallingford et al., Section 4 and Appendices D-E), from one factory.

Every method embeds with a pretrained Conv-4, keeps a ``ClassMemory`` (per
class running sums of raw and normalised features, updated after every
sample: the paper's instance-based updates) that starts with the pretrain
classes *known* (their pretraining images' statistics; ``known_classes=False``
starts empty, as the authors' code's zero centroids), and predicts among the
known or seen classes. They differ in the ``heads.Head`` and in what training
phases learn. Defaults are the paper's (Appendix E); the schedule is counted
in samples of a ~90,000-sample sequence (``Schedule.scaled`` for shorter ones).

| method | classifier (defaults; options) | trained | pretraining |
| --- | --- | --- | --- |
| ``ncm`` | ``-||f - m_k||^2`` raw means (``metric="cosine"``: 10 cos to normalised means) | - | supervised |
| ``exemplar_tuning`` | ``(mean_k(f/|f|) + r_k) . f`` (``similarity="cosine"``) | r, lr 0.1 | supervised |
| ``imprinting`` | ``s cos(f, w_k)``, s learnable (init 10), w imprinted at the first phase, 10,000 samples; MDT to the class means (``mdt_to="weights"``) | w, s, lr 0.1 | supervised |
| ``finetune`` | linear layer, pretrain rows from the pretrained head | head, lr 0.1 | supervised |
| ``standard`` | linear layer | backbone + head, lr 0.01 | supervised |
| ``lwf`` | as ``standard`` + distillation to the frozen pretrained model (T=2) | lr 0.01 | supervised |
| ``ewc`` | as ``standard`` + ``lambda/2 sum F (theta - theta*)^2`` | lr 0.01 | supervised |
| ``protonets`` | as ``ncm`` | - | prototypical (episodic) |
| ``meta_baseline`` | ``tau cos(f, mean_k)``, tau meta-learned | - | supervised, then episodic |
| ``maml`` | as ``finetune`` | head, lr 0.1 | first-order MAML |
| ``oltr`` | meta-embedding + cosine classifier (``heads.oltr``) | its weights, lr 0.1 | supervised |

Training: SGD with momentum 0.9 and weight decay 1e-4 (the authors' trainer),
softmax cross-entropy over the known/seen classes, the optimiser state carried
across phases; the paper's schedule: 4 epochs every 5,000 samples, batch 256
(Weight Imprinting from 10,000 samples on; OLTR also every 200 samples up to
10,000). Unseen-class detector: ``mdt`` (the paper's MDT) by default for the
instance-based and cosine methods, ``softmax`` (Hendrycks & Gimpel) for the
linear heads; ``detector=`` overrides. MDT measures in the head's own terms
(``mdt_metric=`` overrides): the cosine distance to the class means (NCM and
ProtoNets, as the paper's Figure 5a, and the cosine classifiers), Euclidean to
raw class means (OLTR), the maximum dot-product similarity (Exemplar Tuning and
linear layers, as the paper's Figure 5 b-c).

Notes of what was followed (and not): EWC's Fisher is the diagonal empirical
Fisher on pretraining images at the pretrained weights, computed once before
the stream (the paper recomputes it at each phase: with the anchor fixed at
the pretrained weights this costs compute, not fidelity of the penalty's
form); its weight ``ewc_weight`` (paper: not stated) defaults to 100. LwF
distils over all pretrain classes (the paper: those seen in the stream).
OLTR's backbone stays frozen (the paper trains it at lr 0.01) and its
discriminative centroid loss is left out. MAML is first-order (see
``fluid.meta_pretraining``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from cfsl_jax.errors import UserError
from cfsl_jax.fluid import classifiers as cls
from cfsl_jax.fluid import heads
from cfsl_jax.fluid.backbone import conv4_backbone, feature_dim
from cfsl_jax.fluid.protocol import Method, Schedule

PAPER_SCHEDULE = Schedule()  # 4 epochs every 5,000 samples, batch 256
IMPRINTING_SCHEDULE = Schedule(start=10_000)
OLTR_SCHEDULE = Schedule(warmup_every=200, warmup_until=10_000)


class FluidState(NamedTuple):
    memory: cls.ClassMemory  # running sums [K, D] (raw, normalised), counts [K], known [K]
    weights: heads.Weights  # float32 pytree trained by train_step ({} if none)
    opt_state: optax.OptState  # SGD momentum for ``weights``


class Spec(NamedTuple):
    """One registered method: its head builder and defaults."""

    head: Callable[..., heads.Head]  # (num_classes, embed_apply, **head_options) -> Head
    detector: str
    learning_rate: float | None  # None: instance-based
    schedule: Schedule | None
    pretraining: str = "supervised"
    train_on: str = "features"


def build_method(name: str, spec: Spec, num_classes: int,
                 image_shape: tuple[int, ...] = (28, 28, 1), *, filters: int = 64,
                 activation: str = "relu", detector: str | None = None,
                 mdt_metric: str | None = None, learning_rate: float | None = None, momentum: float = 0.9,
                 weight_decay: float = 1e-4, known_classes: bool = True, **head_options) -> Method:
    """The method ``name`` for ``num_classes`` stream classes (module doc)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise UserError(f"num_classes={num_classes!r} is invalid: must be an int >= 1")
    detector = detector or spec.detector
    cls.check_detector(detector, mdt_metric)
    if spec.learning_rate is None and learning_rate is not None:
        raise UserError(f"{name} is instance-based: it takes no learning_rate "
                        f"(got {learning_rate!r})")
    learning_rate = spec.learning_rate if learning_rate is None else learning_rate
    if learning_rate is not None and not learning_rate > 0:
        raise UserError(f"learning_rate={learning_rate!r} is invalid: must be > 0")
    if not 0 <= momentum < 1:
        raise UserError(f"momentum={momentum!r} is invalid: must be in [0, 1)")
    init_params, embed_apply = conv4_backbone(image_shape, filters, activation)
    try:
        head = spec.head(num_classes, embed_apply, known=known_classes, **head_options)
    except TypeError as error:
        raise UserError(f"{name}: bad option(s) {sorted(head_options)}: {error}") from None
    mdt_metric = mdt_metric or head.mdt
    optimizer = (optax.chain(optax.add_decayed_weights(weight_decay),
                             optax.sgd(learning_rate, momentum=momentum))
                 if learning_rate is not None else None)

    def init(params, key):
        dim = feature_dim(embed_apply, params["embed"], image_shape)
        weights = head.init_weights(params, key, dim)
        memory = cls.memory_init(num_classes, dim,
                                 params.get("known") if known_classes else None)
        return FluidState(memory, weights, optimizer.init(weights) if optimizer else ())

    def embed_with(params, weights, x):
        return embed_apply(weights["embed"] if head.trains_backbone else params["embed"], x)

    def embed(params, state, x):
        chex.assert_rank(x, 4)
        chex.assert_type(x, float)  # normalised images (data.gather_normalised), not raw uint8
        return embed_with(params, state.weights, x)

    def predict(params, state, feature):
        chex.assert_rank(feature, 1)
        seen = cls.seen(state.memory)
        logits = head.logits(state.weights, state.memory, feature[None])[0]
        score = cls.unseen_score(detector, feature, logits,
                                 head.representations(state.weights, state.memory), seen,
                                 mdt_metric)
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
            loss = cls.masked_cross_entropy(logits, labels, mask, cls.seen(state.memory))
            if head.penalty is not None:
                loss = loss + head.penalty(params, weights, inputs, features, mask)
            return loss

        grads = jax.grad(loss_fn)(weights)
        updates, opt_state = optimizer.update(grads, state.opt_state, weights)
        return state._replace(weights=optax.apply_updates(weights, updates),
                              opt_state=opt_state)

    return Method(name, init_params, init, embed, predict, update,
                  train_step if optimizer else None,
                  "images" if head.trains_backbone else "features", embed_apply,
                  detector=detector, schedule=spec.schedule if optimizer else None,
                  pretraining=spec.pretraining)


def _ncm(k, embed_apply, known=True, metric="euclidean", scale=10.0):
    if metric not in ("euclidean", "cosine"):
        raise UserError(f"metric={metric!r}; valid: ('euclidean', 'cosine')")
    return heads.ncm(k, metric, scale)


def _exemplar_tuning(k, embed_apply, known=True, similarity="dot", scale=10.0):
    if similarity not in ("dot", "cosine"):
        raise UserError(f"similarity={similarity!r}; valid: ('dot', 'cosine')")
    return heads.exemplar_tuning(k, similarity, scale)


def _imprinting(k, embed_apply, known=True, scale=10.0, learn_scale=True, mdt_to="means"):
    if mdt_to not in ("weights", "means"):
        raise UserError(f"mdt_to={mdt_to!r}; valid: ('weights', 'means')")
    return heads.imprinting(k, scale, learn_scale, mdt_to)


def _linear(trains_backbone: bool, penalty: str | None = None):
    def build(k, embed_apply, known=True, ewc_weight=100.0, distill_weight=1.0,
              distill_temperature=2.0):
        extra = {"lwf": lambda: heads.lwf_penalty(embed_apply, distill_temperature,
                                                  distill_weight),
                 "ewc": lambda: heads.ewc_penalty(ewc_weight), None: lambda: None}[penalty]()
        return heads.linear(k, trains_backbone, known, extra)

    return build


def _oltr(k, embed_apply, known=True, scale=16.0):
    return heads.oltr(k, scale)


def _meta_baseline(k, embed_apply, known=True, scale=10.0):
    return heads.ncm(k, "cosine", scale)


SPECS: dict[str, Spec] = {
    "ncm": Spec(_ncm, "mdt", None, None),
    "exemplar_tuning": Spec(_exemplar_tuning, "mdt", 0.1, PAPER_SCHEDULE),
    "imprinting": Spec(_imprinting, "mdt", 0.1, IMPRINTING_SCHEDULE),
    "finetune": Spec(_linear(False), "softmax", 0.1, PAPER_SCHEDULE),
    "standard": Spec(_linear(True), "softmax", 0.01, PAPER_SCHEDULE),
    "lwf": Spec(_linear(True, "lwf"), "softmax", 0.01, PAPER_SCHEDULE),
    "ewc": Spec(_linear(True, "ewc"), "softmax", 0.01, PAPER_SCHEDULE),
    "protonets": Spec(_ncm, "mdt", None, None, pretraining="protonets"),
    "meta_baseline": Spec(_meta_baseline, "mdt", None, None, pretraining="meta_baseline"),
    "maml": Spec(_linear(False), "softmax", 0.1, PAPER_SCHEDULE, pretraining="maml"),
    "oltr": Spec(_oltr, "mdt", 0.1, OLTR_SCHEDULE),
}
METHODS = tuple(SPECS)


def get_method(name: str, num_classes: int, image_shape: tuple[int, ...] = (28, 28, 1),
               **options) -> Method:
    """The method ``name`` (one of ``METHODS``) for ``num_classes`` stream classes."""
    if name not in SPECS:
        raise UserError(f"unknown FLUID method {name!r}; valid: {sorted(SPECS)}")
    return build_method(name, SPECS[name], num_classes, image_shape, **options)
