"""The accelerator table in one command: sampling, evaluation and meta-training on this backend.

    python benchmarks/accelerator.py                                  # the full table
    python benchmarks/accelerator.py --learners=protonets,maml_low --cells=B3 \
        --meta_batches=1,4 --eval_tasks=8 --eval_batch=4 --repeats=2  # a small run
    python benchmarks/accelerator.py --learner_option=conv=xla        # cuDNN convolutions

Runs on whatever backend JAX picks (GPU, TPU or CPU), on one device, and
measures on the ``--dataset`` train split (default ``synthetic``: no download):

- ``kind=sampling``: tasks/s of sampling + gathering a ``--sample_batch`` of
  ``--eval_cell`` tasks with their images (one jitted program);
- ``kind=eval`` per learner: ``evaluate`` of ``--eval_tasks`` tasks of
  ``--eval_cell``, ``--eval_batch`` tasks per program, at fresh parameters;
- ``kind=train`` per meta-trained learner, cell and meta-batch
  (``--meta_batches``, default 1, 4, 16, 64 tasks per step): one meta-step of
  ``train.make_train_step`` (on-device sampling, value and gradient of the
  meta-loss, Adam) -- ``s_per_task`` is the median step over ``--repeats``
  divided by the meta-batch;

- ``kind=pack`` per learner of ``--pack_learners`` (default protonets, maml_low, maml_high,
  sca), cell, pack size K (``--packs``, default 1, 3, 8, 16) and S (``--pack_steps``, default
  1, 10): ``steps.make_steps`` of K runs (K > 1: ``--pack_axis``, default ``auto`` as
  ``launch.train --seeds``: vmapped over the run axis on GPU/TPU, mapped on CPU), S steps per
  call, one task per step per run --
  ``tasks_per_s`` per run and ``pack_tasks_per_s`` (K x per run). A pretraining learner
  (pretrain_tune, ewc_pretrain: the same step) gives ``kind=pretrain_pack`` rows instead:
  ``pretrain.packed_task_step`` of K runs, one step of one task per call (S=1 only, as
  ``launch.train --seeds`` pretrains);

each with its compile seconds (ahead-of-time ``lower().compile()`` for
training; first minus second evaluation for evaluation), XLA's memory estimate
of the program (``program_bytes``: temporaries + arguments + outputs), the
device's peak bytes in use so far (``device_peak_bytes``, from
``device.memory_stats()``; null on CPU, which reports none) and the process's
peak RSS. One JSON line per measurement on stdout (and appended to ``--out``),
each with the device kind, backend, precision and jax version; a readable line
per measurement on stderr. A configuration that fails (out of memory at 64
tasks, say) gives a row with its ``error`` and the run goes on.

``--synthetic_colour``: the synthetic glyphs at 64x64 with 3 channels (each glyph's
grey level in every channel), the size of SlimageNet64's images, so a row can be
SlimageNet64-sized without the dataset.

The persistent compilation cache is off unless ``--compilation_cache_dir`` is
given, so compile seconds are real compilations. With a cache, each pack row says whether its
program came from it (``from_cache``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import resource
import statistics
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax.runtime import backend, parallel
from cfsl_jax import data
from cfsl_jax.training.evaluate import evaluate
from cfsl_jax.learners import LEARNERS, get_learner, options_class, parse_learner_options
from cfsl_jax.runtime.options import names as option_names
from cfsl_jax.protocol.sampler import sample_task
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training import pretrain, steps
from cfsl_jax.training.train import make_optimizer, make_train_step

_LEARNERS = flags.DEFINE_list("learners", ["protonets", "init_tune", "maml_low", "maml_high",
                                           "sca"], f"Learners, of {', '.join(LEARNERS)}.")
_CELLS = flags.DEFINE_list("cells", ["B3", "B10"], "Task cells for meta-training.")
_META_BATCHES = flags.DEFINE_list("meta_batches", ["1", "4", "16", "64"],
                                  "Tasks per meta-training step.")
_EVAL_CELL = flags.DEFINE_string("eval_cell", "B10", "Task cell for evaluation and sampling.")
_EVAL_TASKS = flags.DEFINE_integer("eval_tasks", 200, "Tasks per evaluation.")
_EVAL_BATCH = flags.DEFINE_integer("eval_batch", 50, "Tasks per evaluation program.")
_SAMPLE_BATCH = flags.DEFINE_integer("sample_batch", 64, "Tasks per sampling call.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs after compilation (median).")
_KINDS = flags.DEFINE_list("kinds", ["sampling", "eval", "train", "pack"], "What to measure.")
_DATASET = flags.DEFINE_string("dataset", "synthetic", "Dataset (its train split).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where prepared TFDS datasets live.")
_MANUAL_DIR = flags.DEFINE_string("manual_dir", None, "Folder with the official archives.")
_LEARNER_OPTIONS = flags.DEFINE_multi_string("learner_option", [],
                                             "Learner option NAME=VALUE for every learner "
                                             "that takes it (repeatable), e.g. conv=xla.")
_PRECISION = flags.DEFINE_enum("precision", backend.DEFAULT_PRECISION, backend.PRECISIONS,
                               "Float32 matmul/convolution precision (cfsl_jax.runtime.backend).")
_CACHE = flags.DEFINE_string("compilation_cache_dir", "", "Persistent compilation cache ('': "
                             "off, so compile seconds are real compilations).")
_OUT = flags.DEFINE_string("out", None, "Also append the JSON lines to this file.")
_PACK_LEARNERS = flags.DEFINE_list("pack_learners", ["protonets", "maml_low", "maml_high",
                                                     "sca"], "Learners of the pack rows.")
_PACKS = flags.DEFINE_list("packs", ["1", "3", "8", "16"], "Pack sizes K (runs per program).")
_PACK_STEPS = flags.DEFINE_list("pack_steps", ["1", "10"], "Steps per call S of the pack rows.")
_DATASET_OPTIONS = flags.DEFINE_multi_string("dataset_option", [], "Dataset option NAME=INT "
                                             "(repeatable), e.g. num_classes=60 for a smoke run.")
_PACK_AXIS = flags.DEFINE_enum("pack_axis", "auto", list(steps.PACK_AXES), "How a pack row "
                                "computes its runs (steps.resolve_pack_axis).")
_COLOUR = flags.DEFINE_bool("synthetic_colour", False, "Synthetic glyphs at 64x64x3 "
                            "(SlimageNet64-sized images).")


def _environment() -> dict:
    device = jax.devices()[0]
    return {"benchmark": "accelerator", "backend": jax.default_backend(),
            "device_kind": device.device_kind, "devices": jax.device_count(),
            "precision": backend.precision(), "jax_version": jax.__version__}


def _peak_memory() -> dict:
    stats = jax.devices()[0].memory_stats() or {}
    return {"device_peak_bytes": stats.get("peak_bytes_in_use"),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _program_bytes(compiled) -> int | None:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return int(analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
               + analysis.output_size_in_bytes)


def _median_seconds(fn) -> tuple[float, float]:
    """(median seconds, (max - min) / median) of ``fn()`` over --repeats runs after a warm-up."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return median, (max(times) - min(times)) / median


def _options(learner: str, spec: TaskSpec, image_shape) -> dict:
    """The --learner_option pairs whose name is an option of ``learner``, typed."""
    del spec, image_shape
    valid = option_names(options_class(learner))
    options = parse_learner_options(learner, [
        pair for pair in _LEARNER_OPTIONS.value if pair.partition("=")[0] in valid])
    return options


def _cell_name(spec: TaskSpec) -> str:
    """The flag's cell name (B3) for the cells passed on the command line."""
    for cell in (*_CELLS.value, _EVAL_CELL.value):
        if TaskSpec.parse(cell) == spec:
            return cell
    return spec.name


def measure_sampling(split, spec: TaskSpec) -> dict:
    batch = _SAMPLE_BATCH.value

    @jax.jit
    def sample_and_gather(keys, split):
        def one(key):
            task = sample_task(key, split.class_table, split.class_sizes, spec)
            return (data.gather_normalised(split, task.support_idx),
                    data.gather_normalised(split, task.target_idx))
        return jax.vmap(one)(keys)

    keys = jax.random.split(jax.random.key(0), batch)
    start = time.perf_counter()
    compiled = sample_and_gather.lower(keys, split).compile()
    compile_s = time.perf_counter() - start
    seconds, spread = _median_seconds(lambda: compiled(keys, split))
    return {"kind": "sampling", "cell": _cell_name(spec), "batch": batch,
            "tasks_per_s": round(batch / seconds, 1), "spread": round(spread, 3),
            "compile_s": round(compile_s, 3), "program_bytes": _program_bytes(compiled)}


def measure_eval(name: str, split, spec: TaskSpec, image_shape) -> dict:
    options = _options(name, spec, image_shape)
    learner = get_learner(name, spec, image_shape=image_shape, **options)
    params = learner.init_params(jax.random.key(0), jnp.zeros((1, *image_shape)), spec)
    kwargs = dict(num_tasks=_EVAL_TASKS.value, seed=0, batch_size=_EVAL_BATCH.value,
                  cost_metrics=False, mesh=parallel.make_mesh(1))
    start = time.perf_counter()
    evaluate(learner, params, split, **kwargs)
    first = time.perf_counter() - start
    report = evaluate(learner, params, split, **kwargs)
    per_task = report.seconds / report.num_tasks
    return {"kind": "eval", "learner": name, "cell": _cell_name(spec), "options": options,
            "tasks": report.num_tasks, "batch": _EVAL_BATCH.value,
            "s_per_task": round(per_task, 6), "tasks_per_s": round(1 / per_task, 1),
            "compile_s": round(first - report.seconds, 3)}


def measure_train(name: str, split, spec: TaskSpec, image_shape, meta_batch: int) -> dict:
    options = _options(name, spec, image_shape)
    learner = get_learner(name, spec, image_shape=image_shape, **options)
    params = learner.init_params(jax.random.key(0), jnp.zeros((1, *image_shape)), spec)
    optimizer = make_optimizer(TrainConfig())
    step = make_train_step(learner, optimizer, meta_batch, mesh=parallel.make_mesh(1))
    state = optimizer.init(params)
    key, progress = jax.random.key(1), jnp.float32(0.5)
    start = time.perf_counter()
    compiled = step.lower(params, state, split, key, progress).compile()
    compile_s = time.perf_counter() - start
    seconds, spread = _median_seconds(lambda: compiled(params, state, split, key, progress))
    return {"kind": "train", "learner": name, "cell": _cell_name(spec), "options": options,
            "meta_batch": meta_batch, "s_per_task": round(seconds / meta_batch, 6),
            "tasks_per_s": round(meta_batch / seconds, 2), "spread": round(spread, 3),
            "compile_s": round(compile_s, 3), "program_bytes": _program_bytes(compiled)}


def _pack_row(kind: str, learner, options: dict, packs: int, count: int, jitted, args) -> dict:
    """A ``kind`` row of ``jitted`` (``count`` steps per call of ``packs`` runs) compiled ahead
    of time on ``args``: compile seconds, whether the program came from the persistent cache,
    XLA's memory estimate, and the median rates."""
    hits = backend.compile_totals()["cache_hits"]
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - start
    cached = backend.compile_totals()["cache_hits"] > hits
    seconds, spread = _median_seconds(lambda: compiled(*args))
    return {"kind": kind, "learner": learner.name, "cell": _cell_name(learner.spec),
            "options": options, "pack": packs,
            "pack_axis": steps.resolve_pack_axis(_PACK_AXIS.value), "steps_per_dispatch": count,
            "meta_batch": 1, "compile_s": round(compile_s, 3), "from_cache": cached,
            "program_bytes": _program_bytes(compiled), "tasks_per_s": round(count / seconds, 2),
            "pack_tasks_per_s": round(packs * count / seconds, 2), "spread": round(spread, 3)}


def measure_pack(name: str, split, spec: TaskSpec, image_shape, packs: int, count: int) -> dict:
    options = _options(name, spec, image_shape)
    learner = get_learner(name, spec, image_shape=image_shape, **options)
    if learner.recipe.training == "pretrain":
        return measure_pretrain_pack(learner, split, packs, options)
    optimizer = make_optimizer(TrainConfig())
    params = [learner.init_params(jax.random.key(k), jnp.zeros((1, *image_shape)), spec)
              for k in range(packs)]
    keys = jnp.stack([jax.random.key(100 + k) for k in range(packs)])
    if packs > 1:
        params = jax.tree.map(lambda *xs: jnp.stack(xs), *params)
        state = jax.vmap(optimizer.init)(params)
    else:
        params, keys = params[0], keys[0]
        state = optimizer.init(params)
    multi = steps.make_steps(learner, optimizer, 1, count, runs=packs > 1,
                             pack_axis=_PACK_AXIS.value)
    args = (params, state, split, keys, 0, jnp.full((count,), 0.5, jnp.float32))
    return _pack_row("pack", learner, options, packs, count, multi, args)


def measure_pretrain_pack(learner, split, packs: int, options: dict) -> dict:
    """A pretraining pack's step (``pretrain.packed_task_step``, as ``launch.train --seeds``
    pretrains on tasks): K runs, one task per step per run, one step per call."""
    config = TrainConfig()
    num_classes = int(split.class_table.shape[0])
    image_shape = tuple(split.images.shape[1:])
    states = [pretrain.init_state(
        learner, learner.init_params(jax.random.key(k), jnp.zeros((1, *image_shape)),
                                     learner.spec),
        num_classes, image_shape, jax.random.key(200 + k), config.learning_rate,
        config.weight_decay) for k in range(packs)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    keys = jnp.stack([jax.random.key(100 + k) for k in range(packs)])
    step = jax.jit(pretrain.packed_task_step(
        split, pretrain.image_classes(split.class_table), keys, learner=learner,
        num_classes=num_classes, tasks=1, learning_rate=config.learning_rate,
        weight_decay=config.weight_decay, pack_axis=_PACK_AXIS.value))
    return _pack_row("pretrain_pack", learner, options, packs, 1, step,
                     (stacked.params, stacked.opt_state, 0))


def colour(split):
    """``split``'s glyphs as 3-channel images (64x64 when loaded with image_size=64)."""
    images = jnp.repeat(split.images, 3, axis=-1)
    info = dataclasses.replace(split.info, image_shape=tuple(images.shape[1:]),
                               variant=split.info.variant + " colour")
    return split.replace(images=images, info=info)


_ROWS = [0]  # rows emitted so far


def _emit(row: dict) -> None:
    row = {**_environment(), **row, **_peak_memory()}
    _ROWS[0] += 1
    line = json.dumps(row)
    print(line, flush=True)
    if _OUT.value:
        with open(_OUT.value, "a") as f:
            f.write(line + "\n")
    what = " ".join(f"{k}={row[k]}" for k in ("kind", "learner", "cell", "meta_batch", "batch",
                                              "pack", "steps_per_dispatch")
                    if row.get(k) is not None)
    rate = (f"{row['tasks_per_s']:>10,.1f} tasks/s" if "tasks_per_s" in row
            else f"error: {row.get('error')}")
    print(f"{what:45s} {rate}  compile {row.get('compile_s', float('nan')):7.2f} s",
          file=sys.stderr, flush=True)


def _guarded(measure, *args, **fields) -> None:
    try:
        _emit(measure(*args))
    except Exception as error:  # noqa: BLE001  (one failing configuration must not end the table)
        _emit({**fields, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"})


def main(argv) -> None:
    del argv
    backend.configure(_PRECISION.value, _CACHE.value)
    unknown = sorted(set(_LEARNERS.value) - set(LEARNERS))
    if unknown:
        raise app.UsageError(f"--learners {', '.join(unknown)}: valid: {', '.join(LEARNERS)}")
    unknown = sorted(set(_PACK_LEARNERS.value) - set(LEARNERS))
    if unknown:
        raise app.UsageError(f"--pack_learners {', '.join(unknown)}: valid: "
                             f"{', '.join(LEARNERS)}")
    options = {name: int(value) for name, value in
               (pair.split("=", 1) for pair in _DATASET_OPTIONS.value)}
    options.update({"image_size": 64} if _COLOUR.value else {})
    if _COLOUR.value and _DATASET.value != "synthetic":
        raise app.UsageError(f"--synthetic_colour is for --dataset=synthetic, not "
                             f"{_DATASET.value}")
    split = data.load_split(_DATASET.value, "train", data_dir=_DATA_DIR.value,
                            manual_dir=_MANUAL_DIR.value, **options)
    split = colour(split) if _COLOUR.value else split
    image_shape = tuple(split.images.shape[1:])
    env = _environment()
    print(f"{env['device_kind']} ({env['backend']}, {env['devices']} device(s)), precision "
          f"{env['precision']}, jax {env['jax_version']}", file=sys.stderr)
    eval_spec = TaskSpec.parse(_EVAL_CELL.value)
    if "sampling" in _KINDS.value:
        _guarded(measure_sampling, split, eval_spec, kind="sampling")
    for name in _LEARNERS.value:
        if "eval" in _KINDS.value:
            _guarded(measure_eval, name, split, eval_spec, image_shape, kind="eval", learner=name)
        learner = get_learner(name, eval_spec, image_shape=image_shape)
        if "train" not in _KINDS.value or learner.recipe.training != "meta":
            continue
        for cell in _CELLS.value:
            for meta_batch in (int(b) for b in _META_BATCHES.value):
                _guarded(measure_train, name, split, TaskSpec.parse(cell), image_shape,
                         meta_batch, kind="train", learner=name, cell=cell,
                         meta_batch=meta_batch)


    for name in _PACK_LEARNERS.value if "pack" in _KINDS.value else []:
        pretrains = get_learner(name, eval_spec, image_shape=image_shape).recipe.training
        for cell, packs, count in itertools.product(_CELLS.value, map(int, _PACKS.value),
                                                    map(int, _PACK_STEPS.value)):
            if pretrains == "pretrain" and count != 1:
                continue  # a pretraining pack runs one step per call
            _guarded(measure_pack, name, split, TaskSpec.parse(cell), image_shape, packs, count,
                     kind="pack", learner=name, cell=cell, pack=packs, steps_per_dispatch=count)


def _main_or_stop(argv) -> None:
    """``main``; Ctrl-C (or ``timeout -s INT``) ends it with one line: the rows printed above
    are complete (each closed its ``--out`` file), the one being measured is dropped. It exits
    at once (``os._exit``): an interrupt during a compilation left XLA's compiler threads
    running, and the interpreter's normal teardown then crashed under them (a segmentation
    fault after the line, seen on CPU)."""
    try:
        main(argv)
    except KeyboardInterrupt:
        print(f"interrupted: {_ROWS[0]} complete row(s) above", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    app.run(_main_or_stop)
