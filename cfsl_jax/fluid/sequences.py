"""FLUID sequences: a heavy-tailed stream of samples, a pure function of a key.

``make_stream(key, class_table, class_sizes, config)`` builds one stream from a
split's class table (the stream holds sample indices; images stay on device):

1. Classes. ``K = config.num_classes`` classes are drawn uniformly without
   replacement (or given: ``draw``, from ``class_draw.draw_classes``, which
   keeps an experiment's streams apart as the paper's; the rest of the stream
   is drawn from ``key`` either way); ``P = round(K * pretrain_fraction)`` of
   them are *pretrain* classes (their other samples pretrain the backbone), the
   other ``K - P`` are *novel*. With ``pretrain_mask`` [C] (e.g. Omniglot's background alphabets)
   pretrain classes are drawn from the masked classes and novel ones from the
   rest. Stream labels are remapped to ``0..K-1``, pretrain classes first
   (label ``k < P`` <=> pretrain class).
2. Counts. Each class gets a uniformly random Zipf rank ``r`` in ``1..K`` and a
   target share ``p_r = r**-s / sum_j j**-s``. A class's count is capped by the
   samples it can give: its class size, minus ``min_pretrain_samples`` for a
   pretrain class (kept back for pretraining), and by ``max_per_class`` if set
   (the paper's sequences: at most 961 images per class, Table 4). Counts are the capped
   water-filling ``n_i = clip(c * p_i, 1, cap_i)`` with ``c`` chosen so that
   ``sum n_i = length``, rounded to integers by largest remainder: the stream
   has exactly ``length`` samples, every class appears at least once, and
   uncapped classes keep their Zipf proportions. Which samples of a class enter
   the stream is uniformly random.
3. Order. ``order="uniform"``: a uniformly random permutation of the samples.
   ``order="staggered"``: classes first appear over time: class ``j`` of a
   random introduction order appears first at time ``j / K`` (of the stream)
   and its other samples at uniform times after that.
4. Flags per stream element: ``is_pretrain_class``; ``is_head_class`` (the
   class has MORE than ``head_threshold`` samples in the stream; 50 in the
   paper's ImageNet-scale setting -- scale it down for small datasets); and
   ``first_appearance`` (the first sample of its class in the stream).

Pretraining data (``StreamClasses.pretrain_table``, [P, S], -1 padded): row
``k`` lists the samples of pretrain class ``k`` that are NOT in the stream, so
pretraining data and the stream are disjoint. The pretraining set can be wider
than the stream (the paper pretrains on ImageNet-1K's 1,000 classes, 250 of
which are its streams' pretrain classes): ``config.pretrain_classes = N > P``
adds ``N - P`` *pretraining-only* classes (``extra_class``, ``extra_table``:
all their samples), drawn uniformly without replacement from the split's
classes that are not in the stream (with ``pretrain_mask``: from the masked
ones), with ``fold_in(key, 4)`` -- the stream itself is the same as with
``pretrain_classes=0`` -- or given by ``draw`` (the experiment's world). They
never enter the stream, so no novel class is ever seen in pretraining (the
paper's novel classes are outside ImageNet-1K).

Random choices are made with ``jax.random`` from ``key`` (split by purpose:
classes, ranks, samples, order); the bookkeeping is numpy. Same key, same
stream, bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax.fluid.class_draw import ClassDraw
# StreamConfig (and ORDERS) live in fluid.config, without JAX; imported here as before
from cfsl_jax.fluid.config import ORDERS, StreamConfig  # noqa: F401

class Stream(NamedTuple):
    """One FLUID stream of L samples, in stream order (device arrays)."""

    sample_idx: jax.Array  # int32 [L] rows of split.images
    label: jax.Array  # int32 [L] stream class in 0..K-1 (pretrain classes are 0..P-1)
    is_pretrain_class: jax.Array  # bool [L]
    is_head_class: jax.Array  # bool [L] its class has > head_threshold samples in the stream
    first_appearance: jax.Array  # bool [L] first sample of its class in the stream


class StreamClasses(NamedTuple):
    """Per-class facts of a stream (numpy), indexed by stream label k."""

    split_class: np.ndarray  # int32 [K] class-table row of stream class k
    is_pretrain: np.ndarray  # bool [K] k < P
    is_head: np.ndarray  # bool [K] count > head_threshold
    count: np.ndarray  # int32 [K] samples of class k in the stream
    rank: np.ndarray  # int32 [K] Zipf rank (1 = largest share)
    pretrain_table: np.ndarray  # int32 [P, S] pretrain class k's samples not in the stream, -1 pad
    extra_class: np.ndarray = np.zeros(0, np.int32)  # int32 [E] pretraining-only classes' rows
    extra_table: np.ndarray = np.zeros((0, 0), np.int32)  # int32 [E, S] their samples, -1 pad


def zipf_shares(num_classes: int, s: float) -> np.ndarray:
    """float64 [K]: share of rank r = 1..K, proportional to r**-s."""
    weights = np.arange(1, num_classes + 1, dtype=np.float64) ** -float(s)
    return weights / weights.sum()


def capped_counts(shares: np.ndarray, caps: np.ndarray, length: int) -> np.ndarray:
    """int64 [K] counts summing to ``length``: ``clip(c * shares, 1, caps)``, largest remainder.

    ``c`` is found by bisection (the clipped sum is non-decreasing in ``c``).
    """
    caps = np.asarray(caps, np.int64)
    if np.any(caps < 1):
        raise ValueError(f"every class needs at least one sample for the stream; caps {caps}")
    if not len(shares) <= length <= caps.sum():
        raise ValueError(f"length={length} must be between the number of classes "
                         f"({len(shares)}) and the samples available to the stream "
                         f"({caps.sum()})")

    def total(scale):
        return np.clip(scale * shares, 1.0, caps).sum()

    low, high = 0.0, float(caps.max()) / float(shares.min())
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if total(middle) < length else (low, middle)
    targets = np.clip(high * shares, 1.0, caps)
    counts = np.floor(targets + 1e-9).astype(np.int64)
    remainder = int(length - counts.sum())
    fractions = np.where(counts < caps, targets - counts, -1.0)
    counts[np.argsort(-fractions, kind="stable")[:remainder]] += 1
    if counts.sum() != length or np.any(counts > caps):  # cannot happen; guards the rounding
        raise AssertionError(f"apportionment failed: {counts} (caps {caps}, length {length})")
    return counts


def make_stream(key: jax.Array, class_table, class_sizes, config: StreamConfig,
                pretrain_mask=None, draw: ClassDraw | None = None
                ) -> tuple[Stream, StreamClasses]:
    """The stream and its per-class facts; a pure function of ``key`` and the arguments.
    ``draw``: its classes and pretraining-only classes as given (``class_draw``), not drawn."""
    table = np.asarray(class_table)
    sizes = np.asarray(class_sizes).astype(np.int64)
    num_split_classes = table.shape[0]
    k, p = config.num_classes, config.num_pretrain
    class_key, rank_key, sample_key, order_key = jax.random.split(key, 4)

    # 1. Classes: pretrain classes first, then novel ones.
    if k > num_split_classes:
        raise ValueError(f"num_classes={k} exceeds the split's {num_split_classes} classes")
    if draw is not None:
        chosen = np.asarray(draw.chosen)
        if chosen.shape != (k,) or np.unique(chosen).size != k:
            raise ValueError(f"the draw's classes {chosen.shape} are not {k} distinct classes")
    elif pretrain_mask is None:
        chosen = np.asarray(jax.random.permutation(class_key, num_split_classes))[:k]
    else:
        mask = np.asarray(pretrain_mask, bool)
        if mask.shape != (num_split_classes,):
            raise ValueError(f"pretrain_mask has shape {mask.shape}, "
                             f"expected ({num_split_classes},)")
        pool_p, pool_n = np.flatnonzero(mask), np.flatnonzero(~mask)
        if p > pool_p.size or k - p > pool_n.size:
            raise ValueError(f"{p} pretrain and {k - p} novel classes requested, but the mask "
                             f"offers {pool_p.size} and {pool_n.size}")
        key_p, key_n = jax.random.split(class_key)
        chosen = np.concatenate([
            pool_p[np.asarray(jax.random.permutation(key_p, pool_p.size))[:p]],
            pool_n[np.asarray(jax.random.permutation(key_n, pool_n.size))[:k - p]]])
    is_pretrain = np.arange(k) < p

    # 2. Counts: Zipf shares by a random rank, capped by what each class can give.
    rank = np.asarray(jax.random.permutation(rank_key, k)).astype(np.int32) + 1
    caps = sizes[chosen] - np.where(is_pretrain, config.min_pretrain_samples, 0)
    if config.max_per_class:
        caps = np.minimum(caps, config.max_per_class)
    if np.any(caps < 1):
        bad = int(np.argmin(caps))
        raise ValueError(f"class {int(chosen[bad])} has {int(sizes[chosen[bad]])} samples: too few "
                         f"for the stream with min_pretrain_samples={config.min_pretrain_samples}")
    count = capped_counts(zipf_shares(k, config.zipf_s)[rank - 1], caps, config.length)

    # Which samples: a uniformly random subset of each class; the rest of a
    # pretrain class is its pretraining data.
    width = table.shape[1]
    noise = np.asarray(jax.random.uniform(sample_key, (k, width)))
    valid = np.arange(width)[None, :] < sizes[chosen][:, None]
    order_in_class = np.argsort(np.where(valid, noise, 2.0), axis=1, kind="stable")
    shuffled = np.take_along_axis(table[chosen], order_in_class, axis=1)  # [K, S], valid first
    in_stream = np.arange(width)[None, :] < count[:, None]
    labels = np.repeat(np.arange(k, dtype=np.int32), count)
    sample_idx = shuffled[in_stream]  # row-major: class 0's samples, then class 1's, ...
    rest = np.where(valid & ~in_stream, shuffled, -1)[:p]
    pretrain_table = np.full((p, width), -1, np.int32)
    for row in range(p):
        kept = rest[row][rest[row] >= 0]
        pretrain_table[row, :kept.size] = kept

    # 3. Order.
    time_key, intro_key = jax.random.split(order_key)
    times = np.asarray(jax.random.uniform(time_key, (config.length,)), np.float64)
    if config.order == "staggered":
        intro = np.empty(k, np.float64)
        intro[np.asarray(jax.random.permutation(intro_key, k))] = np.arange(k) / k
        start = intro[labels]
        times = start + times * (1.0 - start)
        first_of_class = np.concatenate([[0], np.cumsum(count)[:-1]])
        times[first_of_class] = intro  # the class's first sample comes at its introduction time
    order = np.argsort(times, kind="stable")
    labels, sample_idx = labels[order], sample_idx[order]
    first = np.zeros(config.length, bool)
    first[np.unique(labels, return_index=True)[1]] = True

    if draw is None:
        extra_class, extra_table = _extra_classes(jax.random.fold_in(key, 4), table, chosen,
                                                  config, pretrain_mask)
    else:
        extra_class = np.asarray(draw.extra, np.int32)
        extra_table = table[extra_class].astype(np.int32)
    is_head = count > config.head_threshold
    stream = Stream(jnp.asarray(sample_idx, jnp.int32), jnp.asarray(labels, jnp.int32),
                    jnp.asarray(is_pretrain[labels]), jnp.asarray(is_head[labels]),
                    jnp.asarray(first))
    classes = StreamClasses(chosen.astype(np.int32), is_pretrain, is_head,
                            count.astype(np.int32), rank, pretrain_table, extra_class,
                            extra_table)
    return stream, classes


def _extra_classes(key: jax.Array, table: np.ndarray, chosen: np.ndarray, config: StreamConfig,
                   pretrain_mask) -> tuple[np.ndarray, np.ndarray]:
    """(class rows [E], samples [E, S]) of the ``pretrain_classes - P`` pretraining-only classes."""
    extra = max(config.pretrain_classes - config.num_pretrain, 0)
    pool = np.ones(table.shape[0], bool) if pretrain_mask is None else np.asarray(pretrain_mask,
                                                                                  bool).copy()
    pool[chosen] = False
    pool = np.flatnonzero(pool)
    if extra > pool.size:
        raise ValueError(f"pretrain_classes={config.pretrain_classes} needs {extra} classes "
                         f"outside the stream's {config.num_classes}, but the split offers "
                         f"{pool.size}" + (" in the pretrain mask" if pretrain_mask is not None
                                           else ""))
    rows = np.sort(pool[np.asarray(jax.random.permutation(key, pool.size))[:extra]])
    return rows.astype(np.int32), table[rows].astype(np.int32)


def pretrain_class_table(classes: StreamClasses, extra: bool = False
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(class_table [P, S], class_sizes [P]) of the pretraining data: row k = pretrain class k;
    ``extra``: then the E pretraining-only classes' rows ([P + E, S])."""
    table = classes.pretrain_table
    if extra and classes.extra_class.size:
        width = max(table.shape[1], classes.extra_table.shape[1])
        table = np.concatenate([np.pad(t, ((0, 0), (0, width - t.shape[1])), constant_values=-1)
                                for t in (table, classes.extra_table)])
    return table, (table >= 0).sum(axis=1).astype(np.int32)


def describe(stream: Stream, classes: StreamClasses) -> dict:
    """Plain-number summary of a stream (for results.json and logs)."""
    pretrain, head = np.asarray(stream.is_pretrain_class), np.asarray(stream.is_head_class)
    return {
        "length": int(stream.label.shape[0]),
        "classes": int(classes.count.size),
        "pretrain_classes": int(classes.is_pretrain.sum()),
        "head_classes": int(classes.is_head.sum()),
        "largest_class": int(classes.count.max()),
        "smallest_class": int(classes.count.min()),
        "pretrain_samples": int((classes.pretrain_table >= 0).sum()),
        "pretraining_only_classes": int(classes.extra_class.size),
        "pretraining_only_samples": int((classes.extra_table >= 0).sum()),
        "samples": {f"{'pretrain' if p else 'novel'}_{'head' if h else 'tail'}":
                    int(np.sum((pretrain == p) & (head == h)))
                    for p in (True, False) for h in (True, False)},
    }
