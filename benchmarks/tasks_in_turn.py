"""A batch of tasks one at a time against one vmap, on this backend: evaluation and meta-training.

    python benchmarks/tasks_in_turn.py                          # ProtoNets B3, B10, C3, A3
    python benchmarks/tasks_in_turn.py --learners=protonets --cells=B3 --meta_batch=1,4

``episode.sequential`` decides how a device runs its batch of tasks: one at a time
(``lax.map``) on CPU, one ``vmap`` on an accelerator. This measures both on this backend,
on synthetic glyphs with fresh parameters (no training needed to time a program):

- ``kind=eval``: ``evaluate`` over ``--eval_tasks`` test tasks, ``--eval_batch`` tasks per
  program, with ``tasks_in_turn`` true and false (seconds after a compiled warm-up);
- ``kind=train``: one meta-training step (``steps.make_train_step``) of ``--meta_batch``
  tasks, with ``in_turn`` true and false.

Each timing is the median of ``--repeats`` calls, the layouts interleaved so that a busy
machine disturbs both alike. Prints a line per row with the ratio vmap / in turn (above 1: one
at a time is faster), whether the two layouts' numbers (per-task CE; the params and optimiser
state after the step) agree bit for bit, their largest difference relative to each array's
largest value, and one JSON line per row.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax import data
from cfsl_jax.learners import get_learner
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.training.evaluate import evaluate
from cfsl_jax.training.steps import make_train_step
from cfsl_jax.training.train import TrainConfig, make_optimizer

_LEARNERS = flags.DEFINE_list("learners", ["protonets"], "Learners to time.")
_CELLS = flags.DEFINE_list("cells", ["B3", "B10", "C3", "A3"], "Task cells.")
_KINDS = flags.DEFINE_list("kinds", ["eval", "train"], "eval, train.")
_EVAL_TASKS = flags.DEFINE_integer("eval_tasks", 100, "Tasks per evaluation.")
_EVAL_BATCH = flags.DEFINE_integer("eval_batch", 50, "Tasks per evaluation program.")
_META_BATCH = flags.DEFINE_list("meta_batch", ["1", "4"], "Tasks per meta-training step.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per layout (median).", lower_bound=1)


def timed(fns: dict[bool, callable], repeats: int) -> tuple[dict[bool, float], dict[bool, list]]:
    """({in_turn: median seconds}, {in_turn: outputs as numpy leaves}) of each function, called
    once to compile, then ``repeats`` times in turn. A function returns (seconds or None: time
    the call, outputs)."""
    outputs = {k: [np.asarray(x) for x in jax.tree.leaves(fn()[1])] for k, fn in fns.items()}
    seconds = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            start = time.perf_counter()
            took, out = fn()
            jax.block_until_ready(out)
            seconds[k].append(took if took is not None else time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in seconds.items()}, outputs


def rows_for(name: str, cell: str, split: data.Split) -> list[dict]:
    spec = TaskSpec.parse(cell)
    image_shape = tuple(split.images.shape[1:])
    learner = get_learner(name, spec, image_shape=image_shape)
    params = learner.init_params(jax.random.key(0), jnp.zeros((1, *image_shape)), spec)
    rows = []
    if "eval" in _KINDS.value:
        def run(in_turn):  # evaluate's own seconds: compilation and the cost metrics left out
            record = evaluate(learner, params, split, num_tasks=_EVAL_TASKS.value,
                              batch_size=_EVAL_BATCH.value, cost_metrics=False, per_task=True,
                              tasks_in_turn=in_turn)
            return record.seconds, np.asarray(record.per_task["ce"])
        seconds, outputs = timed({k: (lambda k=k: run(k)) for k in (True, False)},
                                 _REPEATS.value)
        rows.append(dict(kind="eval", tasks=_EVAL_TASKS.value, batch=_EVAL_BATCH.value,
                         seconds=seconds, outputs=outputs))
    if "train" in _KINDS.value:
        optimizer = make_optimizer(TrainConfig(learner=name))
        opt_state = optimizer.init(params)
        for meta_batch in map(int, _META_BATCH.value):
            steps = {k: make_train_step(learner, optimizer, meta_batch, in_turn=k)
                     for k in (True, False)}
            fns = {k: (lambda k=k: (None, steps[k](params, opt_state, split, jax.random.key(1),
                                                   jnp.float32(0.5))[:2])) for k in steps}
            seconds, outputs = timed(fns, _REPEATS.value)
            rows.append(dict(kind="train", meta_batch=meta_batch, seconds=seconds,
                             outputs=outputs))
    out = []
    for row in rows:
        seconds, outputs = row.pop("seconds"), row.pop("outputs")
        pairs = list(zip(outputs[True], outputs[False]))  # each leaf's difference over its scale
        out.append(dict(benchmark="tasks_in_turn", learner=name, cell=cell, **row,
                        in_turn_s=round(seconds[True], 4), vmap_s=round(seconds[False], 4),
                        vmap_over_in_turn=round(seconds[False] / seconds[True], 2),
                        bit_equal=all(np.array_equal(a, b) for a, b in pairs),
                        max_relative_difference=max(float(np.max(np.abs(a - b), initial=0) / max(
                            np.max(np.abs(b), initial=0), 1e-30)) for a, b in pairs),
                        backend=jax.default_backend()))
    return out


def main(argv) -> None:
    del argv
    split = data.load_split("synthetic", "test")
    rows = []
    for name in _LEARNERS.value:
        for cell in _CELLS.value:
            for row in rows_for(name, cell, split):
                rows.append(row)
                what = (f"eval {row['tasks']} tasks" if row["kind"] == "eval"
                        else f"train, meta-batch {row['meta_batch']}")
                print(f"{name} {cell} {what}: in turn {row['in_turn_s']:.3f} s, one vmap "
                      f"{row['vmap_s']:.3f} s (x{row['vmap_over_in_turn']}), bit-equal "
                      f"{row['bit_equal']} (largest relative difference "
                      f"{row['max_relative_difference']:.1e})", file=sys.stderr, flush=True)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    app.run(main)
