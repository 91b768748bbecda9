"""Planning a sweep: the grid of (dataset x learner x task cell x seed) runs, each run's workdir,
and each run's status. ``cfsl_jax.experiments.sweep`` runs the plan in worker processes.

    from cfsl_jax.experiments import sweep_plan
    configs, skipped = sweep_plan.grid(TrainConfig(epochs=2), learners=("protonets", "init_tune"),
                                       cells=("B3", "C3"), seeds=(0, 1))
    for run, state, detail in sweep_plan.plan(configs, "/tmp/sweep", check=True): ...

Rules:

- Layout: ``<sweep_dir>/<dataset>/<learner>/<cell>/seed<k>/``, a plain
  ``train.train_and_evaluate`` workdir; ``/`` in a dataset name becomes ``-``
  (``omniglot/small`` -> ``omniglot-small``). Every other field of the runs'
  ``TrainConfig`` (the budget, spec overrides, options) is the sweep's.
- A run is **done** when its ``results.json`` exists (``train_and_evaluate``
  writes it last, atomically), **partial** when its workdir holds a
  ``config.json`` but no results (``train_and_evaluate`` resumes it from its
  checkpoints), **new** otherwise, and a **conflict** when its ``config.json``
  differs from the sweep's config (another budget, say): it is never run, the
  sweep asks for another sweep directory. A sweep killed at any point therefore
  continues where it stopped when run again, and runs only what is missing.
- Order: seed-major (every run of seed 0, then seed 1, ...), so a program is
  compiled once, by seed 0's run, and the other seeds load it from the
  persistent XLA compilation cache.
- A learner that cannot be built (not implemented yet, a bad option) is skipped
  by ``grid`` with its reason, before anything runs. ``plan(..., check=True)``
  (what ``--dry_run`` lists) marks **impossible** the runs whose spec a split
  they sample tasks from cannot supply, with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Iterable, Mapping, NamedTuple, Sequence

from cfsl_jax import data
from cfsl_jax.runtime import files
from cfsl_jax.training import results
from cfsl_jax.training import pack_runs, runs
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.learners import LEARNERS, get_learner
from cfsl_jax.protocol.spec import PAPER_GRID


STATUSES: tuple[str, ...] = ("done", "partial", "new", "conflict", "impossible")


class Run(NamedTuple):
    """One run of a sweep: its full config and its workdir."""

    config: TrainConfig
    workdir: str

    @property
    def name(self) -> str:
        return (f"{self.config.dataset}/{self.config.learner}/{self.config.task}/"
                f"seed{self.config.seed}")


class Outcome(NamedTuple):
    """What running (or not running) one run did."""

    run: Run
    status: str  # "skipped" (done before), "finished", "failed", "conflict", "interrupted",
    # "busy" (another process is training it: not run)
    seconds: float
    detail: str  # test accuracy, the error, or the reason


def safe_name(name: str) -> str:
    """A name usable as one path component (``/`` and odd characters become ``-``)."""
    return re.sub(r"[^A-Za-z0-9_.=-]", "-", str(name).replace("/", "-"))


def run_dir(sweep_dir: str, config: TrainConfig) -> str:
    """``<sweep_dir>/<dataset>/<learner>/<cell>/seed<k>`` for a run's config."""
    return files.join(sweep_dir, safe_name(config.dataset), safe_name(config.learner),
                        safe_name(config.task), f"seed{config.seed}")


def check_learners(learners: Iterable[str], cell: str, base: TrainConfig,
                   learner_options: Mapping[str, dict] | None = None
                   ) -> tuple[list[str], dict[str, str]]:
    """Learners that build for ``cell`` (with the base spec overrides and their options), and
    ``{name: reason}`` for those that do not."""
    spec = dataclasses.replace(base, task=cell).spec
    usable, skipped = [], {}
    for name in learners:
        options = {**base.learner_options, **(learner_options or {}).get(name, {})}
        try:
            get_learner(name, spec, **options)
        except Exception as error:  # noqa: BLE001  (any build failure means: skip it)
            skipped[name] = f"{type(error).__name__}: {error}"
        else:
            usable.append(name)
    return usable, skipped


def grid(base: TrainConfig, learners: Sequence[str] | None = None,
         cells: Sequence[str] = PAPER_GRID, seeds: Sequence[int] = (0, 1, 2),
         datasets: Sequence[str] | None = None, learner_options: Mapping[str, dict] | None = None
         ) -> tuple[list[TrainConfig], dict[str, str]]:
    """The sweep's run configs (seed-major) and the learners skipped, with their reasons.

    ``base`` is a ``TrainConfig`` giving everything but (dataset, learner, task,
    seed); ``learners=None`` means every registered learner that builds;
    ``datasets=None`` means ``[base.dataset]``; ``learner_options`` maps a learner
    to options added to ``base.learner_options`` for it alone.
    """
    names = list(LEARNERS if learners is None else learners)
    unknown = [name for name in names if name not in LEARNERS]
    if unknown:
        raise ValueError(f"unknown learner(s) {unknown}; valid: {LEARNERS}")
    for name in learner_options or {}:
        if name not in LEARNERS:
            raise ValueError(f"learner_options names unknown learner {name!r}; valid: {LEARNERS}")
    if not cells or not seeds or not names:
        raise ValueError(f"a sweep needs at least one learner, cell and seed, got learners="
                         f"{names}, cells={list(cells)}, seeds={list(seeds)}")
    for what, values in (("learners", names), ("cells", cells), ("seeds", seeds),
                         ("datasets", datasets or [])):
        if len(set(values)) != len(values):
            raise ValueError(f"{what} lists a value twice: {list(values)}")
    if min(seeds) < 0:
        raise ValueError(f"seeds={list(seeds)}: a seed is a non-negative integer")
    configs = []
    for cell in cells:  # validates every cell (with the overrides) up front
        dataclasses.replace(base, task=cell).check()
    usable, skipped = check_learners(names, cells[0], base, learner_options)
    for seed in seeds:
        for dataset in datasets or [base.dataset]:
            for learner in usable:
                options = {**base.learner_options, **(learner_options or {}).get(learner, {})}
                for cell in cells:
                    configs.append(dataclasses.replace(
                        base, dataset=dataset, learner=learner, learner_options=options,
                        task=cell, seed=int(seed)))
    return configs, skipped


def status(run: Run) -> tuple[str, str]:
    """(one of STATUSES, a detail) for a run's workdir."""
    config_path = files.join(run.workdir, "config.json")
    if not files.exists(config_path):
        return "new", ""
    differences = runs.describe_differences(results.read_json(config_path), run.config,
                                            sweep=True)
    if differences:
        return "conflict", f"{run.workdir} holds a run with a different config{differences}"
    if files.exists(files.join(run.workdir, "results.json")):
        return "done", ""
    return "partial", ""


def plan(configs: Iterable[TrainConfig], sweep_dir: str, check: bool = False
         ) -> list[tuple[Run, str, str]]:
    """Every run with its status and detail (what ``--dry_run`` lists); with ``check``, a run
    that is not done and whose spec a split it samples from cannot supply is "impossible"
    (this loads every dataset of the sweep)."""
    runs = [Run(config, run_dir(sweep_dir, config)) for config in configs]
    workdirs = [run.workdir for run in runs]
    if len(set(workdirs)) != len(workdirs):
        raise ValueError("two runs of the sweep share a workdir (a cell or seed listed twice?)")
    planned = [(run, *status(run)) for run in runs]
    if check:
        splits: dict[str, dict[str, data.Split]] = {}
        for i, (run, state, _) in enumerate(planned):
            reason = "" if state in ("done", "conflict") else impossible(run.config, splits)
            if reason:
                planned[i] = (run, "impossible", reason)
    return planned


def impossible(config: TrainConfig, cache: dict) -> str:
    """Why ``config``'s spec cannot be sampled from a split it touches ("" if it can);
    ``cache`` keeps the loaded splits of each dataset between calls."""
    key = json.dumps([config.dataset, config.data_dir, config.manual_dir,
                      config.dataset_options], sort_keys=True)
    if key not in cache:
        cache[key] = runs.load_splits(config)
    training = get_learner(config.learner, config.spec, **config.learner_options).recipe.training
    try:
        runs.check_feasible(config, cache[key],
                             runs.splits_touched(training, config.pretrain_data))
    except UserError as error:
        return str(error)
    return ""


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/3"`` -> ``(2, 3)``: shard K of N, 1 <= K <= N; UserError for anything else."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not match:
        raise UserError(f"--shard={text}: not K/N (e.g. --shard=1/2 and --shard=2/2 split the "
                        f"runs in two)")
    k, n = int(match.group(1)), int(match.group(2))
    if not 1 <= k <= n:
        raise UserError(f"--shard={text}: K must be 1 to N={n}" if n else
                        f"--shard={text}: N must be >= 1")
    return k, n


def shard(configs: Sequence[TrainConfig], k: int, n: int, pack: int = 1) -> list[TrainConfig]:
    """Shard ``k`` of ``n`` (1-based) of the sweep's runs: every n-th run of the plan's order from
    the k-th. Disjoint, together the whole plan, and the same for the same command (done runs
    count too, so that shards started at different times agree); round-robin spreads each
    learner's runs over the shards. ``pack`` > 1: every n-th pack (``pack_groups``) instead,
    so that no pack is split across shards."""
    if not 1 <= k <= n:
        raise ValueError(f"shard {k}/{n}: k must be 1 to n")
    if pack > 1:
        return [config for group in pack_groups(configs, pack)[k - 1::n] for config in group]
    return list(configs[k - 1::n])


def pack_groups(items: Sequence, size: int, config_of=lambda item: item) -> list[list]:
    """``items`` (configs, or anything ``config_of`` maps to one) grouped into packs of at most
    ``size`` whose configs differ only in ``pack_runs.PACKABLE`` fields (seed, learning rate:
    same learner, dataset, cell and schedule), in order of first appearance."""
    groups: dict[str, list[list]] = {}
    for item in items:
        key = pack_runs.pack_key(config_of(item))
        chunks = groups.setdefault(key, [[]])
        if len(chunks[-1]) == size:
            chunks.append([])
        chunks[-1].append(item)
    return [chunk for chunks in groups.values() for chunk in chunks]


def count(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def summary(outcomes: Sequence[Outcome]) -> str:
    """One line with the count of each outcome status."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
