"""Evaluation and meta-training throughput against the number of devices (1, 2, 4, 8).

    python benchmarks/scaling.py                                   # CPU: 8 fake devices
    python benchmarks/scaling.py --learners=protonets,maml_low --devices=1,2,4,8

For each device count n the task batch is sharded over a mesh of the first n
devices (``cfsl_jax.runtime.parallel``): evaluation keeps ``--eval_batch`` tasks per
device per program, meta-training keeps the global ``--meta_batch``. Prints
tasks/second, the speed-up over one device and the parallel efficiency
``rate(n) / (n * rate(1))``, plus one JSON line per measurement.

On a CPU host the devices are fake (``--xla_force_host_platform_device_count``,
set here before JAX starts): they share the same cores, so the numbers check
the mechanics (sharding, padding, one compile per shape), not a speed-up --
the output says so. On a multi-GPU or TPU host the real devices are used.
"""

from __future__ import annotations

import os
import sys

FAKE_CPU_DEVICES = 8
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
                               f"device_count={FAKE_CPU_DEVICES}").strip()

import json  # noqa: E402
import time  # noqa: E402

from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from cfsl_jax import data# noqa: E402
from cfsl_jax.runtime import parallel
from cfsl_jax.training.evaluate import evaluate  # noqa: E402
from cfsl_jax.learners import get_learner  # noqa: E402
from cfsl_jax.protocol.spec import TaskSpec  # noqa: E402
from cfsl_jax.training.config import TrainConfig  # noqa: E402
from cfsl_jax.training.train import make_optimizer, make_train_step  # noqa: E402

_LEARNERS = flags.DEFINE_list("learners", ["protonets", "init_tune"], "Learners to time.")
_DEVICES = flags.DEFINE_list("devices", ["1", "2", "4", "8"], "Device counts.")
_TASK = flags.DEFINE_string("task", "B3", "Task cell.")
_EVAL_TASKS = flags.DEFINE_integer("eval_tasks", 64, "Tasks per evaluation.")
_EVAL_BATCH = flags.DEFINE_integer("eval_batch", 8, "Evaluation tasks per device per program.")
_META_BATCH = flags.DEFINE_integer("meta_batch", 16, "Tasks per meta-training step.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed meta-training steps.")


def time_eval(learner, params, split, mesh) -> float:
    kwargs = dict(num_tasks=_EVAL_TASKS.value, batch_size=_EVAL_BATCH.value,
                  cost_metrics=False, mesh=mesh)
    evaluate(learner, params, split, **kwargs)  # compile
    report = evaluate(learner, params, split, **kwargs)
    return report.num_tasks / report.seconds


def time_train(learner, params, split, mesh) -> float:
    optimizer = make_optimizer(TrainConfig())
    step = make_train_step(learner, optimizer, _META_BATCH.value, mesh)
    params, state = parallel.replicate((params, optimizer.init(params)), mesh)
    split = parallel.place_split(split, mesh)
    progress = jnp.float32(0)
    params, state, out = step(params, state, split, jax.random.key(0), progress)  # compile
    jax.block_until_ready(out)
    start = time.perf_counter()
    for i in range(_STEPS.value):
        params, state, out = step(params, state, split, jax.random.key(i + 1), progress)
    jax.block_until_ready(out)
    return _META_BATCH.value * _STEPS.value / (time.perf_counter() - start)


def main(argv) -> None:
    del argv
    backend = jax.default_backend()
    counts = [int(n) for n in _DEVICES.value if int(n) <= jax.device_count()]
    fake = backend == "cpu"
    print(f"{jax.device_count()} {backend} device(s)"
          + (f" -- FAKE CPU devices sharing {os.cpu_count()} cores: this checks the "
             f"mechanics only, not a speed-up" if fake else ""))
    spec = TaskSpec.parse(_TASK.value)
    split = data.load_split("synthetic", "train")
    image = tuple(split.images.shape[1:])
    print(f"{'learner':12s} {'mode':6s} {'devices':>7s} {'tasks/s':>9s} {'speed-up':>9s} "
          f"{'efficiency':>10s}")
    for name in _LEARNERS.value:
        learner = get_learner(name, spec, image_shape=image)
        params = learner.init_params(jax.random.key(0), jnp.zeros((1, *image)), spec)
        modes = ["eval"] + (["train"] if learner.recipe.training == "meta" else [])
        for mode in modes:
            base = None
            for n in counts:
                mesh = parallel.make_mesh(n)
                rate = (time_eval if mode == "eval" else time_train)(learner, params, split, mesh)
                base = base or rate
                row = {"benchmark": "scaling", "learner": name, "mode": mode, "devices": n,
                       "tasks_per_s": round(rate, 3), "speedup": round(rate / base, 3),
                       "efficiency": round(rate / (n * base), 3), "backend": backend,
                       "fake_devices": fake, "task": spec.name}
                print(f"{name:12s} {mode:6s} {n:7d} {rate:9.2f} {rate / base:9.2f} "
                      f"{rate / (n * base):10.2f}")
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
