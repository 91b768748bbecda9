"""Which classes of the split each stream of an experiment uses (the paper's Appendix B).

The paper's five sequences share one world: ImageNet-1K (pretraining, which
holds every sequence's 250 pretrain classes) and ImageNet-22K's other classes
(the novel ones). "For the test sequences, we randomly select the classes
without replacement to ensure that the sequences do not overlap"; the
validation sequences "share pretrain classes because there are not enough
pretrain classes (1000) to partition among five sequences". The authors'
released sequences (``S1``-``S5``: ``class_map*.npy``) share no novel class,
and their three test sequences no pretrain class (one between 4 and 5).

``draw_classes`` does the same from one permutation of the split's classes per
seed (``key``; ``FluidConfig.class_draw="disjoint"``):

- the *world*, the analogue of ImageNet-1K: the first ``W = max(pretrain_classes,
  P)`` classes of the permutation (with ``pretrain_mask``: of the masked
  classes). A stream pretrains on the world (``StreamClasses.extra_class``: the
  world less its own pretrain classes), so no stream's novel class is ever a
  pretraining class.
- pretrain classes, ``P`` of the world: test stream ``i`` takes world positions
  ``i*P .. i*P + P - 1``, validation stream ``j`` positions counted from the
  world's end, modulo ``W``: test streams share none while ``(i + 1) * P <= W``
  (the paper: 3 x 250 of 1,000); validation streams share them with test
  streams, as the paper's. With ``pretrain_classes=0`` (``W = P``) every stream
  has the same pretrain classes.
- novel classes, blocks of ``N = K - P`` of the other classes (with a mask:
  of the unmasked ones): test stream ``i`` takes block ``i`` from the front,
  validation stream ``j`` block ``j`` from the back. No two test streams share
  a novel class, nor two validation streams; a test and a validation stream
  share none while ``(tests + validations) * N`` fits the pool, which
  ``check_room`` checks where both are used (the new-class threshold). A block
  past the pool is a ``UserError`` naming the classes needed.

Which samples of a class, the counts and the order stay the stream key's
(``make_stream``); a pretrain class that a validation and a test stream share
may give both some of the same images (the paper does not say).
``class_draw="independent"``: each stream draws its classes from its own key
(``make_stream`` without a draw; streams then share classes: the behaviour
before this module).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from cfsl_jax.runtime.errors import UserError


class ClassDraw(NamedTuple):
    """The split classes of one stream (class-table rows)."""

    chosen: np.ndarray  # int32 [K] the P pretrain classes, then the K - P novel ones
    extra: np.ndarray  # int32 [W - P] the world's other classes (pretraining only), sorted


def _pools(key: jax.Array, num_split_classes: int, config, pretrain_mask=None
           ) -> tuple[np.ndarray, np.ndarray]:
    """(world [W], novel pool) of the seed: both in the permutation's order."""
    order = np.asarray(jax.random.permutation(key, num_split_classes))
    world_size = max(config.pretrain_classes, config.num_pretrain)
    if pretrain_mask is None:
        world, novel = order[:world_size], order[world_size:]
    else:
        mask = np.asarray(pretrain_mask, bool)[order]
        world, novel = order[mask][:world_size], order[~mask]
    if world.size < world_size:
        raise UserError(f"the world of {world_size} pretraining classes (pretrain_classes="
                        f"{config.pretrain_classes}, {config.num_pretrain} per stream) needs "
                        f"more classes than the split's {world.size}"
                        + (" in the pretrain mask" if pretrain_mask is not None else ""))
    return world, novel


def _room_error(needed: int, novel: int, config, what: str) -> UserError:
    world = max(config.pretrain_classes, config.num_pretrain)
    return UserError(
        f"{what} needs {needed:,} novel classes, {config.num_classes - config.num_pretrain:,} "
        f"a stream, but the split has {novel:,} besides the {world:,} pretraining classes "
        f"(class_draw=disjoint: streams share no novel class, as the paper's): a larger split "
        f"(--dataset_option=num_classes=N for the synthetic set), fewer streams, or "
        f"--class_draw=independent (each stream draws its own classes; streams then share "
        f"classes)")


def draw_classes(key: jax.Array, num_split_classes: int, config, index: int,
                 validation: bool = False, pretrain_mask=None) -> ClassDraw:
    """Test (or ``validation``) stream ``index``'s classes (module doc); ``config`` a
    ``StreamConfig``."""
    world, novel = _pools(key, num_split_classes, config, pretrain_mask)
    p, n = config.num_pretrain, config.num_classes - config.num_pretrain
    if (index + 1) * n > novel.size:
        kind = "validation" if validation else "test"
        raise _room_error((index + 1) * n, novel.size, config, f"{kind} stream {index}")
    start = world.size - (index + 1) * p if validation else index * p
    pretrain = world[(start + np.arange(p)) % world.size] if p else world[:0]
    own = novel[::-1] if validation else novel
    chosen = np.concatenate([pretrain, own[index * n:(index + 1) * n]]).astype(np.int32)
    extra = np.sort(np.setdiff1d(world, pretrain)).astype(np.int32)
    return ClassDraw(chosen, extra)


def check_room(key: jax.Array, num_split_classes: int, config, tests: int, validations: int,
               pretrain_mask=None) -> None:
    """UserError unless ``tests`` test and ``validations`` validation streams share no novel
    class (module doc)."""
    _, novel = _pools(key, num_split_classes, config, pretrain_mask)
    needed = (tests + validations) * (config.num_classes - config.num_pretrain)
    if needed > novel.size:
        raise _room_error(needed, novel.size, config,
                          f"{tests} test and {validations} validation stream(s)")
