"""The CFSL task sampler: Algorithm 1 of the paper, as indices, in one XLA program.

``sample_task(key, class_table, class_sizes, spec)`` is a pure function of an
explicit key with fixed output shapes, so it jits and vmaps over keys;
``sample_tasks`` is that vmap, jitted with ``spec`` static.

How a task is drawn (I = ceil(NSS/CCI) groups, m = min(CCI, NSS)):

1. ``I*NC`` distinct classes: the top ``I*NC`` of one uniform draw per class
   (top-k of i.i.d. uniforms is a uniformly random subset, in random order,
   and much cheaper than a permutation). Group g takes rows g*NC..g*NC+NC-1.
2. For each chosen class, ``R`` distinct samples: top-R of one uniform per
   slot of its class-table row, padding slots masked out. ``R = m*(KS+KT)``
   (``per_support_set``) or ``m*KS+KT`` (``per_class``), enough for the
   longest group. Support set n (group g = n // CCI, j = n % CCI) takes draws
   ``j*KS..(j+1)*KS`` of each class of group g; its target part takes
   ``m*KS + j*KT ..`` (``per_support_set``), or each class gives draws
   ``m*KS..m*KS+KT`` once (``per_class``). Draws never repeat, so no sample
   is used twice in a task.
3. Labels: position in group with overwrite, else ``g*NC + position``
   (``spec.label_offset="per_support_set"``, the authors' paper-era rule:
   ``n*NC + position`` for support set n and its target part).
4. Each support set and the target set are shuffled.

The paper-era samplers (``spec.draws``, see ``cfsl_jax.protocol.spec``): "per_group"
draws ``R = KS+KT`` samples per class and every support set of a group takes
draws ``0..KS`` (its target part ``KS..KS+KT``); "independent" draws each
group's classes with its own top-NC (classes may recur across groups) and
``R = KS+KT`` samples per class for every support set on its own (rows of
``draws`` are then support sets, not groups). "distinct" (the default) runs
exactly the steps above.

All slicing in step 2 is by static index tables built from ``spec`` once.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax.protocol.spec import TaskSpec


class TaskIndices(NamedTuple):
    """One task as indices into a split's images (add a leading batch axis for many)."""

    support_idx: jax.Array  # int32 [NSS, NC*KS] image indices, support set n in row n
    support_labels: jax.Array  # int32 [NSS, NC*KS] in [0, spec.num_outputs)
    target_idx: jax.Array  # int32 [T] image indices of the whole target set
    target_labels: jax.Array  # int32 [T]
    target_group: jax.Array  # int32 [T] class group of each target sample
    classes: jax.Array  # int32 [I, NC] row g = the class ids of group g


class _Layout(NamedTuple):
    """Static gather tables: where each support/target slot comes from in draws[I, NC, R]."""

    draws: int  # R, distinct samples drawn per class
    support_group: np.ndarray  # int [NSS, NC*KS] row of draws[I, NC, R] (support set n if
    # draws="independent": draws[NSS, NC, R])
    support_class: np.ndarray  # int [NSS, NC*KS] position in group
    support_draw: np.ndarray  # int [NSS, NC*KS]
    target_group: np.ndarray  # int [T] row of draws (as support_group)
    target_class: np.ndarray  # int [T]
    target_draw: np.ndarray  # int [T]
    support_offset: np.ndarray  # int [NSS, NC*KS] label offset / NC (without overwrite)
    target_offset: np.ndarray  # int [T]
    target_class_group: np.ndarray  # int [T] class group of each target slot


@functools.lru_cache(maxsize=None)
def _layout(spec: TaskSpec) -> _Layout:
    m, ks, kt, nc = spec.max_group_length, spec.ks, spec.kt, spec.nc
    n = np.arange(spec.nss)[:, None, None]
    c = np.arange(nc)[None, :, None]
    group, j = n // spec.cci, n % spec.cci
    per_set = spec.label_offset == "per_support_set"
    row = n if spec.draws == "independent" else group
    if spec.draws != "distinct":  # every support set takes draws 0..KS, its target KS..KS+KT
        m, j = 1, 0 * j
    shape = (spec.nss, nc, ks)
    support = [np.broadcast_to(a, shape).reshape(spec.nss, nc * ks)
               for a in (row, c, j * ks + np.arange(ks), n if per_set else group)]
    if spec.target_mode == "per_support_set":
        shape = (spec.nss, nc, kt)
        target = (row, c, m * ks + j * kt + np.arange(kt), n if per_set else group, group)
    else:  # a per_class target part is its group's (TaskSpec refuses it where n would differ)
        shape = (spec.num_groups, nc, kt)
        groups = np.arange(spec.num_groups)[:, None, None]
        target = (groups, c, m * ks + np.arange(kt), groups, groups)
    target = [np.broadcast_to(a, shape).reshape(-1) for a in target]
    return _Layout(spec.samples_per_class(), *support[:3], *target[:3], support[3], target[3],
                   target[4])


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def check_split(class_table, class_sizes, spec: TaskSpec) -> None:
    """Refuse up front a spec this split cannot supply (ValueError naming the numbers)."""
    num_classes, slots = class_table.shape
    if _is_concrete(class_sizes):
        chex.assert_shape(class_sizes, (num_classes,))
        min_size = int(np.min(np.asarray(class_sizes)))
    else:  # Under a trace only the table's width is known.
        min_size = slots
    spec.check_feasible(num_classes, min_size)


def _shuffle(key: jax.Array, values: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """Apply one random permutation along the last axis to every array in ``values``."""
    order = jnp.argsort(jax.random.uniform(key, values[0].shape), axis=-1)
    return tuple(jnp.take_along_axis(v, order, axis=-1) for v in values)


def sample_task(key: jax.Array, class_table: jax.Array, class_sizes: jax.Array,
                spec: TaskSpec) -> TaskIndices:
    """Sample one task (Algorithm 1) as indices into the split's images.

    Args:
      key: a ``jax.random`` key; the task is a pure function of it.
      class_table: int32 [C, S], row c = image indices of class c, padded with -1.
      class_sizes: int32 [C], valid entries of each row.
      spec: the TaskSpec (static).
    """
    check_split(class_table, class_sizes, spec)
    layout = _layout(spec)
    num_classes, slots = class_table.shape
    class_key, draw_key, support_key, target_key = jax.random.split(key, 4)

    # 1. I*NC distinct classes, group g = row g.
    if spec.draws == "independent":  # each group on its own: NC distinct classes
        _, classes = jax.lax.top_k(
            jax.random.uniform(class_key, (spec.num_groups, num_classes)), spec.nc)
        classes = classes.astype(jnp.int32)
        row_classes = classes[np.arange(spec.nss) // spec.cci]  # [NSS, NC]
    else:
        _, classes = jax.lax.top_k(jax.random.uniform(class_key, (num_classes,)),
                                   spec.num_classes)
        classes = row_classes = classes.reshape(spec.num_groups, spec.nc).astype(jnp.int32)

    # 2. R distinct samples of each chosen class (padding slots can never win).
    scores = jax.random.uniform(draw_key, (*row_classes.shape, slots))
    valid = jnp.arange(slots) < class_sizes[row_classes][..., None]
    _, slot = jax.lax.top_k(jnp.where(valid, scores, -1.0), layout.draws)
    draws = class_table[row_classes[..., None], slot]  # [I (NSS), NC, R] image indices

    def labels(offset, position):
        return position if spec.overwrite else offset * spec.nc + position

    support_idx = draws[layout.support_group, layout.support_class, layout.support_draw]
    support_labels = jnp.asarray(labels(layout.support_offset, layout.support_class), jnp.int32)
    target_idx = draws[layout.target_group, layout.target_class, layout.target_draw]
    target_labels = jnp.asarray(labels(layout.target_offset, layout.target_class), jnp.int32)
    target_group = jnp.asarray(layout.target_class_group, jnp.int32)

    # 4. Shuffle within each support set and within the target set.
    support_idx, support_labels = _shuffle(support_key, (support_idx, support_labels))
    target_idx, target_labels, target_group = _shuffle(
        target_key, (target_idx, target_labels, target_group))
    return TaskIndices(support_idx, support_labels, target_idx, target_labels, target_group,
                       classes)


@functools.partial(jax.jit, static_argnames="spec")
def _sample_tasks(keys, class_table, class_sizes, spec):
    return jax.vmap(sample_task, in_axes=(0, None, None, None))(keys, class_table, class_sizes,
                                                                 spec)


def sample_tasks(keys: jax.Array, class_table: jax.Array, class_sizes: jax.Array,
                 spec: TaskSpec) -> TaskIndices:
    """``sample_task`` vmapped over a [B] array of keys (jitted; fields gain a leading B axis)."""
    check_split(class_table, class_sizes, spec)
    return _sample_tasks(keys, class_table, class_sizes, spec)
