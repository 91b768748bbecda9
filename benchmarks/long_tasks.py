"""Evaluation of one long task (the paper's Figure 4 range, NSS up to 640) per learner: time and memory.

    python benchmarks/long_tasks.py                       # every learner, C640, 1 task
    python benchmarks/long_tasks.py --learners=init_tune,maml_low --task=C640 --tasks=2

Each learner runs in a fresh subprocess so that its peak resident memory
(``ru_maxrss``) is its own. A type-C task at NSS=640 has 640 support sets of
5 images and a target set of 16,000 images (3,200 classes x 5), so the data is
a synthetic set with enough classes (``--num_classes``) and 6 images each.
Besides the wall time and peak RSS it prints XLA's own estimate of the
evaluation program's temporary buffers (``memory_analysis``). The limit this
checks: every learner within 24 GB on a CPU host. One JSON line per learner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

flags.DEFINE_list("learners", ["protonets", "init_tune", "pretrain_tune", "ewc_init",
                               "ewc_pretrain", "maml_low", "maml_high", "sca"], "Learners.")
flags.DEFINE_string("task", "C640", "Task (type + NSS).")
flags.DEFINE_integer("tasks", 1, "Tasks evaluated.")
flags.DEFINE_integer("num_classes", 4400, "Synthetic classes (the train split gets ~74%).")
flags.DEFINE_string("child", None, "Internal: run one learner in this process.")
FLAGS = flags.FLAGS


def child(name: str) -> dict:
    import resource
    import time

    import jax
    import jax.numpy as jnp

    from cfsl_jax import data
    from cfsl_jax.runtime import parallel
    from cfsl_jax.training.evaluate import _evaluate_chunk, evaluate
    from cfsl_jax.learners import get_learner
    from cfsl_jax.protocol.spec import TaskSpec

    spec = TaskSpec.parse(FLAGS.task)
    split = data.load_split("synthetic", "train", num_classes=FLAGS.num_classes,
                            samples_per_class=spec.ks + spec.kt)
    shape = tuple(split.images.shape[1:])
    learner = get_learner(name, spec, image_shape=shape)
    params = learner.init_params(jax.random.key(0), jnp.zeros((1, *shape)), spec)
    mesh = parallel.make_mesh(1)
    keys = jax.random.key_data(jax.random.split(jax.random.key(0), 1))
    compiled = _evaluate_chunk.lower(learner, params, split, keys, False, mesh).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    start = time.perf_counter()
    report = evaluate(learner, params, split, num_tasks=FLAGS.tasks, batch_size=1, mesh=mesh)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"benchmark": "long_tasks", "learner": name, "task": spec.name, "nss": spec.nss,
            "target_size": spec.target_size, "tasks": FLAGS.tasks,
            "seconds": round(seconds, 1), "peak_rss_gb": round(peak / 2**30, 2),
            "xla_temp_gb": round(temp / 2**30, 2), "acc": round(report.acc_mean, 4),
            "atm": report.atm, "macs_per_task": report.macs_per_task,
            "backend": jax.default_backend()}


def main(argv) -> None:
    del argv
    if FLAGS.child:
        print(json.dumps(child(FLAGS.child)))
        return
    print(f"{'learner':14s} {'task':>6s} {'s/task':>8s} {'peak RSS GB':>12s} "
          f"{'XLA temp GB':>12s} {'ATM':>10s} {'MACs/task':>10s}")
    for name in FLAGS.learners:
        args = [sys.executable, os.path.abspath(__file__), f"--child={name}",
                f"--task={FLAGS.task}", f"--tasks={FLAGS.tasks}",
                f"--num_classes={FLAGS.num_classes}"]
        proc = subprocess.run(args, capture_output=True, text=True)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode or not lines:
            print(f"{name:14s} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
            continue
        row = json.loads(lines[-1])
        print(f"{name:14s} {FLAGS.task:>6s} {row['seconds'] / row['tasks']:8.1f} "
              f"{row['peak_rss_gb']:12.2f} {row['xla_temp_gb']:12.2f} {row['atm']:10.4g} "
              f"{row['macs_per_task']:10.3g}")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
