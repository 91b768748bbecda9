"""Fine-tuning baselines: Init+Tune, Pretrain+Tune, and both with EWC, from one factory.

Every variant is a Conv-4 (48 filters, LeakyReLU by default) with a linear
head of ``spec.num_outputs`` units, whose adaptable weights (every conv and
linear kernel and bias; the norm layers' scale/bias stay at ``params``, as the
authors' ``get_inner_loop_parameter_dict`` skips "norm_layer" parameters and
their configs set ``enable_inner_loop_optimizable_bn_params: false``) are
copied into the task's adaptation state and fine-tuned on each support set in
turn; the weights are carried from one support set to the next. ``predict``
applies the fast weights. ``params`` are drawn Xavier-uniform with zero
biases (``weight_init="xavier"``, as the authors' ``MetaConv2dLayer`` /
``MetaLinearLayer``).

- ``init_tune``: the network is a fixed random init, a function of the init
  key (``training="none"``): the init is the model; ``init`` copies it.
- ``pretrain_tune``: ``params["embed"]`` is pretrained by ``cfsl_jax.training.pretrain``
  (ordinary cross-entropy over all training classes, ``training="pretrain"``);
  ``init(params, key, spec)`` pairs it with ``params["head"]``, a random head
  that pretraining never touches and every task starts from (the authors'
  ``linear_0`` head; their pretraining trains a separate ``linear_1``).
  ``fresh_head=True`` draws a new head from ``key`` for every task instead.
- ``ewc_init`` / ``ewc_pretrain``: the two above plus Elastic Weight
  Consolidation. After fine-tuning on a support set, that set's diagonal
  Fisher is ADDED to the carried Fisher and the anchors theta* become the
  current weights; fine-tuning on the next set minimises
  ``CE + ewc_lambda / 2 * sum(F * (theta - theta*)**2)``.

Fisher: ``models.fisher.empirical_fisher``, the *empirical* diagonal Fisher
``mean_i (d log p(y_i | x_i) / d theta)**2`` over the support samples, at the
weights after fine-tuning on that set, with the true labels ``y_i``. The
network normalises with the statistics of the batch it is given, so each
per-sample log-likelihood is that of the sample inside its whole support set
(one backward pass per sample, via ``jacrev``), never of a batch of one (whose
statistics would be degenerate).

Inner loop: ``inner_steps`` full-batch steps of plain SGD (no optimiser
state), so the state -- the ATM -- is exactly the adapted weights (3x
with EWC: weights, Fisher, anchors), all float32. With EWC each step is a
proximal gradient step: a gradient step on the CE, then the EWC penalty's
exact proximal map ``theta <- (theta + s F theta*) / (1 + s F)``,
``s = learning_rate * ewc_lambda``. To first order in ``s F`` this is SGD on
CE + penalty, but it is stable for any lambda, where an explicit step on the
penalty diverges once ``s F > 2`` (an accumulated Fisher reaches that for
lambda in the thousands). The steps are a ``lax.scan`` with ``unroll=True``:
XLA's cost analysis counts a while-loop body once, so a rolled loop would
make ``metrics.learner_macs`` undercount adaptation ``inner_steps``-fold;
unrolling a few steps of a small net only costs compile time.

Options: ``FinetuneOptions`` (``EwcOptions`` for the EWC learners: plus
``ewc_lambda``, default 1e4: a fitted support set's empirical Fisher is tiny,
so lambda must be large to matter). ``restart_each_support_set=True`` ("as
published") makes every support set restart from ``params`` instead of the
carried weights, so only the last support set reaches the target (with EWC the
Fisher and the anchors still accumulate). ``per_step_bn_rows=True`` ("as
published"; pretrain_tune and ewc_pretrain, a no-op for the init learners,
whose norm layers are never trained) normalises as the authors' per-step
batch-norm tables did: their pretraining trains row 0 only, and fine-tuning
step k of a task (counted across its support sets) and the target prediction
read rows k and NSS*S, so only a task's very first step uses the pretrained
scale/bias, and every later step, the prediction and, with EWC, the Fisher use
the initial scale 1 / bias 0; the state then carries an int32 step counter (4
bytes of ATM). Statistics are the batch's either way, as in their code.
``conv="auto"`` is im2col on every platform (``models.conv``).
docs/fidelity.md gives the sources of the defaults, docs/results.md the
measurements behind them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import traverse_util

from cfsl_jax.runtime.errors import UserError
from cfsl_jax.learners.shapes import check_image_shape, embedding_dim
from cfsl_jax.protocol.learner import Learner, Params, Recipe
from cfsl_jax.models.conv import CONV_IMPLS
from cfsl_jax.models.conv4 import ACTIVATIONS, Conv4, LinearHead
from cfsl_jax.models.fisher import LogitsFn, empirical_fisher
from cfsl_jax.models.init import WEIGHT_INITS, reinitialize
from cfsl_jax.runtime.options import check_fields, option
from cfsl_jax.protocol import metrics
from cfsl_jax.protocol.spec import TaskSpec

class TuneState(NamedTuple):
    weights: Params  # float32 fast weights: the adapted leaves of {"embed": Conv4, "head": head}
    step: jax.Array | None = None  # int32 [] steps taken in this task; only per_step_bn_rows


class EwcState(NamedTuple):
    weights: Params  # float32 fast weights, as in TuneState
    fisher: Params  # float32, tree of ``weights``: diagonal Fisher summed over the sets seen
    anchors: Params  # float32, tree of ``weights``: theta*, the weights after the last set
    step: jax.Array | None = None  # as in TuneState


def ewc_proximal(weights: Params, fisher: Params, anchors: Params, strength: float) -> Params:
    """Exact minimiser of ``|theta - w|^2 / 2 + strength / 2 * sum F (theta - theta*)^2``.

    With ``strength = learning_rate * ewc_lambda`` this is the EWC half of a
    proximal gradient step: ``(w + strength F theta*) / (1 + strength F)``.
    """
    return jax.tree.map(lambda w, f, a: (w + strength * f * a) / (1.0 + strength * f),
                        weights, fisher, anchors)


def sgd(loss_fn: Callable[[Params], jax.Array], weights: Params, steps: int,
        learning_rate: float, proximal: Callable[[Params], Params] | None = None) -> Params:
    """``steps`` full-batch gradient steps on ``loss_fn``, each followed by ``proximal``.

    Unrolled (see the module doc); no optimiser state.
    """

    def step(weights, _):
        grads = jax.grad(loss_fn)(weights)
        weights = jax.tree.map(lambda w, g: w - learning_rate * g, weights, grads)
        return (weights if proximal is None else proximal(weights)), None

    weights, _ = jax.lax.scan(step, weights, None, length=steps, unroll=True)
    return weights


@dataclasses.dataclass(frozen=True)
class FinetuneOptions:
    """``init_tune`` / ``pretrain_tune``: the network's and the inner loop's options."""

    inner_steps: int = option(5, "Full-batch SGD steps on each support set.", minimum=1)
    learning_rate: float = option(0.01, "Inner SGD learning rate.", above=0)
    filters: int = option(48, "Conv-4 channels.", minimum=1)
    activation: str = option("leaky_relu", "Conv-4 activation.", choices=tuple(ACTIVATIONS))
    adapt_norm: bool = option(False, "The norm layers' scale/bias adapt too (and join the "
                              "ATM).")
    fresh_head: bool = option(False, "A new random head for every task (drawn from the task's "
                              "key) in place of params['head'].")
    restart_each_support_set: bool = option(False, "Every support set restarts from params "
                                            "(the paper-era code).")
    per_step_bn_rows: bool = option(False, "The authors' per-step BN rows (pretrained learners): "
                                    "only a task's first step uses the pretrained norm "
                                    "scale/bias, later steps and the prediction the initial "
                                    "1/0.")
    weight_init: str = option("xavier", "Init of the Conv-4 and the head (models.init).",
                              choices=WEIGHT_INITS)
    conv: str = option("auto", "Convolution implementation (models.conv).", choices=CONV_IMPLS)

    def __post_init__(self):
        check_fields(self)
        if self.restart_each_support_set and self.fresh_head:
            raise UserError("restart_each_support_set=True needs fresh_head=False (the weights "
                            "a support set restarts from are params), got fresh_head=True")
        if self.per_step_bn_rows and self.adapt_norm:
            raise UserError("per_step_bn_rows=True needs adapt_norm=False (the authors' per-step "
                            "rows are never adapted), got adapt_norm=True")


@dataclasses.dataclass(frozen=True)
class EwcOptions(FinetuneOptions):
    """``ewc_init`` / ``ewc_pretrain``: the fine-tuning options and EWC's strength."""

    ewc_lambda: float = option(1e4, "EWC penalty weight lambda.", minimum=0)


def is_norm_leaf(path: tuple[str, ...]) -> bool:
    """Whether a weight leaf belongs to a norm layer (kept at ``params`` unless ``adapt_norm``)."""
    return any(str(part).startswith("BatchStatNorm") for part in path)


def initial_norm(norm: Params) -> Params:
    """``norm`` (norm-layer leaves) at their initial values: scale 1, bias 0."""
    flat = traverse_util.flatten_dict(norm)
    return traverse_util.unflatten_dict({k: (jnp.ones_like if k[-1] == "scale" else
                                             jnp.zeros_like)(v) for k, v in flat.items()})


def split_norm(weights: Params) -> tuple[Params, Params]:
    """(non-norm leaves, norm leaves) of ``weights``, as two nested dicts."""
    flat = traverse_util.flatten_dict(weights)
    return (traverse_util.unflatten_dict({k: v for k, v in flat.items() if not is_norm_leaf(k)}),
            traverse_util.unflatten_dict({k: v for k, v in flat.items() if is_norm_leaf(k)}))


def _finetune(name: str, spec: TaskSpec, image_shape: tuple[int, int, int], *,
              pretrained: bool, opts: FinetuneOptions) -> Learner:
    """The one factory behind all four learners: EWC when ``opts`` are ``EwcOptions``."""
    ewc_lambda = opts.ewc_lambda if isinstance(opts, EwcOptions) else None
    inner_steps, learning_rate = opts.inner_steps, opts.learning_rate
    adapt_norm, fresh_head = opts.adapt_norm, opts.fresh_head
    restart_each_support_set = opts.restart_each_support_set
    # Init+Tune's norm layers are never trained: every row of the authors' tables is the init.
    per_step_rows = opts.per_step_bn_rows and pretrained
    image_shape = tuple(image_shape)
    embed = Conv4(filters=opts.filters, activation=opts.activation, conv_impl=opts.conv)
    head = LinearHead(spec.num_outputs)
    scheme = opts.weight_init

    def network(weights: Params, x: jax.Array) -> jax.Array:
        return head.apply(weights["head"], embed.apply(weights["embed"], x))

    def new_head(key: jax.Array, embed_params: Params) -> Params:
        dim = embedding_dim(embed, embed_params, image_shape)
        head_key, init_key = jax.random.split(key)
        return reinitialize(head.init(head_key, jnp.zeros((1, dim), jnp.float32)), init_key,
                            scheme)

    def init_params(key, example_x, spec):
        check_image_shape(example_x, image_shape)
        embed_key, head_key = jax.random.split(key)
        embed_params = reinitialize(embed.init(embed_key, example_x),
                                    jax.random.fold_in(embed_key, 1), scheme)
        return {"embed": embed_params, "head": new_head(head_key, embed_params)}

    def split(weights: Params) -> tuple[Params, Params]:
        """(adapted leaves, leaves kept at params) of full network weights."""
        return (weights, {}) if adapt_norm else split_norm(weights)

    def start(params: Params, key: jax.Array | None) -> Params:
        """The adapted leaves a task starts from."""
        head_params = new_head(key, params["embed"]) if fresh_head else params["head"]
        return split({"embed": params["embed"], "head": head_params})[0]

    def kept_leaves(params: Params) -> Params:
        return split({"embed": params["embed"], "head": params["head"]})[1]

    def with_kept(kept: Params) -> LogitsFn:
        return lambda weights, x: network(merge(weights, kept), x)

    def logits_fn(params: Params) -> LogitsFn:
        """The network of the prediction (per_step_rows: an untrained row, the initial affine)."""
        kept = kept_leaves(params)
        return with_kept(initial_norm(kept) if per_step_rows else kept)

    def init(params, key, spec):
        weights = start(params, key)
        step = jnp.zeros((), jnp.int32) if per_step_rows else None
        if ewc_lambda is None:
            return TuneState(weights, step)
        return EwcState(weights, jax.tree.map(jnp.zeros_like, weights), weights, step)

    def adapt(params, state, support_x, support_y):
        chex.assert_shape(support_x, (None, *image_shape))
        chex.assert_shape(support_y, (support_x.shape[0],))
        apply = logits_fn(params)

        def loss_of(network_fn: LogitsFn) -> Callable[[Params], jax.Array]:
            return lambda weights: metrics.cross_entropy(network_fn(weights, support_x),
                                                         support_y)

        proximal = None
        if ewc_lambda is not None:
            proximal = functools.partial(ewc_proximal, fisher=state.fisher, anchors=state.anchors,
                                         strength=learning_rate * ewc_lambda)
        initial = start(params, None) if restart_each_support_set else state.weights
        step = state.step
        if per_step_rows:  # row state.step + k for step k: row 0 (the trained one) only at 0
            kept = kept_leaves(params)
            row = jax.tree.map(lambda trained, init: jnp.where(step == 0, trained, init), kept,
                               initial_norm(kept))
            weights = sgd(loss_of(with_kept(row)), initial, 1, learning_rate, proximal)
            weights = sgd(loss_of(apply), weights, inner_steps - 1, learning_rate, proximal)
            step = step + inner_steps
        else:
            weights = sgd(loss_of(apply), initial, inner_steps, learning_rate, proximal)
        if ewc_lambda is None:
            return TuneState(weights, step)
        fisher = empirical_fisher(apply, weights, support_x, support_y)
        return EwcState(weights, jax.tree.map(jnp.add, state.fisher, fisher), weights, step)

    def predict(params, state, target_x):
        return logits_fn(params)(state.weights, target_x)

    return Learner(name, spec, init_params, init, adapt, predict,
                   Recipe(training="pretrain" if pretrained else "none", per_task_weights=True,
                          embed_apply=embed.apply))


def merge(adapted: Params, kept: Params) -> Params:
    """Full network weights from the adapted leaves and the leaves kept at params."""
    return traverse_util.unflatten_dict({**traverse_util.flatten_dict(kept),
                                         **traverse_util.flatten_dict(adapted)})


def init_tune(spec: TaskSpec, opts: FinetuneOptions = FinetuneOptions(), *,
              image_shape: tuple[int, int, int] = (28, 28, 1)) -> Learner:
    """Fine-tune a fixed random init on each support set in turn."""
    return _finetune("init_tune", spec, image_shape, pretrained=False, opts=opts)


def pretrain_tune(spec: TaskSpec, opts: FinetuneOptions = FinetuneOptions(), *,
                  image_shape: tuple[int, int, int] = (28, 28, 1)) -> Learner:
    """Fine-tune a pretrained embedding plus its head on each support set in turn."""
    return _finetune("pretrain_tune", spec, image_shape, pretrained=True, opts=opts)


def ewc_init(spec: TaskSpec, opts: EwcOptions = EwcOptions(), *,
             image_shape: tuple[int, int, int] = (28, 28, 1)) -> Learner:
    """``init_tune`` with Elastic Weight Consolidation across support sets."""
    return _finetune("ewc_init", spec, image_shape, pretrained=False, opts=opts)


def ewc_pretrain(spec: TaskSpec, opts: EwcOptions = EwcOptions(), *,
                 image_shape: tuple[int, int, int] = (28, 28, 1)) -> Learner:
    """``pretrain_tune`` with Elastic Weight Consolidation across support sets."""
    return _finetune("ewc_pretrain", spec, image_shape, pretrained=True, opts=opts)
