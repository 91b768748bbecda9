"""The learner contract: a NamedTuple of pure functions, like optax's GradientTransformation.

A learner adapts to a task one support set at a time and then predicts the
target set. ``episode.run_task`` walks a task (for evaluation, and for
meta-training unless the learner has its own ``meta_loss``, as MAML++ and SCA):

    state = learner.init(params, key, spec)                 # fresh per task
    for each support set n:  state = learner.adapt(params, state, support_x[n], support_y[n])
    target_logits = learner.predict(params, state, target_x)

``params`` are the meta-parameters (meta-learned, pretrained, or a fixed
random init); ``state`` is everything that crosses support sets -- its bytes
are the learner's across-task memory (ATM). A learner never sees a task
object, only arrays, and ``adapt`` only ever receives the current support set.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

import jax

from cfsl_jax.protocol.spec import TaskSpec

Params = Any  # a pytree of meta-parameters
State = Any  # a pytree carried from one support set to the next (ATM)


class InitParamsFn(Protocol):

    def __call__(self, key: jax.Array, example_x: jax.Array, spec: TaskSpec) -> Params:
        """Meta-parameters for inputs shaped like ``example_x`` [n, H, W, C]."""


class InitFn(Protocol):

    def __call__(self, params: Params, key: jax.Array, spec: TaskSpec) -> State:
        """A fresh adaptation state for one task (a pure function of ``params`` and ``key``)."""


class AdaptFn(Protocol):

    def __call__(self, params: Params, state: State, support_x: jax.Array,
                 support_y: jax.Array) -> State:
        """Absorb one support set: x [NC*KS, H, W, C] float, y [NC*KS] int32 labels."""


class PredictFn(Protocol):

    def __call__(self, params: Params, state: State, target_x: jax.Array) -> jax.Array:
        """Logits [n, spec.num_outputs] for a batch of target inputs [n, H, W, C]."""


class MetaLossFn(Protocol):

    def __call__(self, params: Params, support_x: jax.Array, support_y: jax.Array,
                 target_x: jax.Array, target_y: jax.Array, key: jax.Array,
                 progress: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(scalar meta-training loss, target logits) of one task.

        ``progress`` is a float32 scalar in [0, 1]: the fraction of meta-training
        done, for annealed schedules (multi-step loss weights, SCA's weights).
        """


TRAINING_KINDS = ("meta", "pretrain", "none")


class RunningBN(NamedTuple):
    """How a meta-trained learner keeps batch-norm running averages (``Recipe.running_bn``).

    ``params[key]`` holds them (a "batch_stats" tree); ``moments(params, support_x [NSS, n, H,
    W, C], target_x [T, H, W, C])`` returns the moments of the forward passes the task's
    training makes, in order (each support set, then the target set): a tree like
    ``params[key]`` with leaves [NSS + 1, C]. The training step folds them into ``params[key]``
    after the optimiser's update, task after task (``cfsl_jax.training.train``).
    """

    key: str
    moments: Callable[[Params, jax.Array, jax.Array], Any]


class Recipe(NamedTuple):
    """How a learner is trained and evaluated: what ``cfsl_jax.training`` reads, beside the
    learner's pure functions (like optax's combinators beside ``(init, update)``).

    ``training``: how ``params`` are obtained: "meta" (episodic meta-training on tasks),
    "pretrain" (ordinary cross-entropy on all training classes, ``cfsl_jax.training.pretrain``;
    params must hold the backbone under "embed") or "none" (a fixed function of the seed).
    ``vmap_on_cpu``: a CPU device runs a batch of this learner's tasks as one vmap, not one at a
    time (``episode.sequential``; ProtoNets' ``tasks_on_cpu=vmap``, what its runs saved before
    that option existed ran).
    ``per_task_weights``: whether ``state`` holds per-task copies of network weights
    (fine-tuning). Before 2026-11-28 only such learners ran their tasks one after another on
    CPU; now every learner does (``episode.sequential``) unless ``vmap_on_cpu``.
    ``meta_loss``: the learner's own meta-training objective (multi-step loss, SCA); None means
    the mean target cross-entropy of ``episode.run_task``.
    ``for_epoch``: the learner to meta-train with in a given epoch (e.g. a first-order variant
    for the first K epochs); None means this one always.
    ``embed_apply``: for "pretrain" learners, ``embed_apply(params["embed"], x) -> features
    [n, D]``: the backbone that ``cfsl_jax.training.pretrain`` trains.
    ``evaluation``: the learner that validation and test run (``cfsl_jax.training.evaluate``),
    e.g. with batch norm on running averages; None: this one.
    ``running_bn``: how meta-training updates those running averages (``RunningBN``).
    ``counted``: the same learner with its loops unrolled, whose ``init``/``adapt``/``predict``
    XLA counts exactly (``metrics.learner_macs``: XLA counts a loop's body once); None: this
    one (its loops are unrolled, e.g. MAML++'s inner steps unless ``unroll_inner=False``).
    """

    training: str = "meta"
    per_task_weights: bool = False
    meta_loss: MetaLossFn | None = None
    for_epoch: Callable[[int], "Learner"] | None = None
    embed_apply: Callable[[Params, jax.Array], jax.Array] | None = None
    evaluation: "Learner | None" = None
    running_bn: RunningBN | None = None
    vmap_on_cpu: bool = False
    counted: "Learner | None" = None


class Learner(NamedTuple):
    """Pure functions of a learner, built by a factory from its options dataclass, and the
    ``recipe`` that says how it is trained."""

    name: str
    spec: TaskSpec
    init_params: InitParamsFn
    init: InitFn
    adapt: AdaptFn
    predict: PredictFn
    recipe: Recipe = Recipe()

    @property
    def evaluated(self) -> "Learner":
        """The learner that validation and test run: the recipe's ``evaluation``, or this one."""
        return self.recipe.evaluation or self

    def at_epoch(self, epoch: int) -> "Learner":
        """The learner to meta-train with in ``epoch``: the recipe's ``for_epoch``, or this one."""
        return self.recipe.for_epoch(epoch) if self.recipe.for_epoch else self


# The functions that return the carried state; every other computation returns outputs.
STATE_FUNCTIONS = ("init", "adapt")


def map_functions(learner: Learner, wrap: Callable[[str, Callable], Callable]) -> Learner:
    """``learner`` with every function it computes with replaced by ``wrap(name, fn)``: ``init``,
    ``adapt``, ``predict`` and the recipe's ``meta_loss``, ``embed_apply`` and
    ``running_bn.moments`` ("moments"), recursively in its ``evaluation`` and ``for_epoch``
    learners (one wrapped learner per distinct one: the trainer caches compiled steps by
    identity). ``init_params`` is left alone: the meta-parameters are the optimiser's.

    A combinator such as a precision policy is one ``wrap``; it needs no per-field forwarding.
    """
    done: dict[int, tuple[Learner, Learner]] = {}  # id(learner) -> (learner, wrapped)

    def mapped(learner: Learner) -> Learner:
        if id(learner) in done:
            return done[id(learner)][1]
        recipe = learner.recipe
        for_epoch = None
        if recipe.for_epoch is not None:
            def for_epoch(epoch: int, of=recipe.for_epoch) -> Learner:
                return mapped(of(epoch))
        running_bn = recipe.running_bn and recipe.running_bn._replace(
            moments=wrap("moments", recipe.running_bn.moments))
        out = learner._replace(
            init=wrap("init", learner.init), adapt=wrap("adapt", learner.adapt),
            predict=wrap("predict", learner.predict),
            recipe=recipe._replace(
                meta_loss=recipe.meta_loss and wrap("meta_loss", recipe.meta_loss),
                embed_apply=recipe.embed_apply and wrap("embed_apply", recipe.embed_apply),
                evaluation=recipe.evaluation and mapped(recipe.evaluation),
                counted=recipe.counted and mapped(recipe.counted),
                for_epoch=for_epoch, running_bn=running_bn))
        done[id(learner)] = (learner, out)
        return out

    return mapped(learner)
