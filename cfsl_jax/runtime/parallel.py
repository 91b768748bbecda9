"""Data parallelism over tasks: a one-axis device mesh, task-sharded arrays, multi-host glue.

    mesh = parallel.make_mesh()                 # all devices (of every host)
    mesh = parallel.make_mesh(num_devices=2)    # the first two

Training and evaluation lay a batch of tasks along the mesh's ``"tasks"``
axis (``NamedSharding(mesh, P("tasks"))``) and keep everything else --
meta-parameters, optimiser state, the dataset split -- replicated (the split
is sharded along its sample axis instead when it does not fit one device,
``place_split``). The programs are ordinary ``jax.jit``
programs: XLA partitions them and inserts the cross-device reductions
(gradients are summed by XLA, not by hand), so the numbers do not depend on
the device count beyond float summation order.

Batches are padded to a multiple of the mesh size with extra tasks whose
results are masked out (training) or dropped (evaluation).

Multi-host (TPU pod slices, multi-node GPU): call ``initialize(True)`` (the
``--multihost`` flag) once per process before anything touches a device;
``jax.distributed.initialize()`` finds the coordinator from the environment
(TPU metadata, SLURM, Open MPI). Every host then runs the same program over
the global mesh; task keys are a pure function of (seed, step), so each host
builds only its own slice of a batch (``global_array``) and the global batch
is the one a single host would draw.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

TASKS = "tasks"  # the mesh axis a batch of tasks is laid along


def initialize(multihost: bool) -> None:
    """``jax.distributed.initialize()`` for a multi-host launch (idempotent); no-op otherwise."""
    if multihost and not jax.distributed.is_initialized():
        jax.distributed.initialize()


def make_mesh(num_devices: int | None = None, devices: list | None = None) -> Mesh:
    """A 1-D ``"tasks"`` mesh over the first ``num_devices`` of ``devices`` (None or 0: all).

    ``devices`` defaults to ``jax.devices()`` (the default backend's); tests pass
    ``jax.devices("cpu")`` to get the same 8 devices on every backend.
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_devices in (None, 0):
        num_devices = len(devices)
    if not isinstance(num_devices, int) or not 1 <= num_devices <= len(devices):
        raise ValueError(f"num_devices={num_devices!r}: this process sees {len(devices)} "
                         f"{devices[0].platform if devices else jax.default_backend()} "
                         f"device(s); choose 1..{len(devices)} (0: all)")
    if jax.process_count() > 1 and num_devices != len(devices):
        raise ValueError(f"num_devices={num_devices}: a multi-host run uses all "
                         f"{len(devices)} devices of its hosts")
    return Mesh(np.asarray(devices[:num_devices]), (TASKS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def task_sharded(mesh: Mesh, axis: int = 0) -> NamedSharding:
    """Sharding of arrays whose ``axis`` is the task axis."""
    return NamedSharding(mesh, P(*([None] * axis), TASKS))


def padded(num_tasks: int, mesh: Mesh) -> int:
    """``num_tasks`` rounded up to a multiple of the mesh size."""
    return -(-num_tasks // mesh.size) * mesh.size


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Put every array of ``tree`` on every device of ``mesh``."""
    return jax.device_put(tree, replicated(mesh))


def constrain(tree: Any, mesh: Mesh, axis: int = 0) -> Any:
    """Inside jit: lay ``axis`` of every array of ``tree`` along the mesh's task axis."""
    if mesh.size == 1:
        return tree
    return jax.lax.with_sharding_constraint(tree, task_sharded(mesh, axis))


def global_array(host_array: np.ndarray, mesh: Mesh) -> jax.Array:
    """A task-sharded global array from a value every host can compute.

    Each process materialises only the rows of its own devices (on one host:
    all of them), so a multi-host batch is the single-host batch, split.
    """
    host_array = np.asarray(host_array)
    return jax.make_array_from_callback(host_array.shape, task_sharded(mesh),
                                        lambda index: host_array[index])


def to_host(x: jax.Array) -> np.ndarray:
    """The full value of a (possibly multi-host sharded) array as numpy, on every host."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def map_tasks(fn, tasks: tuple, mesh: Mesh, sequential: bool, shared: Any = ()):
    """``fn(*task, shared)`` for every task of a batch laid along the mesh (leading axis B).

    ``sequential=False``: one ``vmap`` over the batch, sharded over the mesh.
    ``sequential=True`` (on CPU, ``episode.sequential``): each device walks
    its own contiguous block of tasks one at a time (a ``lax.map`` inside
    ``shard_map``), so it holds one task's activations at a time and runs the
    same program as a single device would. ``shared`` (a pytree: the params, the split, a
    scalar) is the same for every task and enters whole on every device: pass the traced
    arrays ``fn`` needs here, not in its closure, since an array closed over inside
    ``shard_map`` keeps the mesh's global sharding, and an op that copies that sharding
    (``zeros_like``, a gather) fails on a mesh of more than one device (a split sharded by
    ``place_split`` would be gathered whole for it: training never shards one on CPU, the
    only platform where ``sequential`` is the default). B must be a multiple of the mesh size.
    """
    size = jax.tree.leaves(tasks)[0].shape[0]
    if size % mesh.size:
        raise ValueError(f"a batch of {size} tasks does not split over {mesh.size} devices")
    if not sequential:
        return jax.vmap(lambda *task: fn(*task, shared))(*constrain(tasks, mesh))

    def walk(shared, *local):  # the tasks of one device, one after another
        return jax.lax.map(lambda args: fn(*args, shared), local)

    if mesh.size == 1:
        return walk(shared, *tasks)
    # check_vma=False: fn differentiates inside (per task); nothing is differentiated
    # across the shard_map boundary, so its replication type checks are not needed.
    return jax.shard_map(walk, mesh=mesh, in_specs=(P(), *[P(TASKS)] * len(tasks)),
                         out_specs=P(TASKS), check_vma=False)(shared, *tasks)


def is_sharded(x: jax.Array) -> bool:
    """Whether ``x`` is split across devices (not whole on each of its devices)."""
    return not x.sharding.is_fully_replicated


SPLIT_MEMORY_FRACTION = 0.25  # a split bigger than this share of a device's memory is sharded


def fits_one_device(nbytes: int, device: jax.Device) -> bool:
    """Whether ``nbytes`` stay under ``SPLIT_MEMORY_FRACTION`` of ``device``'s memory.

    True where the backend reports no limit (CPU): host memory is shared anyway.
    """
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    return limit is None or nbytes <= SPLIT_MEMORY_FRACTION * limit


def place_split(split, mesh: Mesh, shard: bool | None = None):
    """A dataset split on the mesh: replicated, or its images sharded along the sample axis.

    ``shard=None`` shards only a split that does not fit one device
    (``fits_one_device``). Sharding needs the sample count to divide over the
    devices; the images are padded with blank images (never indexed by the
    class table). A split already placed so is returned as it is.
    """
    if shard is None:
        shard = not fits_one_device(split.images.nbytes, mesh.devices.flat[0])
    if not shard or mesh.size == 1:
        return replicate(split, mesh)
    if is_sharded(split.images) and split.images.sharding == task_sharded(mesh):
        return split
    images = np.asarray(split.images)
    extra = padded(images.shape[0], mesh) - images.shape[0]
    if extra:
        images = np.concatenate([images, np.zeros((extra, *images.shape[1:]), images.dtype)])
    return split.replace(
        images=jax.device_put(images, task_sharded(mesh)),
        class_table=jax.device_put(split.class_table, replicated(mesh)),
        class_sizes=jax.device_put(split.class_sizes, replicated(mesh)))
