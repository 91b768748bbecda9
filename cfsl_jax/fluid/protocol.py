"""The FLUID protocol: predict sample t, record it, reveal its label, update.

A ``Method`` is a NamedTuple of pure functions built by a factory that closes
over its options (like the CFSL ``Learner``):

    state = method.init(params, key)     # fresh; the pretrain classes are known
    for t in range(L):
        features = method.embed(params, state, x_t[None])  # [1, D]
        label_t, unseen_t = method.predict(params, state, features[0])   # recorded
        state = method.update(params, state, features[0], y_t)           # y_t revealed
        after each phase end t in schedule.phase_ends(L) (if method.train_step):
            E epochs over samples 0..t: state = method.train_step(...) per minibatch

``predict`` is called before ``y_t`` exists anywhere in the computation:
``run_stream`` feeds ``y_t`` only to ``update``, and a training phase after
sample t only sees the samples up to t (rows after t are zero, labels -1).

Schedules are counted in samples (``Schedule``): a phase every
``update_every`` samples from ``start`` on, plus (optionally) a phase every
``warmup_every`` samples up to ``warmup_until`` (OLTR). The paper's values are
for its ~90,000-sample sequences (``PAPER_LENGTH``); ``Schedule.scaled(L)``
multiplies every sample count by ``L / PAPER_LENGTH`` for a shorter stream
(the experiment logs the scaled schedule).

Execution: between two phases nothing changes the backbone (``update`` only
touches the class memory), so the features of a chunk of samples between two
phase ends are computed in batches (``embed_batch`` images at a time, one
jitted program) and then one jitted ``lax.scan`` runs predict/update over
them. A training phase is E epochs of ``ceil(t / batch_size)`` minibatches
drawn without replacement from the t samples revealed so far, a fresh shuffle
per epoch (the last minibatch is padded and masked). No phase runs after the
last sample. Frozen-backbone methods (``train_on="features"``) train on the
cached features (a [L, D] bank), an epoch one jitted ``fori_loop``;
image-trained methods gather images per step and run one jitted step per
minibatch from the host (XLA:CPU runs convolutions inside a loop ~10x slower).

Compute (MACs, ``metrics.xla_macs``: XLA's cost analysis, flops / 2) is
counted per call -- one ``embed`` of one image, one ``predict``, one
``update``, one ``train_step`` on a ``batch_size`` minibatch, and what one
row adds to it (``train_row = (train_step(B) - train_step(B/2)) / (B - B/2)``;
the rest, the optimiser update and EWC's penalty, is per step) -- and
``total = L * (embed + predict + update) + training + phases * phase_start``,
``training = train_steps * train_step - padded_rows * train_row``: only real
rows count, ``E * t`` in a phase after t samples (an epoch's last minibatch is
padded and masked; the authors' loader gives a shorter one). ``phase_start``:
work before each phase outside ``train_step`` (EWC's Fisher,
``pretraining.phase_macs``). That is the cost *with feature caching*. Without caching (the paper's second GMACs
figure) a frozen-backbone method recomputes the backbone for every training
row: ``total_uncached = total + train_rows * embed``; for image-trained
methods the two are equal. (Counting a scan as a whole would not work: XLA
counts a loop body once.) Data movement is not counted.

Progress: a line (samples done, rate, ETA) at least every ``progress.INTERVAL_S``
seconds, between chunks; a method that never trains walks the stream in
chunks of ``PROGRESS_SAMPLES`` samples for that (one scan program; splitting a
scan changes none of its numbers).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax import data
from cfsl_jax.protocol import metrics
from cfsl_jax.runtime import progress
from cfsl_jax.runtime.errors import UserError
# Schedule (and PAPER_LENGTH) live in fluid.config, without JAX; imported here as before
from cfsl_jax.fluid.config import PAPER_LENGTH, Schedule  # noqa: F401
from cfsl_jax.fluid.sequences import Stream

Params = Any
State = Any
TRAIN_INPUTS = ("features", "images")
PROGRESS_SAMPLES = 5_000  # chunk of a method that never trains (a progress line between chunks)


class Method(NamedTuple):
    """Pure functions of a FLUID method (see the module docstring for the call order).

    ``name``, ``training="pretrain"`` and ``embed_apply(params["embed"], x)``
    are the part of the CFSL ``Learner`` contract that ``cfsl_jax.training.pretrain``
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
    schedule: Schedule | None = None  # the method's own (paper) schedule; None: instance-based
    pretraining: str = "supervised"  # how its backbone is pretrained (fluid.pretraining)


class StreamRecord(NamedTuple):
    prediction: np.ndarray  # int32 [L] predicted label (-1 before any class is seen)
    unseen_score: np.ndarray  # float32 [L] higher = more likely an unseen class
    train_steps: int  # training steps run over the stream
    macs: dict[str, float]  # per call ("embed", "predict", "update", "train_step") and totals
    seconds: float  # wall time of the stream (first-call compilation in, MAC counting out)
    finite: bool = True  # every float of the method's final state is finite (not diverged)


@functools.lru_cache(maxsize=64)
def make_embed(method: Method, batch: int) -> Callable:
    """Jitted (cached) ``(params, state, split, sample_idx [batch]) -> features [batch, D]``."""
    return jax.jit(lambda params, state, split, idx: method.embed(
        params, state, data.gather_normalised(split, idx)))


def embed_samples(method: Method, params: Params, state: State, split: Any,
                  sample_idx: jax.Array, batch: int) -> jax.Array:
    """Features [n, D] of ``sample_idx`` [n], ``batch`` images per call (the last one padded)."""
    n = int(sample_idx.shape[0])
    run = make_embed(method, batch)
    padded = jnp.pad(sample_idx, (0, -n % batch))
    parts = [run(params, state, split, padded[i:i + batch]) for i in range(0, n + (-n % batch),
                                                                          batch)]
    return jnp.concatenate(parts)[:n]


@functools.lru_cache(maxsize=64)
def make_scan(method: Method) -> Callable:
    """Jitted (cached) ``(params, state, features [n, D], labels [n])``.

    Returns ``(state, (label [n], score [n]))``.
    """

    def run(params, state, features, labels):
        def step(state, inputs):
            feature, y = inputs
            label, score = method.predict(params, state, feature)  # before y is used
            return method.update(params, state, feature, y), (label, score)

        return jax.lax.scan(step, state, (features, labels))

    return jax.jit(run)


def minibatch_step(method: Method, batch_size: int, params: Params, state: State,
                   split: Any, bank: jax.Array, labels: jax.Array, order: jax.Array,
                   seen: jax.Array, step: jax.Array, epoch_key: jax.Array) -> State:
    """One training step on minibatch ``step`` of an epoch (pure; jitted by the callers).

    The minibatch is positions ``step * B .. step * B + B - 1`` of ``order`` (a
    shuffle of the revealed rows, revealed first); positions >= ``seen`` are
    masked. ``bank`` holds features [L, D] or sample indices [L] of the
    revealed samples (rows >= ``seen`` are zeros, their labels -1).
    """
    position = step * batch_size + jnp.arange(batch_size)
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
def make_epoch(method: Method, batch_size: int) -> Callable:
    """Jitted (cached) ``(params, state, split, bank, labels, seen, epoch_key) -> state``.

    A whole epoch in one program (a ``fori_loop`` over its minibatches); for
    methods that train on features. XLA:CPU runs convolutions inside a loop
    about 10x slower than at top level, so image-trained methods use
    ``make_step`` from a host loop instead.
    """

    def run(params, state, split, bank, labels, seen, epoch_key):
        order = shuffle_revealed(epoch_key, seen, labels.shape[0])
        steps = (seen + batch_size - 1) // batch_size
        return jax.lax.fori_loop(0, steps, lambda step, state: minibatch_step(
            method, batch_size, params, state, split, bank, labels, order, seen, step, epoch_key),
            state)

    return jax.jit(run)


@functools.lru_cache(maxsize=64)
def make_step(method: Method, batch_size: int) -> Callable:
    """Jitted (cached) ``minibatch_step`` (its arguments after ``batch_size``)."""
    return jax.jit(functools.partial(minibatch_step, method, batch_size))


_shuffle = jax.jit(shuffle_revealed, static_argnums=2)


def train_phase(method: Method, schedule: Schedule, params: Params, state: State, split: Any,
                bank: jax.Array, labels: jax.Array, seen: int, key: jax.Array) -> State:
    """E epochs of ceil(seen / B) steps over the revealed samples; a fresh shuffle per epoch."""
    seen_ = jnp.int32(seen)
    for epoch in range(schedule.epochs_per_update):
        epoch_key = jax.random.fold_in(key, epoch)
        if method.train_on == "features":
            epoch = make_epoch(method, schedule.batch_size)
            state = epoch(params, state, split, bank, labels, seen_, epoch_key)
            continue
        order = _shuffle(epoch_key, seen_, labels.shape[0])
        step_fn = make_step(method, schedule.batch_size)
        for step in range(math.ceil(seen / schedule.batch_size)):
            state = step_fn(params, state, split, bank, labels, order, seen_, jnp.int32(step),
                            epoch_key)
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
            "train_step": 0.0, "train_row": 0.0}
    if method.train_step is not None:
        def step(batch):
            inputs = (jnp.zeros((batch, *features.shape[1:]), features.dtype)
                      if method.train_on == "features"
                      else jnp.zeros((batch, *image_shape), jnp.float32))
            return metrics.xla_macs(method.train_step, params, state, inputs,
                                    jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool),
                                    jax.random.key(0))

        batch, half = schedule.batch_size, max(schedule.batch_size // 2, 1)
        macs["train_step"] = step(batch)
        macs["train_row"] = ((macs["train_step"] - step(half)) / (batch - half) if batch > 1
                             else macs["train_step"])
    return macs


def total_macs(per_call: dict[str, float], length: int, train_steps: int, batch_size: int,
               train_on: str, train_rows: int | None = None, phases: int = 0
               ) -> dict[str, float]:
    """Per-call MACs plus the stream totals, with and without feature caching (module doc);
    ``train_rows``: the real rows of the ``train_steps`` minibatches (None: all full)."""
    train_rows = train_steps * batch_size if train_rows is None else train_rows
    inference = length * (per_call["embed"] + per_call["predict"])
    updates = length * per_call["update"]
    training = (train_steps * per_call["train_step"]
                - (train_steps * batch_size - train_rows) * per_call.get("train_row", 0.0))
    phase_starts = phases * per_call.get("phase_start", 0.0)
    total = inference + updates + training + phase_starts
    recompute = train_rows * per_call["embed"] if train_on == "features" else 0.0
    return {**{f"per_call_{k}": v for k, v in per_call.items()},
            "inference": inference, "updates": updates, "training": training,
            "phase_starts": phase_starts, "train_rows": float(train_rows),
            "total": total, "total_uncached": total + recompute}


def resolve_schedule(method: Method, schedule: Schedule | None) -> Schedule | None:
    """The schedule a stream uses: ``schedule`` if given, else the method's own."""
    if method.train_step is None:
        return None
    return schedule if schedule is not None else (method.schedule or Schedule())


def run_stream(method: Method, params: Params, stream: Stream, split: data.Split, key: jax.Array,
               schedule: Schedule | None = None, count_macs: bool = True,
               embed_batch: int = 1000, phase_macs: float = 0.0) -> StreamRecord:
    """Predict-then-update over ``stream``; returns the predictions, scores and compute.

    ``schedule``: None uses the method's own (``method.schedule``), unscaled.
    ``phase_macs``: MACs counted before each training phase (``phase_start``, module doc).
    """
    if method.train_on not in TRAIN_INPUTS:
        raise UserError(f"method {method.name!r}: train_on={method.train_on!r}; "
                        f"valid: {TRAIN_INPUTS}")
    schedule = resolve_schedule(method, schedule)
    length = int(stream.label.shape[0])
    chex.assert_shape([stream.sample_idx, stream.label], (length,))
    init_key, train_key = jax.random.split(key)
    state = method.init(params, init_key)
    image_shape = tuple(split.images.shape[1:])
    per_call = ({**call_macs(method, params, state, image_shape, schedule or Schedule()),
                 "phase_start": float(phase_macs)} if count_macs else None)
    start_time = time.perf_counter()

    trains = schedule is not None
    on_features = trains and method.train_on == "features"
    scan = make_scan(method)
    positions = jnp.arange(length)
    bank = stream.sample_idx  # images: the revealed rows of it are passed to a phase
    banked = []
    ends = (schedule.phase_ends(length) if trains
            else list(range(PROGRESS_SAMPLES, length, PROGRESS_SAMPLES)))
    predictions, scores, train_steps, train_rows, phases = [], [], 0, 0, 0
    chunks = list(zip([0, *ends], [*ends, length]))
    with progress.tracker(f"FLUID {method.name}", length, "samples") as bar:
        # one embed program
        batch = min(embed_batch, max(end - begin for begin, end in chunks))
        for begin, end in chunks:
            features = embed_samples(method, params, state, split,
                                     stream.sample_idx[begin:end], batch)
            state, (label, score) = scan(params, state, features, stream.label[begin:end])
            predictions.append(label)
            scores.append(score)
            if on_features:
                banked.append(features)
            if trains and end < length:
                revealed = positions < end
                if on_features:
                    bank = jnp.pad(jnp.concatenate(banked), ((0, length - end), (0, 0)))
                state = train_phase(method, schedule, params, state, split,
                                    bank if on_features else jnp.where(revealed, bank, 0),
                                    jnp.where(revealed, stream.label, -1), end,
                                    jax.random.fold_in(train_key, end))
                train_steps += schedule.steps(end)
                train_rows += schedule.epochs_per_update * end
                phases += 1
            if bar.due() or end == length:
                jax.block_until_ready(state)
                bar.update(end, **({"train_steps": train_steps} if trains else {}))
    prediction = np.concatenate([np.asarray(p) for p in predictions]).astype(np.int32)
    unseen = np.concatenate([np.asarray(s) for s in scores]).astype(np.float32)
    seconds = time.perf_counter() - start_time
    macs = (total_macs(per_call, length, train_steps, schedule.batch_size if trains else 0,
                       method.train_on, train_rows, phases) if count_macs else {})
    finite = all(bool(jnp.isfinite(leaf).all()) for leaf in jax.tree.leaves(state)
                 if jnp.issubdtype(leaf.dtype, jnp.floating))
    return StreamRecord(prediction, unseen, train_steps, macs, seconds, finite)
