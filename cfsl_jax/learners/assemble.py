"""The ``Learner`` of a MAML++ inner loop (``inner_loop.make_inner_loop``), with its variants.

    learner = assemble("maml_low", maml_low_loop(spec, image_shape, opts))

One learner per meta-gradient order (the first-order one for derivative-order annealing,
``Recipe.for_epoch``), each with the unrolled twin XLA counts MACs on when the inner steps are
rolled (``Recipe.counted``), and, for a loop with running batch-norm averages, the evaluation
learner that uses them (``Recipe.evaluation``, ``Recipe.running_bn``).
"""

from __future__ import annotations

from typing import Callable

from cfsl_jax.learners.inner_loop import InnerLoop
from cfsl_jax.protocol.learner import Learner, Recipe, RunningBN


def assemble(name: str, loop: InnerLoop, predict: Callable | None = None,
             meta_loss: Callable | None = None) -> Learner:
    """The Learner of ``loop`` (and its first-order twin for ``for_epoch``).

    ``predict(loop, first_order)`` / ``meta_loss(first_order)`` override the MAML++
    ones (SCA); by default predict applies the fast weights to the target set
    and meta_loss is the (multi-step) target loss of ``loop.objective``. A loop
    with running batch-norm averages (``loop.evaluation``) gives each variant an
    ``evaluation`` learner (the embedding on them) and ``running_bn``.
    """
    options = loop.options

    def default_predict(loop, first_order):
        del first_order

        def predict(params, state, target_x):
            return loop.logits(params, state.fast, loop.featurize(params, target_x), state.step)
        return predict

    def default_meta_loss(first_order):
        objective = loop.objective(first_order)

        def meta_loss(params, support_x, support_y, target_x, target_y, key, progress):
            result = objective(params, support_x, support_y, target_x, target_y, key, progress)
            return result.loss, result.logits
        return meta_loss

    predict = predict or default_predict
    meta_loss = meta_loss or default_meta_loss
    variants: dict[bool, Learner] = {}

    def for_epoch(epoch: int) -> Learner:
        first = options.first_order or epoch < options.first_order_epochs
        return variants[first]

    def counted(of: InnerLoop, first: bool) -> Learner | None:
        """With the inner steps rolled (``unroll_inner=False``), the same learner unrolled:
        XLA counts a loop's body once, so MACs are counted on this one."""
        if options.unroll_inner:
            return None
        return Learner(name, of.spec, loop.init_params, of.init, of.adapt(first, True),
                       predict(of, first), Recipe(per_task_weights=True))

    recipe = Recipe(training="meta", per_task_weights=True, for_epoch=for_epoch)
    if loop.evaluation is not None:
        ev = loop.evaluation
        recipe = recipe._replace(
            evaluation=Learner(name, ev.spec, loop.init_params, ev.init, ev.adapt(False),
                               predict(ev, False),
                               Recipe(per_task_weights=True, counted=counted(ev, False))),
            running_bn=RunningBN("embed_stats", loop.moments))
    for first in (False, True):
        variants[first] = Learner(name, loop.spec, loop.init_params, loop.init,
                                  loop.adapt(first), predict(loop, first),
                                  recipe._replace(meta_loss=meta_loss(first),
                                                  counted=counted(loop, first)))
    return variants[options.first_order]
