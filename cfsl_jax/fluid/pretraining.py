"""Pretraining the shared FLUID backbone on the pretrain classes' held-back samples.

A thin adapter over ``cfsl_jax.pretrain.pretrain`` (supervised softmax
cross-entropy of ``params["embed"]`` with a temporary linear head, Adam): the
split it sees is the stream's split with its class table replaced by
``StreamClasses.pretrain_table`` -- row k = pretrain class k's samples that
are not in the stream -- so pretraining never touches a stream sample, and
novel classes are never seen. A ``Method`` carries ``name``, ``training`` and
``embed_apply``, which is all ``pretrain`` uses of a learner. The backbone
normalises each image on its own (``fluid.backbone``), in pretraining too.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from absl import logging

from cfsl_jax.data import Split
from cfsl_jax.fluid.protocol import Method, Params
from cfsl_jax.fluid.sequences import StreamClasses, pretrain_class_table
from cfsl_jax.pretrain import pretrain


def pretrain_split(split: Split, classes: StreamClasses) -> Split:
    """``split`` with only the pretraining data in its class table (images untouched)."""
    table, sizes = pretrain_class_table(classes)
    info = split.info
    names = tuple(info.class_names[c] for c in classes.split_class[:table.shape[0]])
    info = dataclasses.replace(info, split=f"{info.split} (FLUID pretraining data)",
                               num_classes=len(names), class_names=names)
    return dataclasses.replace(split, class_table=jnp.asarray(table),
                               class_sizes=jnp.asarray(sizes), info=info)


def pretrain_backbone(method: Method, params: Params, split: Split, classes: StreamClasses,
                      key: jax.Array, **options) -> Params:
    """``params`` with the backbone pretrained on the pretrain classes (``pretrain`` options).

    With no pretraining data (``pretrain_fraction=0``) the backbone stays as it is.
    """
    if classes.pretrain_table.shape[0] == 0 or not (classes.pretrain_table >= 0).any():
        logging.warning("no pretraining data (no pretrain classes): the backbone stays random")
        return params
    return pretrain(method, params, pretrain_split(split, classes), key, **options)
