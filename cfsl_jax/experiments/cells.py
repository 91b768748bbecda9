"""Which cell a run is reported under, and which runs of a cell are one experiment.

A run is reported under its config's task (``B3``) while its TaskSpec is that task's, but for
how the paper-era code sampled and labelled it (``PROTOCOL_FIELDS``); a run whose spec
overrides make another cell of the paper's grid (``B3`` with ``--overwrite --nss=5``: C5) is
reported under that cell, and one whose overrides make a task outside the grid under its own
spec name, which no Table 1 cell has (``cell_of``). The runs of one cell are averaged across
seeds only when they differ in nothing else that changes their numbers
(``check_same_experiment``). Tables list cells and learners in the paper's order
(``cell_order``, ``learner_order``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from cfsl_jax.learners import LEARNERS
from cfsl_jax.protocol.spec import PAPER_GRID, TaskSpec
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training.config import COMPUTATION_OPTIONS, from_json
from cfsl_jax.training.runs import config_differences

# TaskSpec fields that say how the paper-era code sampled and labelled a cell's tasks
# (``--as_published``, docs/fidelity.md), not which cell it is: a run that changes only these
# is still its cell, and is compared with Table 1's (the D cells' note says how they labelled).
PROTOCOL_FIELDS = ("target_mode", "label_offset", "draws")


def _named_spec(result: dict[str, Any]) -> dict[str, Any]:
    return dataclasses.asdict(TaskSpec.parse(result["config"]["task"]))


def _resolved_spec(result: dict[str, Any]) -> dict[str, Any]:
    """The run's TaskSpec fields: results.json's ``spec``, or its config's task and overrides
    (a hand-made record without ``spec``), over the named task's (fields a record predates)."""
    named = _named_spec(result)
    spec = result.get("spec")
    if spec is None:
        spec = result["config"].get("spec_overrides") or {}
    return {**named, **spec}


def _same_cell(spec: dict[str, Any], named: dict[str, Any]) -> bool:
    """Whether TaskSpec fields ``spec`` are ``named``'s but for ``PROTOCOL_FIELDS``."""
    return all(spec[k] == v for k, v in named.items() if k not in PROTOCOL_FIELDS)


def cell_of(result: dict[str, Any]) -> str:
    """The cell a run is reported under: the paper cell (``B3``, ...) whose TaskSpec the run's
    is but for ``PROTOCOL_FIELDS``, whatever task its config names (``C5`` for ``task='B3'``
    with ``--overwrite --nss=5``, compared with Table 1's C5; ``B3`` for ``task='B'``); else
    its config's ``task`` where its TaskSpec is that task's (``B7``); else its own spec name
    (results.json's ``spec_name``, such as ``B7(cci=1,nc=5,ks=1,kt=5,per_class)`` for
    ``task='B3'`` with ``--nss=7``), which no Table 1 cell has."""
    task = result["config"]["task"]
    named, spec = _named_spec(result), _resolved_spec(result)
    for cell in PAPER_GRID:  # a cell's TaskSpec is no other cell's, PROTOCOL_FIELDS aside
        if _same_cell(spec, dataclasses.asdict(TaskSpec.preset(cell))):
            return cell
    if _same_cell(spec, named):
        return task
    return result.get("spec_name") or TaskSpec(**spec).name


# Config fields in which the seeds of one cell may differ (besides those that only say where
# files are read from or metrics are sent, ``runs.config_differences``): the seed, and how
# often a run checkpoints, logs or batches its evaluation, which do not change its numbers
# beyond rounding.
SEED_FIELDS = ("seed", "checkpoint_every", "log_every", "eval_batch")


def check_same_experiment(key: tuple[str, ...], first: dict[str, Any], result: dict[str, Any]) -> None:
    """Refuse (UserError, a ValueError) a cell whose runs differ in more than their seed: a
    learner option, a spec override, the budget, the evaluation seed... averaged across seeds,
    they would make one number of two experiments. Runs of one TaskSpec named by other tasks
    and overrides (``B3`` with ``--overwrite --nss=5``, ``C3`` with ``--nss=5``) are one."""
    differs = [name for name in config_differences(result["config"],
                                                   from_json(first["config"]))
               if name not in SEED_FIELDS]
    if {"task", "spec_overrides"} & set(differs) and \
            _resolved_spec(first) == _resolved_spec(result):
        differs = [name for name in differs if name not in ("task", "spec_overrides")]
    if "learner_options" in differs:  # resolved, and those that change only the rounding out
        options = [{k: v for k, v in from_json(r["config"]).learner_options.items()
                    if k not in COMPUTATION_OPTIONS} for r in (first, result)]
        if options[0] == options[1]:
            differs.remove("learner_options")
    if differs:
        raise UserError(
            f"{'/'.join(key)}: the runs of seeds {first['seed']} and {result['seed']} differ "
            f"in {', '.join(differs)}, not only in their seed; report each experiment from "
            f"its own sweep directory")


def cell_order(cells: Iterable[str]) -> list[str]:
    """``cells`` in the paper's grid order, then any others sorted."""
    cells = set(cells)
    return [c for c in PAPER_GRID if c in cells] + sorted(cells - set(PAPER_GRID))


def learner_order(learners: Iterable[str]) -> list[str]:
    """``learners`` in the registry's order, then any others sorted."""
    learners = set(learners)
    return [name for name in LEARNERS if name in learners] + sorted(learners - set(LEARNERS))
