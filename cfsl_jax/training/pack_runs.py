"""Which runs a pack holds, and how: the config fields its runs may differ in (``PACKABLE``),
their configs (``pack_configs``), their per-run optimiser scalars (``hyper_parameters``), and
the settings of how a pack computes (``PackOptions``, ``PACK_AXES``,
``check_steps_per_dispatch``).

    configs = pack_configs(config, seeds=(0, 0), learning_rates=(1e-3, 3e-4))
    hyper = hyper_parameters(configs)  # {"learning_rate": f32[2], "weight_decay": f32[2]}
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import TYPE_CHECKING, NamedTuple, Sequence

from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training.config import TrainConfig

if TYPE_CHECKING:
    import numpy as np

# How a pack computes its runs (--pack_axis; ``steps.resolve_pack_axis``). This module imports
# no JAX (nor numpy until ``hyper_parameters``): a command defines its flags from it.
PACK_AXES: tuple[str, ...] = ("auto", "vmap", "map")


class PackOptions(NamedTuple):
    """How a sweep's packs meta-train (``meta_train_pack``'s settings; none is part of a run's
    config: they change how its runs are computed, not what)."""
    steps_per_dispatch: int = 1  # S: meta-steps per host call
    shrink: bool = False  # --pack=auto: a pack too large for the device trains as smaller ones
    pack_axis: str = "auto"  # PACK_AXES (steps.resolve_pack_axis): vmap | map | auto


def check_steps_per_dispatch(config: TrainConfig, steps_per_dispatch: int) -> None:
    """UserError unless S divides the epoch, the log interval and the checkpoint interval."""
    intervals = (config.iters_per_epoch, config.log_every, config.checkpoint_every)
    if steps_per_dispatch < 1 or any(i % steps_per_dispatch for i in intervals if i):
        raise UserError(f"--steps_per_dispatch={steps_per_dispatch} must divide "
                        f"--iters_per_epoch, --log_every and --checkpoint_every (now "
                        f"{', '.join(map(str, intervals))}; a checkpoint_every of 0 is free)")


# The config fields in which the runs of a pack may differ (one program serves them all): the
# seed (each run's own initial params and training tasks) and the learning rate (each run's
# own, traced). Anything else changes the program.
PACKABLE = ("seed", "learning_rate")


def pack_key(config: TrainConfig) -> str:
    """What the runs of one pack share: ``config`` without the ``PACKABLE`` fields, and the
    seed of its validation and test tasks (``task_seed``: a pack evaluates its runs on tasks
    sampled once, so runs with ``--eval_seed=seed`` pack with none but their own seed's)."""
    shared = {k: v for k, v in config.to_json().items() if k not in PACKABLE}
    return json.dumps({**shared, "task_seed": config.task_seed}, sort_keys=True)


def check_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    """The seeds of a pack, refused (UserError) when empty, negative or repeated."""
    seeds = tuple(seeds)
    repeated = sorted(s for s, n in collections.Counter(seeds).items() if n > 1)
    if seeds and min(seeds) < 0:
        raise UserError(f"--seeds={','.join(map(str, seeds))}: seed {min(seeds)} is negative; "
                        f"a seed is an integer >= 0")
    if not seeds or repeated:
        raise UserError(f"--seeds={','.join(map(str, seeds))}: "
                        + (f"seed {repeated[0]} is given twice" if repeated else "no seed")
                        + "; give distinct seeds")
    return seeds


def pack_configs(config: TrainConfig, seeds: Sequence[int],
                 learning_rates: Sequence[float] | None = None) -> list[TrainConfig]:
    """The runs' configs: ``config`` with each of ``seeds`` (and its learning rate, aligned
    with ``seeds``); refused (UserError): a seed repeated at one learning rate, and seeds that
    would each be validated and tested on their own tasks (``--eval_seed=seed``), which a
    pack's shared evaluation cannot do."""
    configs = _configs(config, seeds, learning_rates)
    if len({c.task_seed for c in configs}) > 1:
        raise UserError(f"--eval_seed=seed with --seeds={','.join(map(str, seeds))}: a pack "
                        f"validates and tests its runs on the same tasks, and each of these "
                        f"seeds would have its own; give --eval_seed=N (the default is 0) or "
                        f"train each seed alone with --seed")
    return configs


def _configs(config: TrainConfig, seeds: Sequence[int],
             learning_rates: Sequence[float] | None) -> list[TrainConfig]:
    if learning_rates is None:
        return [dataclasses.replace(config, seed=seed) for seed in check_seeds(seeds)]
    if len(learning_rates) != len(seeds):
        raise ValueError(f"{len(learning_rates)} learning rates for {len(seeds)} seeds")
    runs_ = list(zip(seeds, learning_rates))
    repeated = [run for run, n in collections.Counter(runs_).items() if n > 1]
    if not runs_ or repeated:
        raise UserError("a pack needs distinct runs: " + (
            f"seed {repeated[0][0]} at learning rate {repeated[0][1]} is given twice"
            if repeated else "no run"))
    return [dataclasses.replace(config, seed=seed, learning_rate=float(rate))
            for seed, rate in runs_]


def hyper_parameters(configs: Sequence[TrainConfig]) -> dict[str, np.ndarray] | None:
    """The runs' optimiser scalars as float32 [K] arrays (``train.pack_optimizer``'s keywords),
    or None where every run has the same (a pack of seeds: its optimiser's scalars stay
    constants of the program, which XLA compiles as it compiles the solo run's)."""
    names = ("learning_rate", "weight_decay")
    if len({tuple(getattr(c, name) for name in names) for c in configs}) == 1:
        return None
    import numpy as np  # here: the flags read this module's constants before numpy is needed
    return {name: np.asarray([getattr(c, name) for c in configs], np.float32) for name in names}


def largest_fitting(need: int, limit: int, size: int) -> int:
    """The most runs that fit ``limit`` bytes when a pack of ``size`` needs ``need``: the
    pack's bytes taken as ``size`` equal shares (the runs' params, states and activations)."""
    return max(0, int(limit // max(1, -(-need // size))))


class PackTooLarge(UserError):
    """A pack that does not fit the device's memory; ``fits``: the most runs that do."""

    def __init__(self, message: str, fits: int):
        super().__init__(message)
        self.fits = fits


__all__ = ["PACKABLE", "PACK_AXES", "PackOptions", "PackTooLarge", "check_seeds",
           "check_steps_per_dispatch", "hyper_parameters", "largest_fitting", "pack_configs",
           "pack_key"]
