"""Evaluation: a learner on a fixed set of tasks -> accuracy, cross-entropy, ATM, MACs.

The evaluation tasks are a pure function of (split, spec, seed, purpose):
``task_keys(seed, purpose, n)`` gives the same keys every time, so validation
after every epoch uses identical tasks, and ``task_fingerprint`` -- a SHA-256
of every task's indices and labels -- lets two people check that they
evaluated on the same tasks.

Tasks are processed in chunks of ``batch_size`` by one jitted program that
samples the indices, gathers the images on device, runs every task and
reduces it to per-task metrics; the last chunk is padded with repeats of the
first tasks, whose results are dropped, so nothing recompiles and the tasks
are ``task_keys(seed, purpose, num_tasks)``'s whatever the chunking. ``params`` may carry a
leading ensemble axis (``ensemble=True``): the members' target logits are
averaged, as the paper tests with its best 5 checkpoints.

Chunks are laid along a device mesh (``parallel``; default: every device):
``batch_size`` is the number of tasks per DEVICE per program (fewer when
the tasks do not fill that many: ``ceil(num_tasks / devices)``), so a chunk
holds ``batch_size * devices`` tasks; each device samples, gathers and runs
its own (one at a time on CPU, one vmap on an accelerator: ``episode.sequential``),
and the per-task metrics come back to every host. XLA compiles a program per
per-device batch and may round differently in each, so a task's numbers depend
on the per-device batch: two device counts that run the same per-device batch
(e.g. 600 tasks, 50 per device, on 1 or 8 devices) give bit-identical numbers for
ProtoNets, while a learner that fine-tunes per task (init_tune) can differ by float
rounding, the 1- and N-device programs being partitioned differently (``launch.verify``
re-tests on the recorded device count); otherwise they agree to float rounding.
Long tasks bound the per-device batch: at most ``PIXELS_IN_FLIGHT`` target
pixels (``min(T, episode.TARGET_CHUNK) * H * W`` per task) -- 50 tasks of
the paper's largest Omniglot cell, 12 of an NSS=640 type-C task.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from typing import Any

import jax
import numpy as np

from jax.sharding import Mesh

from cfsl_jax import data
from cfsl_jax.protocol import episode, metrics
from cfsl_jax.runtime import parallel, progress, seeding
from cfsl_jax.protocol.learner import Learner
from cfsl_jax.training.records import EvalRecord
from cfsl_jax.protocol.sampler import check_split, sample_task, sample_tasks
from cfsl_jax.protocol.spec import TaskSpec

PIXELS_IN_FLIGHT = 10_000_000  # target pixels per device per evaluation program
COMPILE_QUIET_S = 1.0  # a compilation shorter than this prints no line
STOPPING = "[{}] stopping: the evaluation programs in flight finish first"  # a stop's line


def task_keys(seed: int, purpose: str, num_tasks: int) -> jax.Array:
    """Keys of the evaluation tasks: ``split(purpose_key(seed, purpose), num_tasks)``."""
    return jax.random.split(seeding.purpose_key(seed, purpose), num_tasks)


FINGERPRINTED = ("support_idx", "support_labels", "target_idx", "target_labels")  # TaskIndices


def task_fingerprint(split: data.Split, spec: TaskSpec, num_tasks: int, seed: int,
                     purpose: str = "test") -> str:
    """SHA-256 of the split's identity (dataset and variant, split, class and image counts,
    image shape) and all evaluation tasks' support/target indices and labels (hex).

    Not the class names or the pixels: a dataset option that picks other classes with the same
    counts (Omniglot's ``class_split``) samples the same indices, so it gives the same
    fingerprint; the option is in the run's config, and ``paired.per_task_accuracy`` pairs
    runs on both. The data itself is ``data_digest``'s (results.json's ``test_data_sha256``)."""
    tasks = sample_tasks(task_keys(seed, purpose, num_tasks), split.class_table,
                         split.class_sizes, spec)
    return _digest(split, [np.asarray(getattr(tasks, name)) for name in FINGERPRINTED])


def _digest(split: data.Split, fields: list[np.ndarray]) -> str:
    """The fingerprint of tasks whose ``FINGERPRINTED`` fields (all tasks each) are ``fields``."""
    digest = hashlib.sha256(dataset_identity(split).encode())
    for field in fields:
        digest.update(np.ascontiguousarray(np.asarray(field, np.int32)).tobytes())
    return digest.hexdigest()


def dataset_identity(split: data.Split) -> str:
    """What identifies a split's data: e.g. ``'omniglot/small val 31 classes 620 images
    (28, 28, 1)'`` (``SplitInfo.variant``: not the machine-dependent folder it was prepared in)."""
    info = split.info
    variant = info.variant or info.source
    return (f"{info.dataset} [{variant}] {info.split} {int(split.class_table.shape[0])} classes "
            f"{int(split.images.shape[0])} images {tuple(split.images.shape[1:])}")


def data_digest(split: data.Split) -> str:
    """SHA-256 of what a split holds, what ``task_fingerprint`` leaves out: its class names in
    class order, its class table and every image's pixels. Two datasets (or class orders)
    with the same counts sample the same task indices, so share a fingerprint; never a digest.
    results.json records the test split's (``test_data_sha256``), ``launch.verify`` checks it."""
    digest = hashlib.sha256(json.dumps(list(split.info.class_names)).encode())
    for array in (split.class_table, split.class_sizes, split.images):
        values = np.ascontiguousarray(jax.device_get(array))
        digest.update(f"{values.dtype.str}{values.shape}".encode())
        digest.update(values)  # its buffer (C-contiguous), not a copy of it
    return digest.hexdigest()


def tasks_in_flight(spec: TaskSpec, image_shape: tuple[int, ...]) -> int:
    """The most tasks one device evaluates in one program (``PIXELS_IN_FLIGHT``)."""
    pixels = min(spec.target_size, episode.TARGET_CHUNK) * int(np.prod(image_shape[:2]))
    return max(1, PIXELS_IN_FLIGHT // pixels)


@functools.partial(jax.jit, static_argnames=("learner", "ensemble", "mesh", "runs", "in_turn"))
def _evaluate_chunk(learner: Learner, params: Any, split: data.Split, key_data: jax.Array,
                    ensemble: bool, mesh: Mesh, runs: bool = False,
                    in_turn: bool | None = None) -> dict[str, jax.Array]:
    spec = learner.spec
    keys = jax.random.wrap_key_data(key_data)
    tasks = jax.vmap(lambda k: sample_task(k, split.class_table, split.class_sizes, spec))(keys)
    support_x = data.gather_normalised(split, tasks.support_idx)
    target_x = data.gather_normalised(split, tasks.target_idx)
    run_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)

    def logits_of(member_params):
        return episode.run_tasks(learner, member_params, support_x, tasks.support_labels,
                                 target_x, run_keys, mesh, in_turn)

    def scores(logits):  # one run's: [members,] tasks, targets, classes
        if ensemble:
            logits = logits.mean(axis=0)
        return {
            "acc": metrics.accuracy(logits, tasks.target_labels),
            "ce": metrics.cross_entropy(logits, tasks.target_labels),
            "group_acc": metrics.group_accuracy(logits, tasks.target_labels,
                                                tasks.target_group, spec.num_groups),
        }

    # every member of every run (a pack's runs: its leading axis) one after another in one
    # loop, on the tasks sampled once (their logits, [runs * members, tasks, targets, classes],
    # held at once: small beside the images), then each run's ensemble mean and scores in a
    # loop (batched over the runs, a reduction may add in another order): each computation is
    # the one it is alone, so a run's numbers are the lone run's (pack_eval)
    axes = int(runs) + int(ensemble)  # leading axes of params: [runs,] [members,]
    if axes:
        lead = jax.tree.leaves(params)[0].shape[:axes]
        logits = jax.lax.map(logits_of, jax.tree.map(
            lambda x: x.reshape(-1, *x.shape[axes:]), params))
        logits = logits.reshape(*lead, *logits.shape[1:])
    else:
        logits = logits_of(params)
    return {**{name: getattr(tasks, name) for name in FINGERPRINTED},  # for task_fingerprint
            **(jax.lax.map(scores, logits) if runs else scores(logits))}


def evaluate(learner: Learner, params: Any, split: data.Split, spec: TaskSpec | None = None,
             num_tasks: int = 600, seed: int = 0, purpose: str = "test",
             batch_size: int = 50, ensemble: bool = False,
             cost_metrics: bool = True, mesh: Mesh | None = None,
             per_task: bool = False, runs: bool = False, tasks_in_turn: bool | None = None
             ) -> EvalRecord | list[EvalRecord]:
    """Evaluate ``learner`` on ``num_tasks`` tasks of ``split``, over ``mesh`` (default: all).

    Returns an ``EvalRecord``: acc_mean/std/ci95, ce_mean/std/ci95, group_acc
    (mean accuracy per class group), num_tasks, devices, task_fingerprint,
    dataset_identity, seconds, tasks_per_s, and atm, macs_adapt, macs_predict,
    macs_per_task (None with ``cost_metrics=False``); with ``per_task=True`` also
    ``per_task``: each task's ``acc`` and ``ce`` in task order (for paired
    comparisons of two learners on the same tasks). ``batch_size`` is tasks per
    device per program. The learner run is
    ``learner.evaluated`` (``Learner.evaluation`` where it has one). With ``runs=True``,
    ``params`` carry a leading run axis (a pack's runs, each an ensemble with ``ensemble``):
    the tasks are sampled once and each run is evaluated on them in turn in the same program;
    returns one record per run (``seconds`` the pack's; costs from run 0: shapes only).
    ``tasks_in_turn``: each device runs its tasks one at a time, or as one vmap (rounding
    apart, the same numbers); default ``episode.sequential`` (one at a time on CPU), recorded.
    """
    learner = learner.evaluated  # e.g. batch norm on running averages
    spec = spec or learner.spec
    if spec != learner.spec:
        raise ValueError(f"spec {spec.name} differs from the learner's {learner.spec.name}")
    if num_tasks < 1 or batch_size < 1:
        raise ValueError(f"num_tasks and batch_size must be >= 1, got {num_tasks}, {batch_size}")
    check_split(split.class_table, split.class_sizes, spec)
    mesh = mesh or parallel.make_mesh()
    in_turn = episode.sequential(mesh, learner) if tasks_in_turn is None else bool(tasks_in_turn)
    image_shape = tuple(split.images.shape[1:])
    per_device = min(batch_size, -(-num_tasks // mesh.size), tasks_in_flight(spec, image_shape))
    batch_size = per_device * mesh.size
    num_chunks = -(-num_tasks // batch_size)
    # padded to whole chunks with repeats of the first tasks, whose results are dropped below:
    # the tasks are split(key, num_tasks)'s whatever the chunking (a longer split shares its
    # prefix only with jax_threefry_partitionable, the default since JAX 0.5)
    keys = np.asarray(jax.random.key_data(task_keys(seed, purpose, num_tasks)))
    keys = keys[np.arange(num_chunks * batch_size) % num_tasks]
    params = parallel.replicate(params, mesh)
    split = parallel.place_split(split, mesh, shard=parallel.is_sharded(split.images) or None)
    start = time.perf_counter()
    label = seeding.ALIASES.get(purpose, purpose)
    chunk_keys = [parallel.global_array(keys[i * batch_size:(i + 1) * batch_size], mesh)
                  for i in range(num_chunks)]
    # jax keeps compiled programs in memory: a program compiled before is found at once, and
    # the line appears only when compiling (or reading the persistent cache) takes a while
    with progress.stage(f"[{label}] compiling the evaluation program ({batch_size} tasks at "
                        f"once)", quiet_below=COMPILE_QUIET_S):
        program = _evaluate_chunk.lower(learner, params, split, chunk_keys[0], ensemble,
                                        mesh, runs, in_turn).compile()
    start = time.perf_counter()
    chunks = []
    with progress.tracker(label, num_tasks, "tasks", first_line=False) as bar, \
            progress.finish_on_stop(lambda: chunks[-2:], STOPPING.format(label)):
        for i in range(num_chunks):
            chunks.append(program(params, split, chunk_keys[i]))
            if i:  # one chunk in flight while the previous one is counted
                progress.wait_ready(chunks[-2])  # a stop is answered at once
                bar.update(i * batch_size)
        progress.wait_ready(chunks[-1])
        bar.update(num_tasks)
    values = {name: np.concatenate([parallel.to_host(c[name]) for c in chunks],
                                   axis=int(runs and name not in FINGERPRINTED))
              for name in chunks[0]}  # a pack's metrics: [run, task, ...]
    values = {name: v[:, :num_tasks] if runs and name not in FINGERPRINTED else v[:num_tasks]
              for name, v in values.items()}
    seconds = time.perf_counter() - start
    report: dict[str, Any] = {}
    report["num_tasks"] = num_tasks
    report["devices"] = mesh.size
    report["tasks_in_turn"] = in_turn
    # the tasks the program sampled: task_fingerprint(split, spec, num_tasks, seed, purpose)
    report["task_fingerprint"] = _digest(split, [values[name] for name in FINGERPRINTED])
    report["dataset_identity"] = dataset_identity(split)
    report["seconds"] = seconds
    report["tasks_per_s"] = num_tasks / seconds
    if cost_metrics:
        member = params
        for _ in range(int(runs) + int(ensemble)):  # a run's (first) member
            member = jax.tree.map(lambda x: x[0], member)
        member = jax.device_get(member)
        with progress.stage(f"[{label}] measuring ATM and MACs (XLA cost analysis)"):
            report.update(metrics.costs(learner, member, image_shape))
    if not runs:
        return _record(values, report, per_task)
    num_runs = values["acc"].shape[0]
    return [_record({name: v[k] for name, v in values.items() if name not in FINGERPRINTED},
                    {**report, "pack_runs": num_runs}, per_task) for k in range(num_runs)]


def _record(values: dict[str, np.ndarray], common: dict[str, Any], per_task: bool
            ) -> EvalRecord:
    """One run's EvalRecord from its per-task ``acc``, ``ce``, ``group_acc`` and the fields
    ``common`` to the evaluation."""
    report: dict[str, Any] = {}
    for name in ("acc", "ce"):
        for stat, value in metrics.summarize(values[name]).items():
            report[f"{name}_{stat}"] = value
    report["group_acc"] = tuple(values["group_acc"].mean(axis=0).tolist())
    report.update(common)
    if per_task:
        report["per_task"] = {name: values[name].astype(float).tolist() for name in ("acc", "ce")}
    return EvalRecord(**report)
