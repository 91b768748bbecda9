"""Named training budgets: a run's schedule in one word.

    from cfsl_jax.training import budgets
    config = budgets.apply(TrainConfig(learner="maml_low", task="C3"), "paper")
    config.epochs, config.iters_per_epoch, config.meta_batch    # 250, 500, 1

``BUDGETS`` maps a name to the ``TrainConfig`` fields it sets; ``apply``
replaces them, except the fields named in ``keep`` (flags the user gave
explicitly win over the preset).

- ``default``: ``TrainConfig``'s own defaults (10 epochs x 100 steps x 8 tasks,
  600 validation tasks, top-5 ensemble on 600 test tasks; pretraining on the
  images of the same sampled training tasks for the same schedule).
- ``quick``: the README's first command (3 x 20 x 4, 100 validation tasks): a
  few minutes on CPU, for trying things out; its numbers mean little.
- ``paper``: the paper's schedule (appendix A): 250 epochs of 500 update steps,
  "each one done on a single continual task", validation on 600 fixed tasks
  after every epoch, the ensemble of the top 5 epochs tested on 600 tasks; and
  Pretrain+Tune pretrained as the authors' code did (``pretrain_data="tasks"``:
  the images of sampled training tasks, a head over all training classes, the
  same 250 x 500 schedule, selected on validation). 125,000 meta-steps per run.

The optimiser (Adam, L2 1e-5, lr 1e-3) is the paper's in every budget; see
``docs/fidelity.md`` for the settings where the paper and the code differ.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training.config import TrainConfig

BUDGETS: dict[str, dict[str, object]] = {
    "default": {},
    "quick": dict(epochs=3, iters_per_epoch=20, meta_batch=4, val_tasks=100, test_tasks=600,
                  keep_best=5),
    "paper": dict(epochs=250, iters_per_epoch=500, meta_batch=1, val_tasks=600, test_tasks=600,
                  keep_best=5, pretrain_data="tasks"),
}


def fields(name: str) -> dict[str, object]:
    """The ``TrainConfig`` fields budget ``name`` sets (``default``: TrainConfig's defaults)."""
    if name not in BUDGETS:
        raise UserError(f"--budget={name}: unknown budget; valid: {', '.join(BUDGETS)}")
    defaults = TrainConfig()
    names = {key for preset in BUDGETS.values() for key in preset}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return {key: BUDGETS[name].get(key, getattr(defaults, key)) for key in sorted(names & known)}


def apply(config: TrainConfig, name: str, keep: Iterable[str] = ()) -> TrainConfig:
    """``config`` with budget ``name``'s fields, except those in ``keep`` (explicit choices)."""
    keep = set(keep)
    return dataclasses.replace(config, **{k: v for k, v in fields(name).items() if k not in keep})


def name_of(config: TrainConfig) -> str | None:
    """The budget whose fields ``config`` has, or None (a custom schedule)."""
    for name in BUDGETS:
        if all(getattr(config, key, None) == value for key, value in fields(name).items()):
            return name
    return None
