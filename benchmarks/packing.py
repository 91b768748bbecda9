"""Packed meta-training throughput: K seeds in one vmapped program, S steps per host call.

    python benchmarks/packing.py --learners=protonets,maml_low --cells=B3 --packs=1,3 \
        --steps_per_dispatch=1,10 --calls=3

For each learner, cell, pack size K and S: ``steps.make_steps`` (K > 1: vmapped over the run
axis) compiled ahead of time, then ``--calls`` timed calls of S steps of one task per step per
run (``--meta_batch``). ``tasks_per_s_per_run`` = S * meta_batch / (median seconds per call);
``ratio`` is that over the same learner's and cell's K=1, S=1 row (the solo one-step loop);
``tasks_per_s_pack`` = K * ``tasks_per_s_per_run`` (the pack's aggregate) and ``pack_ratio`` is
that over the same row: on a compute-bound CPU a pack cannot beat solo per run, its target is
``pack_ratio`` >= 1 (one compile, one start-up, shared evaluation), on an accelerator more.
A readable line per row on stderr, one JSON line per row on stdout. Each row also carries XLA's
memory analysis (``memory.needed_bytes``, arguments included) of the compiled step program
(``step_bytes``) and of the pack's evaluation program on ``--eval_tasks`` validation tasks
sampled once (``eval_bytes``: ``evaluate(runs=True)``), for issue 28's memory target: a pack of
K within K x solo's plus the shared evaluation tasks.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from cfsl_jax.runtime import backend, memory, parallel, seeding
from cfsl_jax.training import evaluate, runs, steps
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.train import make_optimizer

_LEARNERS = flags.DEFINE_list("learners", ["protonets", "maml_low"], "Meta-trained learners.")
_CELLS = flags.DEFINE_list("cells", ["B3"], "Paper cells.")
_PACKS = flags.DEFINE_list("packs", ["1", "3"], "Pack sizes K.")
_DISPATCH = flags.DEFINE_list("steps_per_dispatch", ["1", "10"], "Steps per call S.")
_AXES = flags.DEFINE_list("pack_axis", ["vmap"], "How a pack (K > 1) runs its runs: vmap "
                          "(batched), map (lax.map, one after another in one program), auto.")
_CALLS = flags.DEFINE_integer("calls", 3, "Timed calls per row (after one warm-up call).")
_META_BATCH = flags.DEFINE_integer("meta_batch", 1, "Tasks per step per run.")
_OPTION = flags.DEFINE_multi_string("learner_option", [], "NAME=VALUE for every learner.")
_EVAL_TASKS = flags.DEFINE_integer("eval_tasks", 50, "Tasks of the evaluation program whose "
                                   "memory is reported (eval_bytes).")


@functools.lru_cache(maxsize=None)
def build(learner_name: str, cell: str):
    """(config, learner, splits): the synthetic data is generated once per learner and cell."""
    options = dict(o.split("=", 1) for o in _OPTION.value)
    config = TrainConfig(learner=learner_name, task=cell, dataset="synthetic",
                         meta_batch=_META_BATCH.value,
                         learner_options={k: json.loads(v) if v[:1].isdigit() else v
                                          for k, v in options.items()})
    return (config, *runs.build(config))


_EVAL_BYTES: dict[tuple[str, str, int], int | None] = {}


def measure(learner_name: str, cell: str, packs: int, count: int, axis: str = "vmap") -> dict:
    config, learner, splits = build(learner_name, cell)
    optimizer = make_optimizer(config)
    seeds = range(packs)
    params = [runs.init_params(learner, splits["train"], seed) for seed in seeds]
    keys = [seeding.purpose_key(seed, "train") for seed in seeds]
    if packs > 1:
        params = jax.tree.map(lambda *xs: jnp.stack(xs), *params)
        opt_state, key = jax.vmap(optimizer.init)(params), jnp.stack(keys)
    else:
        params, opt_state, key = params[0], optimizer.init(params[0]), keys[0]
    if (learner_name, cell, packs) not in _EVAL_BYTES:  # one compilation per pack size
        _EVAL_BYTES[learner_name, cell, packs] = evaluation_bytes(learner, splits["val"], params,
                                                                  packs > 1)
    eval_bytes = _EVAL_BYTES[learner_name, cell, packs]
    multi = steps.make_steps(learner, optimizer, config.meta_batch, count, runs=packs > 1,
                              pack_axis=axis)
    progress = jnp.zeros((count,), jnp.float32)
    started = time.perf_counter()
    compiled = multi.lower(params, opt_state, splits["train"], key, 0, progress).compile()
    compile_s = time.perf_counter() - started
    seconds, cpu_seconds = [], []
    for call in range(_CALLS.value + 1):
        started, cpu_started = time.perf_counter(), time.process_time()
        params, opt_state, out = compiled(params, opt_state, splits["train"], key, call * count,
                                          progress)
        jax.block_until_ready(out)
        seconds.append(time.perf_counter() - started)
        cpu_seconds.append(time.process_time() - cpu_started)
    per_call = statistics.median(seconds[1:])
    return {"learner": learner_name, "cell": cell, "pack": packs, "steps_per_dispatch": count,
            "pack_axis": steps.resolve_pack_axis(axis) if packs > 1 else "-",
            "cpu_s_per_call": statistics.median(cpu_seconds[1:]),
            "load": os.getloadavg()[0],
            "meta_batch": config.meta_batch, "s_per_call": per_call, "compile_s": compile_s,
            "tasks_per_s_per_run": count * config.meta_batch / per_call,
            "step_bytes": memory.needed_bytes(compiled, True), "eval_bytes": eval_bytes,
            "backend": jax.default_backend(), "device": backend.device_kind()
            if hasattr(backend, "device_kind") else jax.devices()[0].device_kind}


def evaluation_bytes(learner, split, params, packed: bool) -> int | None:
    """XLA's estimate of the bytes of the evaluation program (``--eval_tasks`` tasks at once)
    for ``params`` (a pack's, run axis first, with ``packed``)."""
    mesh = parallel.make_mesh()
    keys = parallel.global_array(np.asarray(jax.random.key_data(
        evaluate.task_keys(0, "val", _EVAL_TASKS.value))), mesh)
    compiled = evaluate._evaluate_chunk.lower(learner.evaluated, params, split, keys, False, mesh,
                                              packed).compile()
    return memory.needed_bytes(compiled, True)


def main(argv):
    del argv
    for learner in _LEARNERS.value:
        for cell in _CELLS.value:
            base = None
            for packs, axis in [(k, a) for k in map(int, _PACKS.value)
                                for a in (_AXES.value if k > 1 else ["vmap"])]:
                for count in map(int, _DISPATCH.value):
                    row = measure(learner, cell, packs, count, axis)
                    base = base or row["tasks_per_s_per_run"]
                    row["ratio"] = row["tasks_per_s_per_run"] / base
                    row["tasks_per_s_pack"] = packs * row["tasks_per_s_per_run"]
                    row["pack_ratio"] = row["tasks_per_s_pack"] / base
                    print(f"{learner} {cell} K={packs} {row['pack_axis']} S={count}: "
                          f"{row['tasks_per_s_per_run']:.2f} tasks/s per run "
                          f"(x{row['ratio']:.2f}), {row['tasks_per_s_pack']:.2f} per pack "
                          f"(x{row['pack_ratio']:.2f}), cpu {row['cpu_s_per_call']:.2f} s and "
                          f"wall {row['s_per_call']:.2f} s a call (load {row['load']:.1f}), "
                          f"compile {row['compile_s']:.1f} s, "
                          f"memory: step {row['step_bytes'] / 2**20:.1f} MiB, evaluation "
                          f"{row['eval_bytes'] / 2**20:.1f} MiB",
                          file=sys.stderr, flush=True)
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
