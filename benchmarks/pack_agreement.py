"""How far a packed run, and a run of S steps per call, lands from the solo run on this backend.

    python benchmarks/pack_agreement.py --learners=protonets,maml_low --pack=3 \
        --steps=20 --steps_per_dispatch=10 --test_tasks=100

For seeds 0..K-1 (``--pack``) on the synthetic glyphs (``--cell``, one task per step, default
learner options): each seed trained alone one step per call (``train.make_train_step``, the
reference), the K seeds as one pack of S steps per call (``steps.make_steps(runs=True)``,
``--pack_axis``: ``auto`` is vmap on an accelerator and ``map`` on CPU, as ``launch.train
--seeds`` packs), and each seed alone at S steps per call (``lax.scan``). Per seed and variant,
one JSON line on stdout (a readable one on stderr): the first step's and the largest relative
loss difference from the reference, the distance of the final params from the reference's as a
fraction of how far training moved them, and the test accuracy and CE of both on the same
``--test_tasks`` tasks (``bit_equal``: every loss and parameter identical). With
``--learning_rates=A,B,..`` the pack is seed 0 at each rate instead (``launch.train
--learning_rates``: each run's rate traced), each against seed 0 alone at its rate.
docs/results.md holds the CPU and GPU figures; issue 28 asks for both.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax.runtime import backend, seeding
from cfsl_jax.training import pack_runs, runs, steps, train
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.evaluate import evaluate

_LEARNERS = flags.DEFINE_list("learners", ["protonets", "maml_low"], "Meta-trained learners.")
_CELL = flags.DEFINE_string("cell", "B3", "Paper cell.")
_PACK = flags.DEFINE_integer("pack", 3, "Seeds in the pack (0..K-1).", lower_bound=2)
_STEPS = flags.DEFINE_integer("steps", 20, "Training steps (a multiple of S).", lower_bound=1)
_S = flags.DEFINE_integer("steps_per_dispatch", 10, "Steps per call S.", lower_bound=1)
_AXIS = flags.DEFINE_enum("pack_axis", "auto", list(steps.PACK_AXES), "The pack's run axis.")
_RATES = flags.DEFINE_list("learning_rates", [], "A pack of seed 0 at these learning rates "
                           "(instead of seeds 0..K-1 at the default rate; --pack is then "
                           "ignored).")


def _distinct_positive(texts: list[str]) -> bool:
    try:
        rates = [float(text) for text in texts]
    except ValueError:
        return False
    return all(0 < rate < float("inf") for rate in rates) and len(set(rates)) == len(rates)


flags.register_validator("learning_rates", _distinct_positive,
                         "--learning_rates must be distinct positive numbers")
_TEST_TASKS = flags.DEFINE_integer("test_tasks", 100, "Test tasks (one seed for all).")
flags.register_multi_flags_validator(
    ["steps", "steps_per_dispatch"], lambda f: f["steps"] % f["steps_per_dispatch"] == 0,
    "--steps must be a multiple of --steps_per_dispatch")
_PRECISION = flags.DEFINE_enum("precision", backend.DEFAULT_PRECISION, backend.PRECISIONS,
                               "Float32 matmul/convolution precision.")


def _tree_distance(a, b) -> float:
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32) - y))
                              for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))))


def _bit_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _progress(first: int, count: int, total: int) -> jax.Array:  # as the one-step loop computes
    return jnp.asarray([np.float32((first + i) / total) for i in range(count)])


def _solo(learner, optimizer, split, params, seed: int, total: int):
    step = train.make_train_step(learner, optimizer, 1)
    key, state, losses = seeding.purpose_key(seed, "train"), optimizer.init(params), []
    for s in range(total):
        params, state, metrics = step(params, state, split, jax.random.fold_in(key, s),
                                      jnp.float32(s / total))
        losses.append(float(metrics["loss"]))
    return params, np.asarray(losses)


def _scanned(learner, optimizer, split, params, keys, count: int, total: int, pack: bool,
             hyper=None):
    multi = steps.make_steps(learner, optimizer, 1, count, runs=pack,
                             **({"pack_axis": _AXIS.value} if pack else {}),
                             **({"per_run": train.pack_optimizer} if hyper else {}))
    extra = (hyper,) if hyper else ()
    state, losses = (jax.vmap(optimizer.init) if pack else optimizer.init)(params), []
    for first in range(0, total, count):
        params, state, metrics = multi(params, state, split, keys, first,
                                       _progress(first, count, total), *extra)
        losses.append(np.asarray(metrics["loss"]))
    return params, np.concatenate(losses, axis=-1)


def _test(learner, split, params):
    return evaluate(learner, params, split, num_tasks=_TEST_TASKS.value, seed=0,
                    cost_metrics=False)


def _row(learner, variant, seed, learning_rate, init, ref, ref_losses, ref_test, params, losses,
         test) -> dict:
    rel = np.abs(losses - ref_losses) / np.abs(ref_losses)
    return {"benchmark": "pack_agreement", "backend": jax.default_backend(),
            "device_kind": jax.devices()[0].device_kind, "precision": backend.precision(),
            "jax_version": jax.__version__, "learner": learner.name, "cell": _CELL.value,
            "variant": variant, "seed": seed, "steps": _STEPS.value,
            "learning_rate": learning_rate,
            "first_loss_rel_diff": float(rel[0]), "max_loss_rel_diff": float(rel.max()),
            "params_distance_over_moved": _tree_distance(params, ref) / _tree_distance(ref, init),
            "bit_equal": bool(_bit_equal(params, ref) and np.array_equal(losses, ref_losses)),
            "solo_test": {"acc": ref_test.acc_mean, "ce": ref_test.ce_mean},
            "test": {"acc": test.acc_mean, "ce": test.ce_mean},
            "test_tasks": _TEST_TASKS.value,
            "test_fingerprint_equal": ref_test.task_fingerprint == test.task_fingerprint}


def main(argv) -> None:
    del argv
    backend.configure(_PRECISION.value)
    total, count = _STEPS.value, _S.value
    axis = steps.resolve_pack_axis(_AXIS.value)
    for name in _LEARNERS.value:
        base = TrainConfig(learner=name, dataset="synthetic", task=_CELL.value, meta_batch=1)
        configs = ([dataclasses.replace(base, learning_rate=float(r)) for r in _RATES.value]
                   or [dataclasses.replace(base, seed=seed) for seed in range(_PACK.value)])
        learner, splits = runs.build(base)
        split = splits["train"]
        optimizers = [train.make_optimizer(c) for c in configs]
        inits = [runs.init_params(learner, split, c.seed) for c in configs]
        keys = jnp.stack([seeding.purpose_key(c.seed, "train") for c in configs])
        alone = [_solo(learner, o, split, p, c.seed, total)
                 for c, o, p in zip(configs, optimizers, inits)]
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *inits)
        packed, packed_losses = _scanned(learner, optimizers[0], split, stacked, keys, count,
                                         total, pack=True,
                                         hyper=pack_runs.hyper_parameters(configs))
        for k, c in enumerate(configs):
            variants = [(f"pack of {len(configs)} ({axis}), S={count}",
                         jax.tree.map(lambda x: x[k], packed), packed_losses[k])]
            if k == 0:
                variants.append((f"alone, S={count}", *_scanned(
                    learner, optimizers[0], split, inits[0], keys[0], count, total, pack=False)))
            ref_test = _test(learner, splits["test"], alone[k][0])
            for variant, params, losses in variants:
                row = _row(learner, variant, c.seed, c.learning_rate, inits[k], *alone[k],
                           ref_test, params, losses, _test(learner, splits["test"], params))
                print(json.dumps(row), flush=True)
                print(f"{name} seed {c.seed} lr {c.learning_rate:g} {variant:24s} loss rel diff "
                      f"first {row['first_loss_rel_diff']:.2e} max "
                      f"{row['max_loss_rel_diff']:.2e}, "
                      f"params {row['params_distance_over_moved']:.2e} of the distance moved, "
                      f"test acc {row['test']['acc']:.4f} / solo {row['solo_test']['acc']:.4f}, "
                      f"CE {row['test']['ce']:.5f} / {row['solo_test']['ce']:.5f}"
                      f"{', bit-equal' if row['bit_equal'] else ''}", file=sys.stderr,
                      flush=True)


if __name__ == "__main__":
    app.run(main)
