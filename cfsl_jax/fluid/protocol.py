"""The FLUID protocol: predict sample t, record it, reveal its label, update.

A ``Method`` is a NamedTuple of pure functions built by a factory that closes
over its options (like the CFSL ``Learner``):

    state = method.init(params, key)                     # fresh, fixed shape (K classes)
    for t in range(L):
        features = method.embed(params, state, x_t[None])  # [1, D]
        label_t, unseen_t = method.predict(params, state, features[0])   # recorded
        state = method.update(params, state, features[0], y_t)           # y_t revealed
        every U samples (if method.train_step), E epochs over samples 0..t:
            state = method.train_step(params, state, inputs, labels, mask, key) per minibatch

``predict`` is called before ``y_t`` exists anywhere in the computation:
``run_stream`` feeds ``y_t`` only to ``update``, and a training phase after
sample t only sees the samples up to t (rows after t are zero, labels -1).
``update`` reuses the features that ``predict`` used (no second forward pass).

Execution: instance-based methods (no ``train_step``) run the whole stream as
one jitted ``lax.scan``; gradient-based ones alternate jitted scans over
chunks of U samples with training phases: E epochs of ``ceil(t / batch_size)``
minibatches drawn without replacement from the t samples revealed so far, a
fresh shuffle per epoch (the last minibatch of an epoch is padded and
masked). No phase runs after the last sample. Methods with a frozen backbone
(``train_on="features"``) train on the features the scans computed (a [L, D]
bank filled as the stream goes), so a step costs no backbone pass, and an
epoch is one jitted ``fori_loop``; image-trained methods (``"images"``) gather
images per step and run one jitted step per minibatch from the host, because
XLA:CPU runs convolutions inside a loop about 10x slower than at top level.
Images are gathered from the split inside jitted code (only indices cross
from the host). Compiled programs are cached per ``Method`` object, so a
second stream with the same method does not recompile.

Compute (MACs, ``metrics.xla_macs``: XLA's cost analysis, flops / 2) is
counted per call -- one ``embed`` of one image, one ``predict``, one
``update``, one ``train_step`` on a ``batch_size`` minibatch -- and the total
is ``L * (embed + predict + update) + train_steps * train_step``: exactly the
sum of the per-call analyses over every call the stream makes. (Counting the
scan as a whole would not work: XLA counts a loop body once.) Data movement
by the protocol itself (gathering, shuffling) is not counted.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax import data, metrics
from cfsl_jax.fluid.sequences import Stream

Params = Any
State = Any
TRAIN_INPUTS = ("features", "images")


class Method(NamedTuple):
    """Pure functions of a FLUID method (see the module docstring for the call order).

    ``name``, ``training="pretrain"`` and ``embed_apply(params["embed"], x)``
    are the part of the CFSL ``Learner`` contract that ``cfsl_jax.pretrain``
    uses, so ``pretrain(method, params, split, key)`` pretrains the backbone.
    """

    name: str
    init_params: Callable[[jax.Array, jax.Array], Params]  # (key, example_x [n,H,W,C]) -> params
    init: Callable[[Params, jax.Array], State]  # (params, key) -> fresh state
    embed: Callable[[Params, State, jax.Array], jax.Array]  # x [n,H,W,C] -> features [n, D]
    predict: Callable[[Params, State, jax.Array], tuple[jax.Array, jax.Array]]
    # (params, state, features [D]) -> (label int32 [] in seen classes or -1, unseen score f32 [])
    update: Callable[[Params, State, jax.Array, jax.Array], State]
    # (params, state, features [D], label int32 []) -> state
    train_step: Callable[..., State] | None = None
    # (params, state, inputs [B, D] or [B,H,W,C], labels int32 [B], mask bool [B], key) -> state
    train_on: str = "features"  # what train_step's inputs are: "features" or "images"
    embed_apply: Callable[[Params, jax.Array], jax.Array] | None = None
    training: str = "pretrain"
    detector: str = "mdt"  # the unseen-class score predict returns (for reports)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When and how gradient-based methods train (ignored by instance-based ones)."""

    update_every: int = 100  # U: a training phase after every U samples
    epochs_per_update: int = 1  # E: epochs over the samples seen so far per phase
    batch_size: int = 32  # minibatch size of a training step

    def __post_init__(self):
        for name in ("update_every", "epochs_per_update", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: must be an int >= 1")

    def steps(self, seen: int) -> int:
        """Training steps of one phase after ``seen`` samples: E * ceil(seen / batch_size)."""
        return self.epochs_per_update * math.ceil(seen / self.batch_size)


class StreamRecord(NamedTuple):
    prediction: np.ndarray  # int32 [L] predicted label (-1 before any class is seen)
    unseen_score: np.ndarray  # float32 [L] higher = more likely an unseen class
    train_steps: int  # training steps run over the stream
    macs: dict[str, float]  # per call ("embed", "predict", "update", "train_step") and totals
    seconds: float  # wall time of the stream (first-call compilation in, MAC counting out)


@functools.lru_cache(maxsize=64)
def make_scan(method: Method, keep_features: bool) -> Callable:
    """Jitted (cached) ``(params, state, split, sample_idx [n], labels [n]) -> (state, out)``.

    ``out`` = (predicted labels [n], unseen scores [n], features [n, D] or None).
    """

    def run(params, state, split, sample_idx, labels):
        def step(state, inputs):
            idx, y = inputs
            features = method.embed(params, state, data.gather_normalised(split, idx[None]))
            label, score = method.predict(params, state, features[0])  # before y is used
            state = method.update(params, state, features[0], y)
            return state, (label, score, features[0] if keep_features else None)

        return jax.lax.scan(step, state, (sample_idx, labels))

    return jax.jit(run)


def minibatch_step(method: Method, schedule: Schedule, params: Params, state: State,
                   split: Any, bank: jax.Array, labels: jax.Array, order: jax.Array,
                   seen: jax.Array, step: jax.Array, epoch_key: jax.Array) -> State:
    """One training step on minibatch ``step`` of an epoch (pure; jitted by the callers).

    The minibatch is positions ``step * B .. step * B + B - 1`` of ``order`` (a
    shuffle of the revealed rows, revealed first); positions >= ``seen`` are
    masked. ``bank`` holds features [L, D] or sample indices [L] of the
    revealed samples (rows >= ``seen`` are zeros, their labels -1).
    """
    position = step * schedule.batch_size + jnp.arange(schedule.batch_size)
    take = order[jnp.minimum(position, order.shape[0] - 1)]
    inputs = bank[take]
    if method.train_on == "images":
        inputs = data.gather_normalised(split, inputs)
    return method.train_step(params, state, inputs, labels[take], position < seen,
                             jax.random.fold_in(epoch_key, step))


def shuffle_revealed(key: jax.Array, seen: jax.Array, length: int) -> jax.Array:
    """int32 [L]: the rows < ``seen`` in a uniformly random order, then the others."""
    noise = jax.random.uniform(key, (length,))
    return jnp.argsort(jnp.where(jnp.arange(length) < seen, noise, 2.0)).astype(jnp.int32)


@functools.lru_cache(maxsize=64)
def make_epoch(method: Method, schedule: Schedule) -> Callable:
    """Jitted (cached) ``(params, state, split, bank, labels, seen, epoch_key) -> state``.

    A whole epoch in one program (a ``fori_loop`` over its minibatches); for
    methods that train on features. XLA:CPU runs convolutions inside a loop
    about 10x slower than at top level, so image-trained methods use
    ``make_step`` from a host loop instead.
    """

    def run(params, state, split, bank, labels, seen, epoch_key):
        order = shuffle_revealed(epoch_key, seen, labels.shape[0])
        steps = (seen + schedule.batch_size - 1) // schedule.batch_size
        return jax.lax.fori_loop(0, steps, lambda step, state: minibatch_step(
            method, schedule, params, state, split, bank, labels, order, seen, step, epoch_key),
            state)

    return jax.jit(run)


@functools.lru_cache(maxsize=64)
def make_step(method: Method, schedule: Schedule) -> Callable:
    """Jitted (cached) ``minibatch_step`` (its arguments after ``schedule``)."""
    return jax.jit(functools.partial(minibatch_step, method, schedule))


_shuffle = jax.jit(shuffle_revealed, static_argnums=2)


def train_phase(method: Method, schedule: Schedule, params: Params, state: State, split: Any,
                bank: jax.Array, labels: jax.Array, seen: int, key: jax.Array) -> State:
    """E epochs of ceil(seen / B) steps over the revealed samples; a fresh shuffle per epoch."""
    seen_ = jnp.int32(seen)
    for epoch in range(schedule.epochs_per_update):
        epoch_key = jax.random.fold_in(key, epoch)
        if method.train_on == "features":
            state = make_epoch(method, schedule)(params, state, split, bank, labels, seen_,
                                                 epoch_key)
            continue
        order = _shuffle(epoch_key, seen_, labels.shape[0])
        for step in range(math.ceil(seen / schedule.batch_size)):
            state = make_step(method, schedule)(params, state, split, bank, labels, order, seen_,
                                                jnp.int32(step), epoch_key)
    return state


def call_macs(method: Method, params: Params, state: State, image_shape: tuple[int, ...],
              schedule: Schedule) -> dict[str, float]:
    """XLA's MACs of one call of each of the method's functions (module docstring)."""
    x = jnp.zeros((1, *image_shape), jnp.float32)
    features = jax.eval_shape(method.embed, params, state, x)
    feature = jnp.zeros(features.shape[1:], features.dtype)
    y = jnp.zeros((), jnp.int32)
    macs = {"embed": metrics.xla_macs(method.embed, params, state, x),
            "predict": metrics.xla_macs(method.predict, params, state, feature),
            "update": metrics.xla_macs(method.update, params, state, feature, y),
            "train_step": 0.0}
    if method.train_step is not None:
        batch = schedule.batch_size
        inputs = (jnp.zeros((batch, *features.shape[1:]), features.dtype)
                  if method.train_on == "features"
                  else jnp.zeros((batch, *image_shape), jnp.float32))
        macs["train_step"] = metrics.xla_macs(
            method.train_step, params, state, inputs, jnp.zeros((batch,), jnp.int32),
            jnp.ones((batch,), bool), jax.random.key(0))
    return macs


def total_macs(per_call: dict[str, float], length: int, train_steps: int) -> dict[str, float]:
    """Per-call MACs plus the stream totals: inference, updates, training, total."""
    inference = length * (per_call["embed"] + per_call["predict"])
    updates = length * per_call["update"]
    training = train_steps * per_call["train_step"]
    return {**{f"per_call_{k}": v for k, v in per_call.items()},
            "inference": inference, "updates": updates, "training": training,
            "total": inference + updates + training}


def run_stream(method: Method, params: Params, stream: Stream, split: data.Split, key: jax.Array,
               schedule: Schedule = Schedule(), count_macs: bool = True) -> StreamRecord:
    """Predict-then-update over ``stream``; returns the predictions, scores and compute."""
    if method.train_on not in TRAIN_INPUTS:
        raise ValueError(f"method {method.name!r}: train_on={method.train_on!r}; "
                         f"valid: {TRAIN_INPUTS}")
    length = int(stream.label.shape[0])
    chex.assert_shape([stream.sample_idx, stream.label], (length,))
    init_key, train_key = jax.random.split(key)
    state = method.init(params, init_key)
    image_shape = tuple(split.images.shape[1:])
    per_call = call_macs(method, params, state, image_shape, schedule) if count_macs else None
    start_time = time.perf_counter()

    trains = method.train_step is not None
    on_features = trains and method.train_on == "features"
    scan = make_scan(method, keep_features=on_features)
    positions = jnp.arange(length)
    bank = stream.sample_idx  # images: the revealed rows of it are passed to a phase
    if on_features:
        features = jax.eval_shape(method.embed, params, state,
                                  jax.ShapeDtypeStruct((1, *image_shape), jnp.float32))
        bank = jnp.zeros((length, features.shape[-1]), features.dtype)

    predictions, scores, train_steps = [], [], 0
    for begin in range(0, length, schedule.update_every if trains else length):
        end = min(begin + schedule.update_every, length) if trains else length
        state, (label, score, features) = scan(params, state, split,
                                               stream.sample_idx[begin:end],
                                               stream.label[begin:end])
        predictions.append(label)
        scores.append(score)
        if on_features:
            bank = jax.lax.dynamic_update_slice(bank, features, (begin, 0))
        if trains and end < length:
            revealed = positions < end
            state = train_phase(method, schedule, params, state, split,
                                jnp.where(revealed[:, None] if on_features else revealed,
                                          bank, 0),
                                jnp.where(revealed, stream.label, -1), end,
                                jax.random.fold_in(train_key, begin))
            train_steps += schedule.steps(end)
    prediction = np.concatenate([np.asarray(p) for p in predictions]).astype(np.int32)
    unseen = np.concatenate([np.asarray(s) for s in scores]).astype(np.float32)
    seconds = time.perf_counter() - start_time
    macs = total_macs(per_call, length, train_steps) if count_macs else {}
    return StreamRecord(prediction, unseen, train_steps, macs, seconds)
