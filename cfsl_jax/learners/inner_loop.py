"""The MAML++ inner loop, shared by ``maml_low``, ``maml_high`` and ``sca``.

A learner built here carries **fast weights** across the support sets of a
task: ``init`` copies the network's adaptable meta-parameters, and ``adapt``
takes ``inner_steps`` (S, default 5) SGD steps of cross-entropy on the current
support set alone, starting from the fast weights the previous support set
left. ``predict`` applies the network with the fast weights to the target set.

Parameters (``init_params``): ``{"net": network params, "lslr": rates,
["embed": embedding params]}``. The network's leaves whose name starts with
``step_`` (per-step batch-norm scale/bias) are meta-learned only; all its
other leaves adapt. An embedding (``maml_high``) is applied to each support
set -- and to the target set -- on its own, once per set, and is only
meta-learned.

MAML++ features, each an option (see ``InnerLoopOptions``; defaults as the
authors' released configs and code, docs/fidelity.md):

- LSLR: a learnable rate per adapted leaf and per inner step, initialised at
  ``inner_lr``; the step index k runs over all inner steps of the task
  (support set n, step s: k = n*S + s), so there are NSS*S rates per leaf
  (+1 for SCA's critic step). Off: the fixed rate ``inner_lr``.
- Per-step batch norm: a scale/bias per inner step k, meta-learned; each
  forward pass normalises with its own batch's statistics. A forward pass
  made after k inner steps uses row k: the target prediction after all
  support sets has its own row NSS*S (as the authors' ``step_idx``);
  ``target_bn_row=False`` drops that row and reuses the last support step's
  (row NSS*S - 1).
- Second-order meta-gradients; ``first_order=True`` stops the gradient
  through the inner gradients, and ``first_order_epochs=K`` meta-trains
  first-order for epochs < K (``Recipe.for_epoch``; derivative-order
  annealing). Evaluation never differentiates, so both orders predict alike.
- Multi-step loss, off by default (as the released configs), per support set
  (not the authors' per-inner-step loss, docs/fidelity.md): after each
  support set n the target
  loss over the target samples whose labels the task has shown so far;
  ``meta_loss`` weighs the NSS losses from uniform (progress 0) linearly to
  the final loss alone (progress >= ``msl_fraction``, default 0.1). Once
  annealed, the intermediate target passes are skipped at run time
  (``lax.cond``).
- ``restart_each_support_set=True`` (off; "as published"): every support set
  starts again from the meta-learned weights instead of the fast weights the
  previous set left (the step counter still advances), so only the last
  support set reaches the target prediction, as the paper-era MAML++ low-end
  code.
- ``weight_init`` ("xavier": Xavier-uniform kernels, zero biases, as the
  authors' code) draws the adapted network; ``maml.MamlHighOptions.embed_init``
  ("torch") the embedding (``models.init`` names the schemes).

State (the ATM): ``InnerState(fast, step)``: the fast weights and, when LSLR
or per-step BN is on, an int32 step counter k (4 bytes) that indexes them.

Memory and compile time: support sets always go through a ``lax.scan``
(``episode.run_task``'s, or ``meta_loss``'s with the ``unroll`` option), so the
program does not grow with NSS; ``adapt`` is wrapped in ``jax.checkpoint``
(``remat``), so a meta-gradient stores only the fast weights per support set
and recomputes the rest; the S inner steps of one support set are unrolled
(``unroll_inner``), and the per-step tables are cut to the support set's S
rows once per set. XLA's cost analysis counts a loop body once: to count one
meta-training step (``meta_step_macs``) build the learner with
``unroll=True`` (full unroll; compile time then grows with NSS).

Speed on CPU: the networks' convolutions are im2col matmuls there
(``models.densenet.Conv``); a meta-gradient is then matmuls, pads and
elementwise ops, several times faster on XLA:CPU than its convolution
gradients. Per-task weights are plain (batched, under ``vmap``) matmuls.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp

from cfsl_jax.protocol import metrics
from cfsl_jax.learners.shapes import check_image_shape
from cfsl_jax.learners.inner_loop_options import InnerLoopOptions
from cfsl_jax.models.init import reinitialize
from cfsl_jax.models.norm import META_ONLY_PREFIX, collect_moments
from cfsl_jax.protocol.spec import TaskSpec

class InnerState(NamedTuple):
    fast: Any  # the adapted weights: the network's adaptable leaves (float32, their shapes)
    step: jax.Array | None  # int32 [] inner steps taken in this task; None without LSLR/per-step BN


class TaskObjective(NamedTuple):
    loss: jax.Array  # float32 [] the (multi-step) target loss
    logits: jax.Array  # float32 [T, num_outputs] the final target logits
    state: InnerState  # after the last support set
    target_features: jax.Array  # the featurised target set


# ---- fast / meta-only leaves ---------------------------------------------------------


def is_adaptable(path: tuple[str, ...]) -> bool:
    """Whether the network leaf at ``path`` adapts in the inner loop (not a per-step BN leaf)."""
    return not path[-1].startswith(META_ONLY_PREFIX)


def split_fast(net_params: Any) -> tuple[dict, dict]:
    """(adaptable leaves, meta-only leaves) of network params, as two nested dicts."""
    flat = traverse_util.flatten_dict(net_params)
    fast = {k: v for k, v in flat.items() if is_adaptable(k)}
    frozen = {k: v for k, v in flat.items() if not is_adaptable(k)}
    return traverse_util.unflatten_dict(fast), traverse_util.unflatten_dict(frozen)


def merge_fast(fast: dict, frozen: dict) -> dict:
    """The network params with ``fast`` in place of the adaptable leaves."""
    return traverse_util.unflatten_dict({**traverse_util.flatten_dict(frozen),
                                         **traverse_util.flatten_dict(fast)})


# ---- schedules -----------------------------------------------------------------------


def msl_weights(progress: jax.Array, num_losses: int, fraction: float
                ) -> tuple[jax.Array, jax.Array]:
    """(weight of the final loss, weight of each intermediate loss) at ``progress``.

    Uniform 1/n at progress 0, linearly to (1, 0) at ``fraction``; they sum to 1.
    """
    if num_losses == 1:
        return jnp.float32(1.0), jnp.float32(0.0)
    annealed = jnp.clip(jnp.asarray(progress, jnp.float32) / fraction, 0.0, 1.0)
    final = 1.0 / num_losses + (1.0 - 1.0 / num_losses) * annealed
    return final, (1.0 - final) / (num_losses - 1)


# ---- the building blocks -------------------------------------------------------------


class InnerLoop(NamedTuple):
    """Pure pieces of a MAML++ learner; ``assemble.assemble`` makes the Learner, SCA extends
    them."""

    spec: TaskSpec
    options: InnerLoopOptions
    num_steps: int  # LSLR rates: NSS*S + extra_steps (per-step BN: the net's num_steps rows)
    init_params: Callable  # (key, example_x, spec) -> params
    init: Callable  # (params, key, spec) -> InnerState
    featurize: Callable  # (params, x) -> features (identity without an embedding)
    logits: Callable  # (params, fast, features, step) -> logits
    sgd_step: Callable  # (params, fast, loss_fn(fast), step, first_order) -> fast
    # (first_order, unrolled=options.unroll_inner) -> (params, state, x, y) -> state
    # (checkpointed); ``unrolled=True``: the S inner steps unrolled (what XLA counts exactly)
    adapt: Callable
    objective: Callable  # first_order -> (params, sx, sy, tx, ty, key, progress) -> TaskObjective
    # with running BN averages: the loop that evaluation runs (the embedding on them), and
    # (params, support_x, target_x) -> the moments of the training forward passes
    evaluation: "InnerLoop | None" = None
    moments: Callable | None = None


def make_inner_loop(spec: TaskSpec, image_shape: tuple[int, ...], net: nn.Module,
                    options: InnerLoopOptions, embed: nn.Module | None = None,
                    extra_steps: int = 0, embed_init: str = "torch",
                    embed_eval: nn.Module | None = None) -> InnerLoop:
    """The MAML++ pieces for ``net`` (called as ``net.apply(p, features, step)``).

    ``net`` has a ``num_steps`` field: the rows of its per-step tables
    (``PerStepBatchNorm``: NSS*S + extra_steps, + 1 with ``target_bn_row``);
    ``adapt`` applies a clone with S rows to the rows of the current support set.

    ``embed`` (optional) maps each set of images to the features ``net`` sees;
    ``extra_steps`` adds LSLR/BN entries after the NSS*S support-set steps.
    The net's layers are drawn by ``options.weight_init``, the embedding's by
    ``embed_init`` (schemes of ``models.init``).
    An embedding whose ``norm`` is "train" keeps batch-norm running averages in
    ``params["embed_stats"]``; ``embed_eval`` (the same embedding, ``norm="eval"``)
    then builds ``InnerLoop.evaluation``.
    """
    S = options.inner_steps
    num_steps = spec.nss * S + extra_steps
    use_step = options.lslr or options.per_step_bn or extra_steps > 0
    running = embed is not None and embed.norm != "batch"

    def embed_variables(params):
        variables = {"params": params["embed"]}
        if running:
            variables["batch_stats"] = params["embed_stats"]
        return variables

    def featurize(params, x):
        return x if embed is None else embed.apply(embed_variables(params), x)

    def moments(params, support_x, target_x):
        def of(x):
            _, variables = embed.apply(embed_variables(params), x, mutable=["intermediates"])
            return collect_moments(variables["intermediates"])
        per_set = jax.lax.map(of, support_x)
        return jax.tree.map(lambda s, t: jnp.concatenate([s, t[None]]), per_set, of(target_x))

    def init_params(key, example_x, spec):
        check_image_shape(example_x, image_shape)
        embed_key, net_key = jax.random.split(key)
        params = {}
        if embed is not None:
            variables = embed.init(embed_key, example_x)
            params["embed"] = reinitialize(variables["params"], jax.random.fold_in(embed_key, 1),
                                           embed_init)
            if running:
                params["embed_stats"] = variables["batch_stats"]
        features = jax.eval_shape(featurize, params, example_x)
        params["net"] = reinitialize(
            net.init(net_key, jnp.zeros(features.shape, features.dtype), 0)["params"],
            jax.random.fold_in(net_key, 1), options.weight_init)
        if options.lslr:
            fast, _ = split_fast(params["net"])
            params["lslr"] = jax.tree.map(
                lambda _: jnp.full((num_steps,), options.inner_lr, jnp.float32), fast)
        return params

    def init(params, key, spec):
        del key, spec
        fast, _ = split_fast(params["net"])
        return InnerState(fast, jnp.zeros((), jnp.int32) if use_step else None)

    def view(params, step, length):
        """(meta-only net leaves, LSLR rates) with the per-step tables cut to ``length`` rows.

        A table's rows start at min(step, its rows - length): inside ``adapt`` one
        dynamic slice per table and support set, then static row s per inner step.
        """
        _, frozen = split_fast(params["net"])
        rates = params.get("lslr")
        if step is None:
            return frozen, rates

        def cut(table):
            start = jnp.minimum(step, table.shape[0] - length)
            return jax.lax.dynamic_slice_in_dim(table, start, length)

        if options.per_step_bn:
            frozen = jax.tree.map(cut, frozen)
        return frozen, None if rates is None else jax.tree.map(cut, rates)

    views = {}  # rows -> the network declaring per-step tables of that many rows

    def apply_view(frozen, fast, features, row):
        tables = jax.tree.leaves(frozen)
        rows = tables[0].shape[0] if options.per_step_bn and tables else net.num_steps
        if rows not in views:
            views[rows] = net.clone(num_steps=rows)
        return views[rows].apply({"params": merge_fast(fast, frozen)}, features, row)

    def update(fast, grads, rates, row, first_order):
        if first_order:
            grads = jax.lax.stop_gradient(grads)
        if rates is None:
            return jax.tree.map(lambda p, g: p - options.inner_lr * g, fast, grads)
        return jax.tree.map(lambda p, g, r: p - r[row] * g, fast, grads, rates)

    def logits(params, fast, features, step):
        frozen, _ = view(params, step, 1)
        return apply_view(frozen, fast, features, 0)

    def sgd_step(params, fast, loss_fn, step, first_order):
        _, rates = view(params, step, 1)
        return update(fast, jax.grad(loss_fn)(fast), rates, 0, first_order)

    def remat(fn):
        if options.remat == "none":
            return fn
        policy = jax.checkpoint_policies.dots_saveable if options.remat == "dots" else None
        return jax.checkpoint(fn, policy=policy, prevent_cse=False)

    def make_adapt(first_order: bool, unrolled: bool):
        def adapt(params, state, support_x, support_y):
            features = featurize(params, support_x)
            frozen, rates = view(params, state.step, S)

            def one_step(fast, s):
                loss_fn = lambda f: metrics.cross_entropy(  # noqa: E731
                    apply_view(frozen, f, features, s), support_y)
                return update(fast, jax.grad(loss_fn)(fast), rates, s, first_order)

            fast = split_fast(params["net"])[0] if options.restart_each_support_set else state.fast
            if unrolled:
                for s in range(S):
                    fast = one_step(fast, s)
            else:
                fast, _ = jax.lax.scan(lambda f, s: (one_step(f, s), None), fast,
                                       jnp.arange(S, dtype=jnp.int32))
            return InnerState(fast, None if state.step is None else state.step + S)

        return remat(adapt)

    adapts = {(order, unrolled): make_adapt(order, unrolled)
              for order in (False, True) for unrolled in (False, True)}

    def adapt_of(first_order: bool, unrolled: bool | None = None):
        return adapts[first_order, options.unroll_inner if unrolled is None else unrolled]

    def make_objective(first_order: bool):
        adapt = adapt_of(first_order)

        def objective(params, support_x, support_y, target_x, target_y, key, progress):
            target_features = featurize(params, target_x)
            state = init(params, key, spec)
            final_w, each_w = (msl_weights(progress, spec.nss, options.msl_fraction)
                               if options.multi_step_loss else (1.0, 0.0))

            def body(carry, inputs):
                state, seen = carry
                x, y, n = inputs
                state = adapt(params, state, x, y)
                if not options.multi_step_loss:
                    return (state, seen), jnp.float32(0.0)
                seen = seen | jnp.any(jax.nn.one_hot(y, spec.num_outputs, dtype=bool), axis=0)

                # Always rematerialised: else the scan stacks NSS copies of the target
                # activations, whether or not the branch runs.
                @functools.partial(jax.checkpoint, prevent_cse=False)
                def intermediate(params, state, seen):
                    target_logits = logits(params, state.fast, target_features, state.step)
                    return metrics.masked_cross_entropy(target_logits, target_y, seen[target_y])

                loss = jax.lax.cond((each_w > 0) & (n < spec.nss - 1), intermediate,
                                    lambda *_: jnp.float32(0.0), params, state, seen)
                return (state, seen), loss

            unroll = spec.nss if options.unroll is True else options.unroll
            (state, _), losses = jax.lax.scan(
                body, (state, jnp.zeros((spec.num_outputs,), bool)),
                (support_x, support_y, jnp.arange(spec.nss, dtype=jnp.int32)), unroll=unroll)
            target_logits = logits(params, state.fast, target_features, state.step)
            final = metrics.cross_entropy(target_logits, target_y)
            loss = final_w * final + each_w * jnp.sum(losses)
            return TaskObjective(loss, target_logits, state, target_features)

        return objective

    evaluation = (None if embed_eval is None else
                  make_inner_loop(spec, image_shape, net, options, embed_eval, extra_steps,
                                  embed_init))
    return InnerLoop(spec, options, num_steps, init_params, init, featurize, logits, sgd_step,
                     adapt_of, make_objective, evaluation,
                     moments if running else None)
