"""One seed, one root key, split by purpose with ``fold_in``.

Every random choice in cfsl_jax flows from ``jax.random.key(seed)``; each use
gets its own stream so that, e.g., changing the number of training steps
never changes the evaluation tasks:

    data_key = purpose_key(seed, "data")      # task sampling for training
    test_key = purpose_key(seed, "test")      # the fixed test tasks
"""

from __future__ import annotations

import jax

PURPOSES: tuple[str, ...] = ("data", "init", "train", "test", "val", "show", "pretrain")
ALIASES = {"eval": "test"}  # an older name of a purpose: the same key


def purpose_key(seed: int, purpose: str) -> jax.Array:
    """The key for one purpose of a run: ``fold_in(key(seed), index of purpose)``."""
    purpose = ALIASES.get(purpose, purpose)
    if purpose not in PURPOSES:
        raise ValueError(f"unknown key purpose {purpose!r}; valid: {PURPOSES}")
    return jax.random.fold_in(jax.random.key(seed), PURPOSES.index(purpose))
