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
| ``imprinting`` | ``s cos(f, w_k)``, s learnable (init 4: Table 11's best, Table 3-e), w imprinted at the first phase, 10,000 samples; MDT to the class means (``mdt_to="weights"``) | w, s, lr 0.1 | supervised |
| ``finetune`` | linear layer, pretrain rows from the pretrained head | head, lr 0.1 | supervised |
| ``standard`` | linear layer | backbone + head, lr 0.01 | supervised |
| ``lwf`` | as ``standard`` + distillation to the frozen pretrained model (T=2) | lr 0.01 | supervised |
| ``ewc`` | as ``standard`` + ``lambda/2 sum F (theta - theta*)^2`` | lr 0.01 | supervised |
| ``protonets`` | as ``ncm`` | - | prototypical (episodic) |
| ``meta_baseline`` | ``tau cos(f, mean_k)``, mean_k of raw features, tau meta-learned (``centroid="unit_mean"``) | - | supervised, then episodic |
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

The paper's "new class" output is the ``new_class`` option (every method):
the experiment turns the recorded predictions into K+1-way ones with a
threshold on the unseen-class score chosen on validation streams
(``fluid.new_class``); it changes the counting, not what a method learns.

Notes of what was followed (and not): EWC's Fisher is the diagonal empirical
Fisher (``models.fisher``) on pretraining images at the pretrained weights,
computed once before the stream and counted in MACs at every phase
(``pretraining.phase_macs``), as the paper recomputes it (at the fixed
pretrained weights each recomputation gives the same values); its weight
``ewc_weight`` (paper: not stated) defaults to
100, where the penalty barely binds (docs/fidelity.md, EWC;
``benchmarks.select_fluid_ewc_weight`` selects it on validation streams). LwF
distils over all pretrain classes (the paper: those seen in the stream).
OLTR's backbone stays frozen (the paper trains it at lr 0.01) and its
discriminative centroid loss is left out. MAML is first-order (see
``fluid.meta_pretraining``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, NamedTuple

import chex
import jax
import optax

from cfsl_jax.protocol import metrics
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.fluid import classifiers as cls
from cfsl_jax.fluid import heads
from cfsl_jax.fluid.backbone import conv4_backbone, feature_dim
from cfsl_jax.fluid.config import METHODS
from cfsl_jax.fluid.protocol import Method, Schedule
from cfsl_jax.models.conv4 import ACTIVATIONS
from cfsl_jax.training.optimizers import optimizer as make_optimizer
from cfsl_jax.runtime.options import build, check_fields, option, parse, positive_int

PAPER_SCHEDULE = Schedule()  # 4 epochs every 5,000 samples, batch 256
IMPRINTING_SCHEDULE = Schedule(start=10_000)
OLTR_SCHEDULE = Schedule(warmup_every=200, warmup_until=10_000)


class FluidState(NamedTuple):
    memory: cls.ClassMemory  # running sums [K, D] (raw, normalised), counts [K], known [K]
    weights: heads.Weights  # float32 pytree trained by train_step ({} if none)
    opt_state: optax.OptState  # SGD momentum for ``weights``


@dataclasses.dataclass(frozen=True)
class MethodOptions:
    """Options of every FLUID method: the backbone, the unseen-class detector, the memory."""

    filters: int = option(64, "Conv-4 width.", minimum=1)
    activation: str = option("relu", "Conv-4 activation.", choices=tuple(ACTIVATIONS))
    detector: str = option("mdt", "Unseen-class detector: MDT or the softmax maximum.",
                           choices=cls.DETECTORS)
    mdt_metric: str | None = option(None, "MDT's similarity (none: the head's own).",
                                    choices=cls.MDT_METRICS)
    known_classes: bool = option(True, "The memory starts with the pretrain classes known.")
    new_class: bool = option(False, "Predict 'new' when the unseen-class score is above a "
                             "threshold (the paper's K+1-way output; fluid.new_class).")
    new_class_threshold: float | None = option(None, "The 'new' threshold (none: chosen on the "
                                               "validation streams).")

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class TrainedOptions(MethodOptions):
    """A method with weights trained on the stream: SGD with momentum and weight decay."""

    learning_rate: float = option(0.1, "SGD learning rate.", above=0)
    momentum: float = option(0.9, "SGD momentum.", minimum=0, below=1)
    weight_decay: float = option(1e-4, "Weight decay.", minimum=0)


@dataclasses.dataclass(frozen=True)
class NcmOptions(MethodOptions):
    metric: str = option("euclidean", "-||f - m_k||^2 to raw means, or scaled cosine to "
                         "normalised means.", choices=("euclidean", "cosine"))
    scale: float = option(10.0, "Cosine scale.", above=0)


@dataclasses.dataclass(frozen=True)
class MetaBaselineOptions(MethodOptions):
    scale: float = option(10.0, "Initial cosine scale tau (meta-learned).", above=0)
    centroid: str = option("mean", "Class centroid: the mean feature (Chen et al., as in "
                           "meta-training) or the mean normalised feature (the earlier stream "
                           "rule).", choices=("mean", "unit_mean"))


@dataclasses.dataclass(frozen=True)
class ExemplarTuningOptions(TrainedOptions):
    similarity: str = option("dot", "Class representation . feature: dot or cosine.",
                             choices=("dot", "cosine"))
    scale: float = option(10.0, "Cosine scale.", above=0)


@dataclasses.dataclass(frozen=True)
class ImprintingOptions(TrainedOptions):
    # The paper's Table 11 ablates s in {1, 2, 4, 8}; its s=4 row is Table 3-e to the digit
    # (App. L: "We report the best results in the main paper").
    scale: float = option(4.0, "Initial cosine scale s (the paper's Table 11: 4).", above=0)
    learn_scale: bool = option(True, "s is trained.")
    mdt_to: str = option("means", "MDT measures to the class means or the imprinted weights.",
                         choices=("means", "weights"))


@dataclasses.dataclass(frozen=True)
class OltrOptions(TrainedOptions):
    scale: float = option(16.0, "Cosine classifier scale.", above=0)


@dataclasses.dataclass(frozen=True)
class LinearOptions(TrainedOptions):
    detector: str = option("softmax", "Unseen-class detector: MDT or the softmax maximum.",
                           choices=cls.DETECTORS)


@dataclasses.dataclass(frozen=True)
class StandardOptions(LinearOptions):
    learning_rate: float = option(0.01, "SGD learning rate.", above=0)


@dataclasses.dataclass(frozen=True)
class LwfOptions(StandardOptions):
    distill_weight: float = option(1.0, "Weight of the distillation loss.", minimum=0)
    distill_temperature: float = option(2.0, "Distillation temperature T.", above=0)


@dataclasses.dataclass(frozen=True)
class EwcMethodOptions(StandardOptions):
    ewc_weight: float = option(100.0, "EWC penalty weight lambda.", minimum=0)


class Spec(NamedTuple):
    """One registered method: its head, options and training phases."""

    head: Callable[..., heads.Head]  # (num_classes, embed_apply, options) -> Head
    options: type  # its options dataclass (MethodOptions or a subclass)
    schedule: Schedule | None  # None: instance-based
    pretraining: str = "supervised"


def build_method(name: str, spec: Spec, num_classes: int,
                 image_shape: tuple[int, ...] = (28, 28, 1), **options) -> Method:
    """The method ``name`` for ``num_classes`` stream classes; ``options``: ``spec.options``."""
    positive_int("num_classes", num_classes)
    opts = build(spec.options, options, f"FLUID method {name!r}")
    learning_rate = getattr(opts, "learning_rate", None)
    init_params, embed_apply = conv4_backbone(image_shape, opts.filters, opts.activation)
    head = spec.head(num_classes, embed_apply, opts)
    detector, mdt_metric = opts.detector, opts.mdt_metric or head.mdt
    optimizer = (make_optimizer("sgd", learning_rate, opts.weight_decay, opts.momentum)
                 if learning_rate is not None else None)
    known_classes = opts.known_classes

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
            loss = metrics.masked_cross_entropy(logits, labels, mask, cls.seen(state.memory))
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


def _linear(trains_backbone: bool, penalty: str | None = None):
    def build_head(k, embed_apply, opts):
        extra = {"lwf": lambda: heads.lwf_penalty(embed_apply, opts.distill_temperature,
                                                  opts.distill_weight),
                 "ewc": lambda: heads.ewc_penalty(opts.ewc_weight), None: lambda: None}[penalty]()
        return heads.linear(k, trains_backbone, opts.known_classes, extra)

    return build_head


SPECS: dict[str, Spec] = {
    "ncm": Spec(lambda k, e, o: heads.ncm(k, o.metric, o.scale), NcmOptions, None),
    "exemplar_tuning": Spec(lambda k, e, o: heads.exemplar_tuning(k, o.similarity, o.scale),
                            ExemplarTuningOptions, PAPER_SCHEDULE),
    "imprinting": Spec(lambda k, e, o: heads.imprinting(k, o.scale, o.learn_scale, o.mdt_to),
                       ImprintingOptions, IMPRINTING_SCHEDULE),
    "finetune": Spec(_linear(False), LinearOptions, PAPER_SCHEDULE),
    "standard": Spec(_linear(True), StandardOptions, PAPER_SCHEDULE),
    "lwf": Spec(_linear(True, "lwf"), LwfOptions, PAPER_SCHEDULE),
    "ewc": Spec(_linear(True, "ewc"), EwcMethodOptions, PAPER_SCHEDULE),
    "protonets": Spec(lambda k, e, o: heads.ncm(k, o.metric, o.scale), NcmOptions, None,
                      pretraining="protonets"),
    "meta_baseline": Spec(lambda k, e, o: heads.ncm(k, "cosine", o.scale, o.centroid),
                          MetaBaselineOptions, None, pretraining="meta_baseline"),
    "maml": Spec(_linear(False), LinearOptions, PAPER_SCHEDULE, pretraining="maml"),
    "oltr": Spec(lambda k, e, o: heads.oltr(k, o.scale), OltrOptions, OLTR_SCHEDULE),
}
if tuple(SPECS) != METHODS:  # the names launch.fluid's flags check, without JAX
    raise ImportError(f"fluid.config.METHODS {METHODS} is not SPECS' {tuple(SPECS)}")


def _check_name(name: str) -> None:
    if name not in SPECS:
        raise UserError(f"unknown FLUID method {name!r}; valid: {sorted(SPECS)}")


def options_class(name: str) -> type:
    """The frozen dataclass of FLUID method ``name``'s options."""
    _check_name(name)
    return SPECS[name].options


def parse_method_options(name: str, pairs: Iterable[str],
                         owner: str | None = None) -> dict[str, Any]:
    """``NAME=VALUE`` strings -> {name: value typed as method ``name``'s option}, checked."""
    return parse(options_class(name), pairs, owner or f"FLUID method {name!r}")


def get_method(name: str, num_classes: int, image_shape: tuple[int, ...] = (28, 28, 1),
               **options) -> Method:
    """The method ``name`` (one of ``METHODS``) for ``num_classes`` stream classes;
    ``options``: ``options_class(name)``."""
    _check_name(name)
    return build_method(name, SPECS[name], num_classes, image_shape, **options)
