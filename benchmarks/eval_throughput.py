"""Evaluation throughput: seconds per task over a full 600-task B10 evaluation, and compile time.

    python benchmarks/eval_throughput.py
    python benchmarks/eval_throughput.py --learners=protonets --num_tasks=200 --dataset=synthetic

Each learner is evaluated twice on the same tasks with fresh parameters (no
training is needed to time it): the first run includes compilation, the
second is the measurement. Prints a table and one JSON line per learner, with
the ratio to the issue's targets (ProtoNets <= 0.13 s/task, init_tune <= 0.48
s/task on a 2-core CPU; the paper's PyTorch code takes 0.20 and 0.48 s/task).
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp

from cfsl_jax import data
from cfsl_jax.training.evaluate import evaluate
from cfsl_jax.learners import get_learner
from cfsl_jax.protocol.spec import TaskSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OMNIGLOT_DIR = os.path.join(REPO, "..", "shared", "data", "omniglot")
TARGET_S_PER_TASK = {"protonets": 0.13, "init_tune": 0.48}
PYTORCH_S_PER_TASK = {"protonets": 0.20, "init_tune": 0.48}

_LEARNERS = flags.DEFINE_list("learners", ["protonets", "init_tune"], "Learners to time.")
_TASK = flags.DEFINE_string("task", "B10", "Task cell.")
_DATASET = flags.DEFINE_string("dataset", "omniglot", "Dataset (test split).")
_NUM_TASKS = flags.DEFINE_integer("num_tasks", 600, "Tasks per evaluation.")
_BATCH = flags.DEFINE_integer("batch_size", 50, "Tasks per evaluation program.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where prepared TFDS datasets live.")


def main(argv) -> None:
    del argv
    spec = TaskSpec.parse(_TASK.value)
    split_name = "train"  # the largest split, so that B10 (50 classes) fits mini-Omniglot
    manual_dir = OMNIGLOT_DIR if _DATASET.value == "omniglot" else None
    split = data.load_split(_DATASET.value, split_name, data_dir=_DATA_DIR.value,
                            manual_dir=manual_dir)
    image_shape = tuple(split.images.shape[1:])
    rows = []
    for name in _LEARNERS.value:
        learner = get_learner(name, spec, image_shape=image_shape)
        params = learner.init_params(jax.random.key(0), jnp.zeros((1, *image_shape)), spec)
        kwargs = dict(num_tasks=_NUM_TASKS.value, seed=0, batch_size=_BATCH.value,
                      cost_metrics=False)
        start = time.perf_counter()
        evaluate(learner, params, split, **kwargs)
        first = time.perf_counter() - start
        report = evaluate(learner, params, split, **kwargs)
        per_task = report.seconds / report.num_tasks
        row = dict(benchmark="eval_throughput", learner=name, task=_TASK.value,
                   dataset=_DATASET.value, split=split_name, num_tasks=report.num_tasks,
                   batch_size=_BATCH.value, s_per_task=round(per_task, 5),
                   tasks_per_s=round(1 / per_task, 2),
                   compile_s=round(first - report.seconds, 2),
                   backend=jax.default_backend())
        if name in TARGET_S_PER_TASK:
            row["target_s_per_task"] = TARGET_S_PER_TASK[name]
            row["ratio_to_target"] = round(TARGET_S_PER_TASK[name] / per_task, 2)
            row["speedup_vs_pytorch"] = round(PYTORCH_S_PER_TASK[name] / per_task, 2)
        rows.append(row)
        print(f"{name:12s} {per_task:8.4f} s/task  {1 / per_task:8.1f} tasks/s  "
              f"compile {row['compile_s']:.1f}s"
              + (f"  target {TARGET_S_PER_TASK[name]} s/task (x{row['ratio_to_target']} "
                 f"better)" if name in TARGET_S_PER_TASK else ""), file=sys.stderr)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    app.run(main)
