"""FLUID EWC's weight selected on VALIDATION streams (never on test streams).

    python -m benchmarks.select_fluid_ewc_weight --preset=small --weights=0,1e2,1e4,1e5,1e6,1e7

Validation streams are ``launch.fluid --streams=validation``'s: stream ``i`` is
built from ``fold_in(data key, 1000 + i)`` (``fluid.experiment.stream_key``), a
key no test stream uses, for its counts, samples and order; its classes come from
the seed's class draw (``fluid.class_draw``, ``--class_draw=disjoint``): novel
classes no test stream has, pretrain classes that it may share with one, as the
paper's validation sequences do.
For each of ``--num_streams`` validation streams from index ``--first_stream``
on, the backbone is pretrained once and EWC's Fisher computed once (both
shared by every weight), then EWC runs the stream at each weight of
``--weights`` (0: no penalty, i.e. standard training's loss). One JSON line
per (stream, weight): the stream's accuracy (the selection's score), its other
metrics, and why EWC does or does not move the weights -- the Fisher's sum
and largest entry, and at the last training step the squared distance
``|theta - theta*|^2`` of the backbone from its pretrained weights,
``sum F (theta - theta*)^2``, the penalty ``weight / 2 * sum F (theta -
theta*)^2`` and ``stiffness = learning_rate * weight * max F``: the penalty's
curvature per SGD step (EWC trains by SGD with momentum 0.9 on CE + penalty,
which diverges along a weight whose stiffness exceeds 2 (1 + momentum) = 3.8;
such a weight ends the run in NaN scores). Then the weight of highest mean
accuracy (``benchmarks.selection``; a tie keeps the smaller weight).
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.selection import Selection, grid

flags.DEFINE_string("preset", "small", "FLUID preset (fluid.experiment.PRESETS).")
flags.DEFINE_list("weights", ["0", "1e2", "1e4", "1e5", "1e6", "1e7"], "EWC weights tried.")
flags.DEFINE_integer("num_streams", 1, "Validation streams.")
flags.DEFINE_integer("first_stream", 0, "Index of the first validation stream run.")
flags.DEFINE_integer("seed", 0, "Seed of every random choice (as launch.fluid's --seed).")
FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    import jax
    import jax.numpy as jnp

    from cfsl_jax.fluid import experiment, methods

    config = experiment.preset(FLAGS.preset, methods=("ewc",), streams="validation",
                               num_streams=FLAGS.first_stream + FLAGS.num_streams,
                               seed=FLAGS.seed)
    split = experiment.load(config)
    image_shape = tuple(split.images.shape[1:])
    diagnostics: dict[str, dict] = {}

    def watched(label, method):
        """``method`` whose training steps record the backbone's distance from theta*."""
        def train_step(params, state, inputs, labels, mask, key):
            state = method.train_step(params, state, inputs, labels, mask, key)
            moved = jax.tree.map(jnp.subtract, state.weights["embed"], params["embed"])
            squared = sum(jnp.sum(d * d) for d in jax.tree.leaves(moved))
            weighted = sum(jnp.sum(f * d * d) for f, d in
                           zip(jax.tree.leaves(params["fisher"]), jax.tree.leaves(moved)))
            fisher = jnp.stack([f.sum() for f in jax.tree.leaves(params["fisher"])]).sum()
            top = jnp.stack([f.max() for f in jax.tree.leaves(params["fisher"])]).max()
            jax.debug.callback(lambda *v: diagnostics.__setitem__(label, dict(zip(
                ("fisher_sum", "fisher_max", "sq_distance", "fisher_sq_distance"),
                map(float, v)))), fisher, top, squared, weighted)
            return state

        return method._replace(train_step=train_step)

    weights = grid(FLAGS.weights)
    built = {f"ewc_weight={w:g}": watched(f"ewc_weight={w:g}", methods.get_method(
        "ewc", config.stream.num_classes, image_shape,
        **{**experiment.method_options(config, "ewc"), "ewc_weight": w})) for w in weights}
    selection = Selection("ewc_weight")
    learning_rate = methods.options_class("ewc")().learning_rate
    for index in range(FLAGS.first_stream, config.num_streams):
        _, per_method, _ = experiment.run_one_stream(config, split, built, index)
        for weight, (label, result) in zip(weights, per_method.items()):
            found = result["metrics"]
            seen = diagnostics.get(label, {})
            selection.record(weight, found["accuracy"], stream=index, **{
                key: found.get(key) for key in ("pretrain_head", "pretrain_tail", "novel_head",
                                                "novel_tail", "mean_per_class_accuracy",
                                                "auroc")},
                **seen, penalty=0.5 * weight * seen.get("fisher_sq_distance", 0.0),
                stiffness=learning_rate * weight * seen.get("fisher_max", 0.0))
    selection.select()


if __name__ == "__main__":
    app.run(main)
