"""Meta-training and evaluation throughput of the MAML++ learners as NSS grows.

    python benchmarks/meta_train_throughput.py          # maml_low, maml_high x NSS 3, 10, 40
    python benchmarks/meta_train_throughput.py --learners=maml_low --nss=3,10 --repeats=9
    python benchmarks/meta_train_throughput.py --learners=maml_low --nss=3 --options=remat=none

Tasks are 5-way 1-shot with new classes in every support set (type B, KT=5,
``per_class`` targets, so the target set has NSS*25 images), 28x28x1 random
images, 5 inner steps. For each learner and NSS it measures, after
compilation and on this backend:

- ``mode=train``, ``s_per_task``: one meta-training step (value and grad of
  ``episode.meta_loss`` averaged over ``--meta_batch`` tasks -- ``lax.map``
  of per-task gradients on CPU, ``vmap`` elsewhere -- plus an optax Adam
  update), at ``--progress`` (0.5: past the multi-step-loss annealing,
  where most of meta-training is; pass 0 for the annealing phase), divided by
  the meta-batch;
- ``mode=eval``, ``s_per_task``: ``episode.run_tasks`` over ``--eval_batch`` tasks;
- compile seconds of both programs (wall, and the CPU seconds this process
  spent: compilation is mostly single-threaded, so on a machine shared with
  other jobs the CPU seconds estimate an idle machine's wall time), and XLA's
  memory estimate of the
  training program (``memory_analysis``: temporaries + arguments + outputs),
  with the process's peak RSS so far.

Timings are medians of ``--repeats`` runs; ``spread`` is (max - min) /
median, to show how noisy the (shared) machine was. One JSON line per
measurement on stdout, a table on stderr, and the ratio to the issue's
targets for ``maml_low`` (the paper's PyTorch code on the same 2-core CPU:
0.37 s/task for an NSS=3 second-order meta-training step, 0.48 s/task for an
NSS=10 evaluation; compile under 30 s).
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import optax

from cfsl_jax.protocol import episode
from cfsl_jax.learners import get_learner, parse_learner_options
from cfsl_jax.training.optimizers import optimizer as make_optimizer
from cfsl_jax.protocol.spec import TaskSpec

TARGETS = {("maml_low", "train", 3): 0.37, ("maml_low", "eval", 10): 0.48}
TARGET_COMPILE_S = 30.0

_LEARNERS = flags.DEFINE_list("learners", ["maml_low", "maml_high"], "Learners to measure.")
_NSS = flags.DEFINE_list("nss", ["3", "10", "40"], "Support sets per task.")
_OPTIONS = flags.DEFINE_list("options", [], "Learner options as key=value (typed as the learner's option).")
_META_BATCH = flags.DEFINE_integer("meta_batch", 2, "Tasks per meta-training step.")
_EVAL_BATCH = flags.DEFINE_integer("eval_batch", 2, "Tasks per evaluation call.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs after compilation (median).")
_PROGRESS = flags.DEFINE_float("progress", 0.5, "Meta-training progress passed to meta_loss.")
_MODES = flags.DEFINE_list("modes", ["train", "eval"], "What to measure: train, eval.")
_IMAGE = (28, 28, 1)


def _time(compiled, *args) -> tuple[float, float]:
    """(median seconds, (max - min) / median) over --repeats runs after one warm-up."""
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return median, (max(times) - min(times)) / median


def _tasks(spec: TaskSpec, batch: int, key: jax.Array):
    k1, k2, k3 = jax.random.split(key, 3)
    support_x = jax.random.uniform(k1, (batch, spec.nss, spec.support_size, *_IMAGE))
    support_y = jax.random.randint(k2, (batch, spec.nss, spec.support_size), 0, spec.num_outputs)
    target_x = jax.random.uniform(k3, (batch, spec.target_size, *_IMAGE))
    target_y = jnp.arange(batch * spec.target_size).reshape(batch, -1) % spec.num_outputs
    keys = jax.random.split(key, batch)
    return support_x, support_y, target_x, target_y, keys


def _train_step(learner, optimizer):
    """A jitted meta-training step over a batch of tasks (leading axis of every task array).

    Sequential (CPU): ``lax.map`` of each task's value-and-grad, then the mean
    -- the gradient of a mean is the mean of the gradients, and this keeps one
    task's residuals alive at a time (the gradient *of* a ``lax.map`` stores
    every task's residuals and ran 2x slower, with 3x the memory, here).
    Otherwise the gradient of the ``vmap``ped mean loss.
    """
    sequential = episode.sequential(learner=learner)

    def task_loss(params, task, progress):
        return episode.meta_loss(learner, params, *task, progress)[0]

    def step(params, opt_state, tasks, progress):
        if sequential:
            losses, grads = jax.lax.map(
                lambda task: jax.value_and_grad(task_loss)(params, task, progress), tasks)
            loss, grads = losses.mean(), jax.tree.map(lambda g: g.mean(0), grads)
        else:
            loss, grads = jax.value_and_grad(lambda p: jax.vmap(
                lambda *task: task_loss(p, task, progress))(*tasks).mean())(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return jax.jit(step)


def _compile(fn, *args):
    """(compiled, wall seconds, CPU seconds of this process) of tracing + compiling ``fn``."""
    start, cpu = time.perf_counter(), time.process_time()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - start, time.process_time() - cpu


def measure(name: str, nss: int, options: dict) -> list[dict]:
    spec = TaskSpec(nss=nss, nc=5, ks=1, kt=5, cci=1, overwrite=False, target_mode="per_class")
    learner = get_learner(name, spec, image_shape=_IMAGE, **options)
    params = learner.init_params(jax.random.key(0), jnp.zeros((1, *_IMAGE)), spec)
    base = dict(benchmark="meta_train_throughput", learner=name, nss=nss, nc=5, ks=1,
                target_size=spec.target_size, options=options, backend=jax.default_backend())
    rows = []
    if "train" in _MODES.value:
        optimizer = make_optimizer("adam", 1e-3, 1e-5)
        opt_state = optimizer.init(params)
        tasks = _tasks(spec, _META_BATCH.value, jax.random.key(1))
        progress = jnp.float32(_PROGRESS.value)
        compiled, compile_s, compile_cpu_s = _compile(_train_step(learner, optimizer), params,
                                                      opt_state, tasks, progress)
        seconds, spread = _time(compiled, params, opt_state, tasks, progress)
        memory = compiled.memory_analysis()
        xla_mb = None if memory is None else round(
            (memory.temp_size_in_bytes + memory.argument_size_in_bytes
             + memory.output_size_in_bytes) / 2**20, 1)
        rows.append(dict(base, mode="train", meta_batch=_META_BATCH.value,
                         progress=_PROGRESS.value,
                         s_per_task=round(seconds / _META_BATCH.value, 4),
                         spread=round(spread, 2), compile_s=round(compile_s, 1),
                         compile_cpu_s=round(compile_cpu_s, 1), xla_memory_mb=xla_mb))
    if "eval" in _MODES.value:
        support_x, support_y, target_x, _, keys = _tasks(spec, _EVAL_BATCH.value,
                                                         jax.random.key(2))
        run = jax.jit(lambda p, *a: episode.run_tasks(learner, p, *a))
        compiled, compile_s, compile_cpu_s = _compile(run, params, support_x, support_y,
                                                      target_x, keys)
        seconds, spread = _time(compiled, params, support_x, support_y, target_x, keys)
        memory = compiled.memory_analysis()
        xla_mb = None if memory is None else round(
            (memory.temp_size_in_bytes + memory.argument_size_in_bytes
             + memory.output_size_in_bytes) / 2**20, 1)
        rows.append(dict(base, mode="eval", meta_batch=_EVAL_BATCH.value,
                         s_per_task=round(seconds / _EVAL_BATCH.value, 4),
                         spread=round(spread, 2), compile_s=round(compile_s, 1),
                         compile_cpu_s=round(compile_cpu_s, 1), xla_memory_mb=xla_mb))
    peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    for row in rows:
        row["peak_rss_mb_so_far"] = peak_rss_mb
        target = None if options else TARGETS.get((name, row["mode"], nss))
        if target is not None:
            row["target_s_per_task"] = target
            row["ratio_to_target"] = round(row["s_per_task"] / target, 2)
        row["compile_under_target"] = row["compile_s"] < TARGET_COMPILE_S
    return rows


def main(argv) -> None:
    del argv
    print(f"{'learner':10s} {'nss':>4s} {'mode':5s} {'s/task':>8s} {'spread':>6s} "
          f"{'compile s':>9s} {'(cpu s)':>7s} {'XLA MB':>8s} {'RSS MB':>8s}  target",
          file=sys.stderr)
    rows = []
    for name in _LEARNERS.value:
        for nss in (int(n) for n in _NSS.value):
            for row in measure(name, nss, parse_learner_options(name, _OPTIONS.value)):
                rows.append(row)
                target = (f"{row['target_s_per_task']} s ({row['ratio_to_target']}x)"
                          if "target_s_per_task" in row else "")
                print(f"{name:10s} {nss:4d} {row['mode']:5s} {row['s_per_task']:8.3f} "
                      f"{row['spread']:6.2f} {row['compile_s']:9.1f} {row['compile_cpu_s']:7.1f} "
                      f"{row['xla_memory_mb'] or float('nan'):8.1f} "
                      f"{row['peak_rss_mb_so_far']:8.1f}  {target}", file=sys.stderr)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
