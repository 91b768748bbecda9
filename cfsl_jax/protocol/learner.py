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
    """How a meta-trained learner keeps batch-norm running averages (see ``Learner``).

    ``params[key]`` holds them (a "batch_stats" tree, ``models.norm``);
    ``moments(params, support_x [NSS, n, H, W, C], target_x [T, H, W, C])`` returns
    the moments of the forward passes the task's training makes, in order (each
    support set, then the target set): a tree like ``params[key]`` with leaves
    [NSS + 1, C]. The training step folds them into ``params[key]``
    (``models.norm.absorb``) after the optimiser's update, task after task.
    """

    key: str
    moments: Callable[[Params, jax.Array, jax.Array], Any]


def with_running_bn(learner: "Learner", params: Params, previous: Params, moments: Any
                    ) -> Params:
    """``params`` whose running averages are ``previous``'s with ``moments`` (leaves [K, C])
    folded in: the optimiser's update of them (weight decay) is discarded."""
    from cfsl_jax.models.norm import absorb
    key = learner.running_bn.key
    return {**params, key: absorb(previous[key], moments)}


class Learner(NamedTuple):
    """Pure functions of a learner, built by a factory that closes over its options.

    ``training``: how ``train.py`` obtains ``params``: "meta" (episodic
    meta-training on tasks), "pretrain" (ordinary cross-entropy on all
    training classes, ``cfsl_jax.training.pretrain``; params must hold the backbone
    under "embed") or "none" (a fixed function of the seed).
    ``per_task_weights``: whether ``state`` holds per-task copies of network
    weights (fine-tuning); on CPU such learners run tasks one after another,
    since vmapping per-task weights turns convolutions into slow grouped ones.
    ``meta_loss``: the learner's own meta-training objective (multi-step loss,
    SCA); None means the mean target cross-entropy of ``run_task``.
    ``for_epoch``: the learner to meta-train with in a given epoch (e.g. a
    first-order variant for the first K epochs); None means this one always.
    ``embed_apply``: for "pretrain" learners, ``embed_apply(params["embed"], x)
    -> features [n, D]``: the backbone that ``cfsl_jax.training.pretrain`` trains.
    ``evaluation``: the learner that validation and test run
    (``cfsl_jax.training.evaluate``), e.g. with batch norm on running averages; None: this one.
    ``running_bn``: how meta-training updates those running averages (``RunningBN``).
    """

    name: str
    spec: TaskSpec
    init_params: InitParamsFn
    init: InitFn
    adapt: AdaptFn
    predict: PredictFn
    training: str = "meta"
    per_task_weights: bool = False
    meta_loss: MetaLossFn | None = None
    for_epoch: Callable[[int], "Learner"] | None = None
    embed_apply: Callable[[Params, jax.Array], jax.Array] | None = None
    evaluation: "Learner | None" = None
    running_bn: RunningBN | None = None

    @property
    def evaluated(self) -> "Learner":
        """The learner that validation and test run: ``evaluation``, or this one."""
        return self.evaluation or self
