"""``--as_published``: one preset per paper-era version of the authors' code.

    config = as_published.apply(TrainConfig(learner="maml_low", task="B3"), "feb2020")

A preset is a named bundle of individual options, each of which is also usable
alone (``docs/fidelity.md`` lists them): TaskSpec fields (``spec``), learner
options per learner (``learner_options``) and dataset options per dataset
(``dataset_options``). Options the user gave explicitly win over the preset's.
Table 1's A, B and C cells equal the Feb-2020 results file (commit 39025a3),
its D cells the Apr-2020 data code (commit 5b814ac).

``feb2020`` (FewShotContinualLearning commit 39025a3): ``data.py`` ``get_set``
runs once per support set: every support set draws fresh KS+KT samples of its
group's classes, every group draws its classes on its own (a class can recur
under another label), labels are offset per support set
(``experiment_builder.py`` ``convert_into_continual_tasks``) and the target set
is KT per class per support set. ``apr2020`` (commit 5b814ac): ``get_set``
draws a task at once: groups of distinct classes, one draw of KS+KT samples per
class reused by every support set of the group, labels offset per support set.
Learner behaviours, the same in both (``few_shot_learning_system.py``): MAML++
low-end and the fine-tuners re-copy the meta-weights at every support set;
Pretrain+Tune normalises every fine-tuning step but a task's first, and its
prediction, with per-step batch-norm rows its pretraining never trained (the
initial scale/bias); ProtoNets' prototype is the label's last support sample
over NSS*KS and its logits are dot products, its Conv-4 blocks are conv
(no bias), LeakyReLU, batch norm (``ConvReLUBatchNorm``: a signed embedding under
the dot product); ProtoNets and the MAML++ H/SCA embedding use batch norm with running
averages at test (the default here anyway).

``LEFT_AT_DEFAULT`` lists the settings of that code a preset does not set: they
stay at today's defaults unless given (``docs/fidelity.md``).

``NOT_REPRODUCED`` says, per preset, which behaviours of that code no option
reproduces and why.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

_RESTART = {"restart_each_support_set": True}
_LEARNERS = {
    "protonets": {"last_sample_prototype": True, "distance": "dot", "bn_stats": "running",
                  "activation": "leaky_relu", "block_order": "conv_act_norm", "conv_bias": False},
    "maml_low": _RESTART, "init_tune": _RESTART,
    "pretrain_tune": {**_RESTART, "per_step_bn_rows": True},
    "maml_high": {"bn_stats": "running"}, "sca": {"bn_stats": "running"},
}
_LABELS = {"target_mode": "per_support_set", "label_offset": "per_support_set"}
_NOT_REPRODUCED = (
    "batch-norm batches: ProtoNets embedded all support sets of a task in one batch and the "
    "meta-batch's target sets in another, MAML++ H/SCA a task's support and target sets "
    "together; the specification's data flow shows a learner one support set at a time, so "
    "the running averages here are folded in per support set and per target set",
    "EWC-Init and EWC-Pretrain: no commit of the authors' repository contains EWC; their rows "
    "run cfsl_jax's own EWC unchanged (Table 1's EWC rows carry the fine-tuners' restart "
    "signature, docs/results.md; --learner_option=restart_each_support_set=True adds it)",
)

# Settings where the paper-era code differs and a preset leaves today's default in place.
LEFT_AT_DEFAULT: tuple[str, ...] = (
    "Omniglot class split: the presets keep --dataset_option (default: the official order, "
    "first 1200 train); the authors' shuffled split is --dataset_option=class_split=authors",
    "weight decay: the code's AdamW / Adam weight_decay=1e-4; here Adam with L2 1e-5 "
    "(TrainConfig.weight_decay, the paper's)",
    "meta-batch: the code's batch_size 1; here --meta_batch (8 by default; 1 under "
    "--budget=paper)",
    "the schedule: 250 x 500 steps only under --budget=paper",
    "SCA's pre/post-critic loss weights: the code holds them for each epoch; here they anneal "
    "every step unless --learner_option=critic_weight_epochs= the run's --epochs",
)


class Preset(NamedTuple):
    commit: str
    spec: dict[str, Any]
    learner_options: dict[str, dict[str, Any]]
    dataset_options: dict[str, dict[str, Any]]
    not_reproduced: tuple[str, ...]


PRESETS: dict[str, Preset] = {
    "feb2020": Preset("39025a3", {"draws": "independent", **_LABELS}, _LEARNERS, {},
                      _NOT_REPRODUCED),
    "apr2020": Preset("5b814ac", {"draws": "per_group", **_LABELS}, _LEARNERS, {},
                      _NOT_REPRODUCED),
}
NAMES: tuple[str, ...] = ("none", *PRESETS)


def learner_options(name: str, learner: str) -> dict[str, Any]:
    """The learner options preset ``name`` gives ``learner`` ({} for "none")."""
    return dict(PRESETS[name].learner_options.get(learner, {})) if name != "none" else {}


def preset_of(config) -> str:
    """The preset whose settings ``config`` (a ``TrainConfig``) carries, ``"none"`` if none does.

    A run records the options a preset gave, not the preset's name (config.json), so the name
    is read back from them: every TaskSpec field, learner option and dataset option of the
    preset, with the preset's value. Other options given beside the preset do not hide it;
    one that replaced a preset's value does (the run is no longer that preset's).
    """
    for name, preset in PRESETS.items():
        wanted = [(preset.spec, config.spec_overrides),
                  (learner_options(name, config.learner), config.learner_options),
                  (preset.dataset_options.get(config.dataset, {}), config.dataset_options)]
        if all(given.get(key, object()) == value
               for settings, given in wanted for key, value in settings.items()):
            return name
    return "none"


def apply(config, name: str, per_learner: bool = True):
    """``config`` (a ``TrainConfig``) under preset ``name``; what the user gave explicitly wins.

    TaskSpec overrides, learner and dataset options already in the config are kept.
    ``per_learner=False`` leaves learner options alone (a sweep adds them per learner
    with ``learner_options``).
    """
    if name not in NAMES:
        raise ValueError(f"as_published={name!r}; valid: {NAMES}")
    if name == "none":
        return config
    preset = PRESETS[name]
    spec = {**preset.spec, **config.spec_overrides}
    options = config.learner_options
    if per_learner:
        options = {**learner_options(name, config.learner), **options}
    dataset = {**preset.dataset_options.get(config.dataset, {}), **config.dataset_options}
    return dataclasses.replace(config, spec_overrides=spec, learner_options=options,
                               dataset_options=dataset)
