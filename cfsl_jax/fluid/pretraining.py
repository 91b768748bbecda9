"""Pretraining for FLUID: the backbone and linear head on the pretrain classes.

The pretraining data is the stream's split with its class table replaced by
``StreamClasses.pretrain_table`` (row k = pretrain class k's samples that are
not in the stream) followed by the pretraining-only classes' rows
(``extra_table``, when ``StreamConfig.pretrain_classes`` widens the set, as the
paper's ImageNet-1K): pretraining never touches a stream sample, and novel
classes are never seen. After pretraining only the head's first P columns
(the stream's pretrain classes) are kept, as the authors' ``SplitModel`` keeps
the pretrained rows of the stream's base classes. Strategies (``Method.pretraining``):

- ``supervised`` (the paper's "Sup."): softmax cross-entropy of the backbone
  and a linear head over the P pretrain classes (``cfsl_jax.training.pretrain``'s step:
  Adam, L2 weight decay); the head is kept: ``params["head"]`` = {"kernel"
  [D, P], "bias" [P]} -- row k = stream label k, so the pretrain classes are
  known when the stream starts.
- ``protonets``, ``meta_baseline``, ``maml``: episodic, ``meta_pretraining``.
  After them the head is fitted on the frozen features (``fit_head``) so that
  a linear method (MAML) also knows the pretrain classes.

``prepare_params`` then adds what methods read at the stream start:
``params["known"]`` (``KnownClasses``: feature sums/counts of the pretraining
images per pretrain class) and, for EWC, ``params["fisher"]``; ``phase_macs``
counts the Fisher's compute at each training phase, as the paper recomputes it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cfsl_jax import data
from cfsl_jax.runtime import progress
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import pretrain as supervised
from cfsl_jax.data import Split
from cfsl_jax.fluid import classifiers as cls
from cfsl_jax.fluid.protocol import Method, Params
from cfsl_jax.models.fisher import empirical_fisher
from cfsl_jax.protocol import metrics
from cfsl_jax.training.optimizers import optimizer
from cfsl_jax.fluid.sequences import StreamClasses, pretrain_class_table

STRATEGIES = ("supervised", "protonets", "meta_baseline", "maml")
FISHER_SAMPLES, FISHER_CHUNK = 256, 32  # EWC's Fisher: pretraining images, per program


def pretrain_split(split: Split, classes: StreamClasses, extra: bool = False) -> Split:
    """``split`` with only the pretraining data in its class table (images untouched): the
    stream's P pretrain classes, then (``extra``) the pretraining-only classes."""
    table, sizes = pretrain_class_table(classes, extra)
    info = split.info
    rows = np.concatenate([classes.split_class[:classes.pretrain_table.shape[0]],
                           classes.extra_class if extra else []]).astype(int)
    names = tuple(info.class_names[c] for c in rows)
    info = dataclasses.replace(info, split=f"{info.split} (FLUID pretraining data)",
                               num_classes=len(names), class_names=names)
    return dataclasses.replace(split, class_table=jnp.asarray(table),
                               class_sizes=jnp.asarray(sizes), info=info)


def pretrain_supervised(method: Method, params: Params, split: Split, key: jax.Array, *,
                        steps: int, batch_size: int = 64, learning_rate: float = 1e-3,
                        weight_decay: float = 1e-5) -> Params:
    """Backbone + linear head over the split's classes (softmax CE): CFSL's supervised
    pretraining (``training.pretrain.pretrained_state``), its head kept."""
    state = supervised.pretrained_state(method, params, split, key, steps=steps,
                                        batch_size=batch_size, learning_rate=learning_rate,
                                        weight_decay=weight_decay, what="FLUID pretraining")
    dense = state.params["head"]["params"]["Dense_0"]
    return {**params, "embed": state.params["embed"],
            "head": {"kernel": dense["kernel"], "bias": dense["bias"]}}


def pretraining_features(method: Method, params: Params, split: Split,
                         batch: int = 1000) -> tuple[jax.Array, jax.Array]:
    """(raw features [M, D], class row [M]) of every pretraining image (``split`` as above)."""
    pool = supervised.entry_pool(split.class_table)
    run = jax.jit(lambda embed, idx: method.embed_apply(embed, data.gather_normalised(split, idx)))
    n = int(pool.image_idx.shape[0])
    batch = min(batch, n)
    idx = jnp.pad(pool.image_idx, (0, -n % batch))
    features = jnp.concatenate([run(params["embed"], idx[i:i + batch])
                                for i in range(0, idx.shape[0], batch)])[:n]
    return features, pool.labels


def known_classes(features: jax.Array, labels: jax.Array, num_pretrain: int) -> cls.KnownClasses:
    """Per pretrain class sums of raw and normalised features and counts."""
    def segment(x):
        return jax.ops.segment_sum(x, labels, num_segments=num_pretrain)

    return cls.KnownClasses(segment(features), segment(cls.normalise(features)),
                            segment(jnp.ones_like(labels, jnp.float32)))


def fit_head(features: jax.Array, labels: jax.Array, num_classes: int, key: jax.Array,
             steps: int = 300, learning_rate: float = 1e-2) -> dict:
    """A linear head on frozen features (full-batch Adam, softmax CE): {"kernel", "bias"}."""
    dim = features.shape[-1]
    head = {"kernel": jax.random.normal(key, (dim, num_classes)) / jnp.sqrt(dim),
            "bias": jnp.zeros((num_classes,))}
    opt = optimizer("adam", learning_rate)

    def loss_fn(head):
        logits = features @ head["kernel"] + head["bias"]
        return metrics.cross_entropy(logits, labels)

    @jax.jit
    def run(head):
        def step(carry, _):
            head, opt_state = carry
            updates, opt_state = opt.update(jax.grad(loss_fn)(head), opt_state, head)
            return (optax.apply_updates(head, updates), opt_state), None

        return jax.lax.scan(step, (head, opt.init(head)), None, length=steps)[0][0]

    return run(head)


def _fisher_sum(method: Method, head: dict):
    """``(embed, images [n, ...], labels [n]) -> `` the n samples' sum of squared
    log-likelihood gradients of the backbone (``empirical_fisher`` times n)."""

    def logits_fn(embed, images):
        return method.embed_apply(embed, images) @ head["kernel"] + head["bias"]

    def fisher_sum(embed, images, labels):
        fisher = empirical_fisher(logits_fn, embed, images, labels, independent=True)
        return jax.tree.map(lambda f: f * labels.shape[0], fisher)

    return fisher_sum


def pretraining_fisher(method: Method, params: Params, split: Split, key: jax.Array,
                       samples: int = FISHER_SAMPLES, chunk: int = FISHER_CHUNK) -> Params:
    """EWC's Fisher of the backbone: ``models.fisher.empirical_fisher`` (true labels, mean
    over samples) of the pretrained backbone and head on ``samples`` pretraining images drawn
    without replacement, ``chunk`` at a time. The backbone normalises each image on its own,
    so the per-sample path (``independent=True``) is exact."""
    pool = supervised.entry_pool(split.class_table)
    samples = min(samples, int(pool.image_idx.shape[0]))  # all of a small pretraining set
    pick = jax.random.choice(key, pool.image_idx.shape[0], (samples,), replace=False)
    fisher_sum = _fisher_sum(method, params["head"])

    @jax.jit
    def part(embed, idx, labels):  # the chunk's sum of squared gradients
        return fisher_sum(embed, data.gather_normalised(split, idx), labels)

    total = None
    for i in range(0, samples, chunk):
        rows = pick[i:i + chunk]
        summed = part(params["embed"], pool.image_idx[rows], pool.labels[rows])
        total = summed if total is None else jax.tree.map(jnp.add, total, summed)
    return jax.tree.map(lambda t: t / samples, total)


def phase_macs(method: Method, params: Params, split: Split, classes: StreamClasses) -> float:
    """MACs a method spends before each training phase outside ``train_step``
    (``protocol.run_stream``'s ``phase_macs``): EWC's Fisher, which the paper computes "at the
    start of every flexible train step" (App. E) -- XLA's count of ``pretraining_fisher``'s
    chunks over its samples of the pretrain classes; 0 for every other method. Ours is
    computed once, at the pretrained weights on fixed images, where computing it again at
    each phase gives the same values; it is counted at each phase, as the paper spends it."""
    if "fisher" not in params:
        return 0.0
    samples = min(FISHER_SAMPLES, count_pretraining(classes))
    fisher_sum = _fisher_sum(method, params["head"])
    image = split.images.shape[1:]

    def chunk_macs(n: int) -> float:
        return metrics.xla_macs(fisher_sum, params["embed"], jnp.zeros((n, *image), jnp.float32),
                                jnp.zeros((n,), jnp.int32)) if n else 0.0

    return samples // FISHER_CHUNK * chunk_macs(FISHER_CHUNK) + chunk_macs(samples % FISHER_CHUNK)


def pretrain_model(method: Method, params: Params, split: Split, classes: StreamClasses,
                   key: jax.Array, *, steps: int, batch_size: int = 64,
                   learning_rate: float = 1e-3) -> Params:
    """``params`` pretrained by ``method.pretraining`` on the pretrain classes (module doc)."""
    from cfsl_jax.fluid import meta_pretraining  # one concept per module

    # the pretraining set: the pretrain classes' kept-out images and the pretraining-only
    # classes (either part may be empty: P = 0, or every image of a pretrain class streamed)
    pre = pretrain_split(split, classes, extra=True)
    if not (np.asarray(pre.class_table) >= 0).any():
        progress.say("[FLUID pretraining] no pretraining data (no image of a pretrain class "
                     "kept out of the stream, no pretraining-only class): the backbone stays "
                     "random")
        return params
    sup_key, meta_key, head_key = jax.random.split(key, 3)
    strategy = method.pretraining
    if strategy in ("supervised", "meta_baseline"):
        params = pretrain_supervised(method, params, pre, sup_key, steps=steps,
                                     batch_size=batch_size, learning_rate=learning_rate)
    if strategy != "supervised":
        params = meta_pretraining.meta_train(method, params, pre, meta_key, strategy,
                                             steps=steps, learning_rate=learning_rate)
        features, labels = pretraining_features(method, params, pre)
        params = {**params, "head": fit_head(features, labels, pre.class_table.shape[0],
                                             head_key)}
    p = classes.pretrain_table.shape[0]  # the stream's pretrain classes: its labels 0..P-1
    return {**params, "head": jax.tree.map(lambda a: a[..., :p], params["head"])}


def prepare_params(method: Method, params: Params, split: Split, classes: StreamClasses,
                   key: jax.Array, known: cls.KnownClasses | None = None) -> Params:
    """Add ``known`` (and ``fisher`` for EWC) to pretrained ``params``. ``known``: the class
    statistics already computed for the same pretrained backbone (another method of the same
    run), instead of embedding every pretraining image again."""
    num_pretrain = int(classes.pretrain_table.shape[0])
    if num_pretrain == 0 or "head" not in params or count_pretraining(classes) == 0:
        if method.name == "ewc":  # it would run as plain fine-tuning, or fail on no Fisher
            raise UserError(
                f"method ewc anchors the backbone with its Fisher on the pretrain classes' "
                f"pretraining images, and this stream has none ({num_pretrain} pretrain "
                f"classes, {count_pretraining(classes)} of their images kept out of it): give "
                f"--pretrain_fraction > 0 and --min_pretrain_samples > 0, or leave ewc out")
        return params  # no pretraining image of a pretrain class: none has statistics to know
    pre = pretrain_split(split, classes)
    if known is None:
        features, labels = pretraining_features(method, params, pre)
        known = known_classes(features, labels, num_pretrain)
    params = {**params, "known": known}
    if method.name == "ewc":
        params["fisher"] = pretraining_fisher(method, params, pre, key)
    return params


def count_pretraining(classes: StreamClasses) -> int:
    return int(np.sum(classes.pretrain_table >= 0))
