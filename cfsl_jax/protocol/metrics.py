"""Metrics: accuracy, cross-entropy, summaries over tasks, ATM from shapes, MACs from XLA.

Definitions (as in the README, "Metrics"):

- accuracy / cross-entropy: per task, on the whole target set; then mean, std
  (population, ddof=0) and a 95% confidence interval half-width
  ``1.96 * std / sqrt(num_tasks)`` over the evaluation tasks.
- across runs (seeds, streams): ``across_runs``: the mean, the sample std
  (ddof=1) and a Student-t 95% interval half-width ``t(0.975, n-1) * std /
  sqrt(n)``, as a few runs call for.
- per-group accuracy: accuracy on the target samples of the classes of each
  class group -- a curve over groups that shows forgetting.
- ATM (across-task memory): bytes of the adaptation state carried from one
  support set to the next, over the bytes of all support inputs of the task,
  both in the dtypes actually used. ``run_task`` scans a fixed-shape state, so
  the largest size during the task is its size; a learner that keeps
  per-label buffers (ProtoNets) counts the full buffer for every label the task
  can show (``num_outputs``), i.e. its worst case, not the live size.
  Meta-parameters are not ATM.
- MACs: XLA:CPU's count, ``jit(fn).lower(*args).compile().cost_analysis()
  ["flops"] / 2`` of the program compiled for a CPU device, on every backend
  (``backend.cpu_cost_analysis``; docs/metrics.md says why). XLA counts what it executes: e.g. taps of a convolution
  that fall on SAME padding are skipped, so a conv layer counts fewer MACs
  than the textbook ``H*W*K*K*Cin*Cout``. Elementwise ops count too. XLA
  counts the body of a loop (``lax.scan``, ``fori_loop``) ONCE, whatever its
  trip count: learners unroll their few inner steps inside ``adapt`` (a learner
  built with a rolled loop, MAML++'s ``unroll_inner=False``, is counted through its
  unrolled twin, ``Recipe.counted``), and ``episode.meta_step_macs`` unrolls the scan
  over support sets (``per_task_meta_step_macs`` rebuilds MAML++/SCA with ``unroll`` and
  ``unroll_inner``), so the counts are exact.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cfsl_jax.runtime import backend


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Fraction of argmax predictions equal to ``labels``; reduces the sample axis."""
    return jnp.mean(jnp.argmax(logits, axis=-1) == labels, axis=-1)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy (nats, at least float32); reduces the sample axis."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(axis=-1)


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array,
                         classes: jax.Array | None = None) -> jax.Array:
    """Mean cross-entropy (at least float32) of [n, K] ``logits`` over the samples where
    ``mask`` [n] holds (0 if none); with ``classes`` [K], the softmax runs over those classes
    only. A negative label (padding) counts as class 0 and should be masked out."""
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    if classes is not None:  # a large negative (not -inf) keeps masked gradients finite
        logits = jnp.where(classes, logits, -1e9)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    mask = mask.astype(losses.dtype)
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def neg_sq_euclidean(features: jax.Array, centres: jax.Array) -> jax.Array:
    """Logits ``-||f - c_k||^2``: [n, D] x [K, D] -> [n, K], expanded into one matrix product
    (``-(|f|^2 - 2 f.c + |c|^2)``)."""
    return -(jnp.sum(features**2, -1, keepdims=True) - 2 * features @ centres.T
             + jnp.sum(centres**2, -1))


def group_accuracy(logits: jax.Array, labels: jax.Array, groups: jax.Array,
                   num_groups: int) -> jax.Array:
    """Accuracy on the target samples of each class group: [..., num_groups]."""
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    member = jax.nn.one_hot(groups, num_groups, dtype=jnp.float32)  # [..., T, G]
    hits = jnp.einsum("...t,...tg->...g", correct, member)
    return hits / jnp.maximum(member.sum(axis=-2), 1.0)


def summarize(values) -> dict[str, float]:
    """mean, std (ddof=0) and 95% CI half-width of per-task values."""
    values = np.asarray(values, np.float64)
    std = float(values.std()) if values.size else math.nan
    return {"mean": float(values.mean()), "std": std,
            "ci95": 1.96 * std / math.sqrt(values.size)}


# t(0.975, df) for df = 1..30 (Student's t table); beyond, the Cornish-Fisher expansion.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (3 decimals)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


class Spread(NamedTuple):
    """A number across runs (seeds, streams)."""

    mean: float
    std: float  # sample std, ddof=1 (0.0 for one run)
    ci95: float  # Student-t 95% half-width t(0.975, n-1) * std / sqrt(n) (0.0 for one run)
    runs: int


def across_runs(values) -> Spread:
    """Mean, sample std and Student-t 95% interval of one number over a few runs."""
    values = np.asarray(values, np.float64)
    if values.size == 0:
        raise ValueError("across_runs needs at least one value")
    if values.size == 1:
        return Spread(float(values[0]), 0.0, 0.0, 1)
    std = float(values.std(ddof=1))
    return Spread(float(values.mean()), std, t975(values.size - 1) * std / math.sqrt(values.size),
                  int(values.size))


def tree_bytes(tree: Any) -> int:
    """Bytes of a pytree of arrays or ShapeDtypeStructs."""
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
               for leaf in jax.tree.leaves(tree))


def support_bytes(spec, image_shape: tuple[int, ...], dtype=jnp.float32) -> int:
    """Bytes of all support inputs of a task: NSS * NC*KS images in ``dtype``."""
    return spec.nss * spec.support_size * int(np.prod(image_shape)) * np.dtype(dtype).itemsize


def state_shapes(learner, params, image_shape: tuple[int, ...], dtype=jnp.float32):
    """ShapeDtypeStructs of the adaptation state carried across support sets.

    Raises if ``adapt`` changes the state's structure, shapes or dtypes (the
    scan in ``run_task`` needs a fixed carry, and ATM relies on it).
    """
    spec = learner.spec

    def init_and_adapt(params, key):
        state = learner.init(params, key, spec)
        support_x = jnp.zeros((spec.support_size, *image_shape), dtype)
        support_y = jnp.zeros((spec.support_size,), jnp.int32)
        return state, learner.adapt(params, state, support_x, support_y)

    init, after = jax.eval_shape(init_and_adapt, params, jax.random.key(0))
    if jax.tree.structure(init) != jax.tree.structure(after) or any(
            (a.shape, a.dtype) != (b.shape, b.dtype)
            for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(after))):
        raise ValueError(f"{learner.name}: adapt changes the state's structure, shapes or dtypes")
    return after


def atm(learner, params, image_shape: tuple[int, ...], dtype=jnp.float32) -> float:
    """Across-task memory: state bytes / bytes of all support inputs of the task."""
    state = state_shapes(learner, params, image_shape, dtype)
    return tree_bytes(state) / support_bytes(learner.spec, image_shape, dtype)


# The rules MACs are counted by, recorded with a run's results (``macs_rule``): 1 (no field)
# until 2026-11-28; 2 since: every convolution counted as XLA's own (``models.conv.COUNTED_IMPL``,
# whatever ``conv`` computes it with) and a meta-step's every support set, its task as arguments
MACS_RULE = 2


def xla_macs(fn: Callable, *args, **kwargs) -> float:
    """Multiply-accumulates of ``fn(*args)`` as XLA:CPU counts them: flops / 2.

    Counted on CPU whatever the default backend (``backend.cpu_cost_analysis``),
    so the number does not depend on where a run happens.
    """
    analysis = backend.cpu_cost_analysis(fn, *args, **kwargs)
    return float(analysis.get("flops", 0.0)) / 2  # a program of constants reports no flops


_MACS_COUNTED: dict[Any, Any] = {}  # counts by (what, learner, shapes, settings): see counted


def counted(what: str, count: Callable[[], Any], learner, params, *shapes: Any) -> Any:
    """``count()`` (MACs, from shapes only), counted once per process for the same learner
    object (``learners.get_learner`` returns one per settings), params' shapes and dtypes,
    ``shapes``, precision and optimisation level: a later run of the same settings does not
    compile its programs again to count them."""
    leaves, tree = jax.tree.flatten(params)
    key = (what, learner, tree, tuple((np.shape(x), jnp.result_type(x)) for x in leaves), shapes,
           backend.precision(), bool(jax.config.read("jax_disable_most_optimizations")))
    try:
        hash(key)
    except TypeError:
        return count()
    if key not in _MACS_COUNTED:
        if len(_MACS_COUNTED) >= 256:
            _MACS_COUNTED.clear()
        _MACS_COUNTED[key] = count()
    return _MACS_COUNTED[key]


def learner_macs(learner, params, image_shape: tuple[int, ...], dtype=jnp.float32
                 ) -> dict[str, float]:
    """MACs to adapt to one support set, to predict the target set, and per task: a fresh
    state (``init``: nothing for most learners, a fresh head's draw for init_tune's
    ``fresh_head``) + adapt x NSS + predict."""
    return dict(counted("learner", lambda: _learner_macs(learner, params, image_shape, dtype),
                        learner, params, tuple(image_shape), np.dtype(dtype)))


def costs(learner, params, image_shape: tuple[int, ...]) -> dict[str, float]:
    """ATM and the MACs (``learner_macs``) of ``learner``: what a test records of its costs."""
    return {"atm": atm(learner, params, image_shape),
            **learner_macs(learner, params, image_shape)}


def _learner_macs(learner, params, image_shape: tuple[int, ...], dtype) -> dict[str, float]:
    learner = learner.recipe.counted or learner  # its loops unrolled: counted exactly
    spec = learner.spec
    key = jax.random.key(0)
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         state_shapes(learner, params, image_shape, dtype))
    support_x = jnp.zeros((spec.support_size, *image_shape), dtype)
    support_y = jnp.zeros((spec.support_size,), jnp.int32)
    target_x = jnp.zeros((spec.target_size, *image_shape), dtype)
    adapt = xla_macs(learner.adapt, params, state, support_x, support_y)
    predict = xla_macs(learner.predict, params, state, target_x)
    init = xla_macs(lambda p, k: learner.init(p, k, spec), params, key)
    return {"macs_adapt": adapt, "macs_predict": predict,
            "macs_per_task": init + adapt * spec.nss + predict}
