"""What the reference rows say of each learner: does it learn, and what each part adds.

    from cfsl_jax.experiments import reference, reference_checks, reference_report
    rows, found = reference_report.load("docs/reference")
    table = reference_checks.learns(rows, found)     # header first, a row per learner and cell
    table = reference_checks.components(found)       # pretraining, EWC, SCA's critic, paired

- Runs are averaged only within one setting (``setting``: the ``--as_published`` preset and
  the options, but those that change only the rounding) and paired only within one preset,
  dataset options and spec overrides (``by_budget``); where a learner's runs (or a budget's,
  for pairs) differ in it, the budget column names the setting (``setting_labels``).
- ``learns``: a learner **learns** a cell when its test accuracy is above chance
  (1 / the cell's output classes) by a clear margin, the lower end of its 95 % CI at least
  ``CLEAR_MARGIN`` points above chance, and, where it trains (or pretrains), its validation
  accuracy ended above where it started. Init+Tune and EWC-Init train nothing: for them the
  test alone decides. Seeds of a cell are averaged (accuracy and CI half-width alike); the
  validation curve is the lowest seed's.
- ``components``: paired differences over the shared test tasks between learners that
  differ in one part (``PAIRS``): what pretraining adds to fine-tuning, what EWC adds, what
  SCA's critic adds to MAML++ H, each within one dataset, budget and cell
  (``paired.per_task_accuracy``). A learner with runs of more than one setting there (other
  learner options) has a row per setting, named ``learner [setting]``
  (``by_learner_setting``): its settings are never averaged together.
"""

from __future__ import annotations

import json
from typing import Hashable, Iterable, Sequence

import numpy as np

from cfsl_jax.experiments import paired, reference, report
from cfsl_jax.experiments.cells import cell_order, learner_order
from cfsl_jax.training import as_published
from cfsl_jax.training.config import COMPUTATION_OPTIONS, from_json

CLEAR_MARGIN = 5.0  # points between chance and the lower end of the test accuracy's 95 % CI

# (learner, against, the part that differs)
PAIRS: tuple[tuple[str, str, str], ...] = (
    ("pretrain_tune", "init_tune", "pretraining"),
    ("ewc_pretrain", "ewc_init", "pretraining, with EWC"),
    ("ewc_init", "init_tune", "EWC, from the init"),
    ("ewc_pretrain", "pretrain_tune", "EWC, pretrained"),
    ("sca", "maml_high", "SCA's critic"),
)


# ---- settings: the runs that may be averaged (or paired) ---------------------------------------
# A setting is (preset, options) as results.csv writes them (``reference.run_row``: the
# ``--as_published`` preset, and the dataset options, spec overrides and changed learner
# options as JSON), less the options that change only the rounding (COMPUTATION_OPTIONS): runs
# of one dataset, budget, learner and cell are averaged only within one setting.
Setting = tuple[str, str]


def setting(preset: str, options: str | dict) -> Setting:
    """(preset, options as sorted JSON without COMPUTATION_OPTIONS)."""
    options = json.loads(options or "{}") if isinstance(options, str) else options
    return preset, json.dumps({k: v for k, v in options.items()
                               if k not in COMPUTATION_OPTIONS}, sort_keys=True)


def row_setting(row: dict) -> Setting:
    """A results.csv row's setting (a row written before the columns existed: none, {})."""
    return setting(row.get("preset") or "none", row.get("options") or "{}")


def result_setting(result: dict) -> Setting:
    """A ``load`` result's setting: its row's (``_setting``), else read from its config as
    the export writes it."""
    if "_setting" in result:
        return result["_setting"]
    config = from_json(result["config"])
    return setting(as_published.preset_of(config), {
        **config.dataset_options, **config.spec_overrides,
        **reference._changed_options(config)})


def _shared_setting(result: dict) -> Setting:
    """What runs of different learners must share to be paired: the preset, the dataset
    options and the spec overrides (each learner has its own learner options)."""
    config = from_json(result["config"])
    return setting(result_setting(result)[0],
                   {**config.dataset_options, **config.spec_overrides})


def setting_labels(keyed: Iterable[tuple[Hashable, Setting]]) -> dict[tuple, str]:
    """{(context, setting): label} of (context, setting) pairs, to tell apart rows of one
    context (a dataset, budget and learner) that differ only in their setting: '' where the
    context has one setting; else the preset (where its presets differ) and the options that
    differ between its settings of one preset (``k=v``, or ``k unset``)."""
    contexts: dict[Hashable, dict[Setting, None]] = {}
    for context, kind in keyed:
        contexts.setdefault(context, {})[kind] = None
    labels = {}
    for context, settings in contexts.items():
        presets = {preset for preset, _ in settings}
        for preset, options in settings:
            parts = [f"as_published={preset}"] if len(presets) > 1 else []
            mine = json.loads(options)
            others = [json.loads(o) for p, o in settings if p == preset]
            names = sorted({k for o in others for k in o
                            if any(o2.get(k) != o.get(k) for o2 in others)})
            parts += [f"{k}={json.dumps(mine[k])}" if k in mine else f"{k} unset"
                      for k in names]
            labels[(context, (preset, options))] = ", ".join(parts)
    return labels


def budget_label(budget: str, label: str) -> str:
    """The budget, and the setting's label where runs differ in it:
    '8x50x8 [as_published=apr2020]'."""
    return f"{budget} [{label}]" if label else budget


def by_budget(found: Sequence[dict]) -> list[tuple[str, str, list[dict]]]:
    """[(dataset, budget, its runs)] of ``load``'s results, sorted: the runs that pair (one
    preset, dataset options and spec overrides; the budget labelled with them where the runs
    differ in them, ``setting_labels``)."""
    keyed = [((r["dataset"], r["_budget"], _shared_setting(r)), r) for r in found]
    keys = sorted({key for key, _ in keyed})
    labels = setting_labels((key[:2], key[2]) for key in keys)
    return [(dataset, budget_label(budget, labels[((dataset, budget), shared)]),
             [r for key, r in keyed if key == (dataset, budget, shared)])
            for dataset, budget, shared in keys]


def by_learner_setting(subset: Sequence[dict]) -> list[dict]:
    """``subset`` (the runs of one ``by_budget`` group), a learner's runs of a cell renamed
    ``learner [setting]`` (``setting_labels``) where that learner holds more than one setting
    there (other learner options): ``paired.per_task_accuracy`` then averages and pairs each
    setting's runs on their own, and never refuses two settings as one experiment."""
    keyed = [((r["learner"], report.cell_of(r)), result_setting(r)) for r in subset]
    labels = setting_labels(keyed)
    return [{**r, "learner": budget_label(r["learner"], labels[key])}
            for r, key in zip(subset, keyed)]


def base_learner(name: str) -> str:
    """The learner of a ``by_learner_setting`` name: 'init_tune [inner_steps=1]' -> 'init_tune'."""
    return name.split(" [")[0]


def _groups(found: Sequence[dict]) -> dict[tuple, list[dict]]:
    """(dataset, budget, setting, learner, cell) -> its complete runs' results, in report
    order."""
    groups: dict[tuple, list[dict]] = {}
    for result in found:
        key = (result["dataset"], result["_budget"], result_setting(result), result["learner"],
               report.cell_of(result))
        groups.setdefault(key, []).append(result)
    cells = cell_order(key[4] for key in groups)
    learners = learner_order(key[3] for key in groups)
    return dict(sorted(groups.items(), key=lambda item: (
        item[0][0], item[0][1], item[0][2], learners.index(item[0][3]),
        cells.index(item[0][4]))))


def verdict(acc: float, ci95: float, chance: float, val: tuple[float, float] | None) -> str:
    """``learns`` or what it lacks; accuracies in points, ``val`` (first, last) or None for a
    learner that trains nothing."""
    lacks = []
    if acc - ci95 - chance < CLEAR_MARGIN:
        lacks.append(f"test within {CLEAR_MARGIN:g} points of chance")
    if val is not None and not val[1] > val[0]:
        lacks.append("validation did not rise")
    return "learns" if not lacks else "does not learn: " + "; ".join(lacks)


def learns(rows: Sequence[dict], found: Sequence[dict]) -> list[list[str]]:
    """Rows (header first): per dataset, budget, learner and cell, the test accuracy beside
    chance, the validation curve's first, best and last points, and the verdict."""
    out = [["dataset", "budget", "learner", "cell", "test (%)", "chance (%)",
            "validation first -> best -> last (%)", "verdict"]]
    groups = _groups(found)
    labels = setting_labels(((key[0], key[1], key[3]), key[2]) for key in groups)
    for (dataset, budget, kind, learner, cell), runs in groups.items():
        chance = 100 / from_json(runs[0]["config"]).spec.num_outputs
        acc = 100 * float(np.mean([r["test"]["acc_mean"] for r in runs]))
        ci95 = 100 * float(np.mean([r["test"]["acc_ci95"] for r in runs]))
        seeds = [r for r in rows if r["status"] == "complete" and (
            r["dataset"], r["budget"], r["learner"], r["cell"]) == (dataset, budget, learner, cell)
            and row_setting(r) == kind]
        row = min(seeds, key=lambda r: int(r["seed"]), default={})  # the lowest seed's curve
        val = None
        text = "trains nothing" if reference._training(learner) == "none" else \
            "no validation curve"
        if row.get("val_acc_first", "") != "":
            first, best, last = (100 * float(row[k]) for k in
                                 ("val_acc_first", "val_acc_best", "val_acc_last"))
            val = (first, last)
            text = f"{first:.1f} -> {best:.1f} -> {last:.1f}"
        out.append([dataset, budget_label(budget, labels[((dataset, budget, learner), kind)]),
                    learner, cell,
                    f"{acc:.2f} ± {ci95:.2f}",
                    f"{chance:.1f}", text, verdict(acc, ci95, chance, val)])
    return out


def components(found: Sequence[dict]) -> list[list[str]]:
    """Rows (header first): ``PAIRS``' paired differences, per dataset, budget and cell."""
    out = [["dataset", "budget", "cell", "what it adds", "learner", "against",
            "difference (points)", "95 % CI", "tasks"]]
    for dataset, budget, subset in by_budget(found):
        renamed = by_learner_setting(subset)
        for cell, groups in paired.per_task_accuracy(renamed, dataset).items():
            names = learner_order({name for group in groups for name in group})
            for learner, against, part in PAIRS:  # each setting of one beside each of the other
                for mine in (n for n in names if base_learner(n) == learner):
                    for theirs in (n for n in names if base_learner(n) == against):
                        differences = paired.shared_differences(groups, mine, theirs)
                        if differences is not None:
                            out.append([dataset, budget, cell, part, mine, theirs,
                                        *paired.difference_columns(differences)])
    return out
