"""What the reference rows say of each learner (experiments.reference_checks), on hand-built
rows and results with known numbers."""

import numpy as np
import pytest

from cfsl_jax.experiments import reference_checks
from cfsl_jax.training.config import TrainConfig


def result(learner, cell, seed, acc, ci95=0.01, budget="8x50x8", per_task=None):
    """A results.json as ``reference_report.load`` returns it."""
    config = TrainConfig(learner=learner, task=cell, seed=seed).to_json()
    test = {"acc_mean": acc, "acc_ci95": ci95}
    if per_task is not None:
        test["per_task"] = {"acc": list(per_task)}
    return {"dataset": "omniglot/full_nearest", "learner": learner, "seed": seed,
            "config": config, "test": test, "task_fingerprint": "f" + cell, "_budget": budget}


def row(learner, cell, seed, first="", best="", last="", budget="8x50x8"):
    """A results.csv row (strings)."""
    return {"dataset": "omniglot/full_nearest", "budget": budget, "learner": learner,
            "cell": cell, "seed": str(seed), "status": "complete", "val_acc_first": first,
            "val_acc_best": best, "val_acc_last": last}


@pytest.mark.parametrize("acc, ci95, val, expected", [
    (20.0, 1.0, None, "learns"),                 # 12.3 points above chance at the CI's low end
    (12.0, 0.4, None, "does not learn: test within 5 points of chance"),  # 4.9 above
    (12.2, 0.4, (10.0, 11.0), "learns"),         # 5.1 above, validation rose
    (50.0, 1.0, (30.0, 30.0), "does not learn: validation did not rise"),
    (7.0, 1.0, (30.0, 29.0),
     "does not learn: test within 5 points of chance; validation did not rise"),
])
def test_a_learner_learns_when_clearly_above_chance_and_its_validation_rose(acc, ci95, val,
                                                                             expected):
    assert reference_checks.verdict(acc, ci95, 100 / 15, val) == expected


def test_learns_averages_seeds_reads_chance_from_the_cell_and_the_lowest_seeds_curve():
    found = [result("protonets", "B3", 1, 0.90, 0.004), result("protonets", "B3", 0, 0.80, 0.006),
             result("init_tune", "A3", 0, 0.22, 0.01), result("pretrain_tune", "A3", 0, 0.5)]
    rows = [row("protonets", "B3", 1, "0.5", "0.9", "0.9"),
            row("protonets", "B3", 0, "0.4", "0.85", "0.8"), row("init_tune", "A3", 0),
            row("pretrain_tune", "A3", 0)]  # e.g. pretrained on uniform images: no curve
    table = reference_checks.learns(rows, found)
    assert table[0][4:] == ["test (%)", "chance (%)", "validation first -> best -> last (%)",
                            "verdict"]
    # B3: 15 output classes; A3: 5; Init+Tune trains nothing and is 1 point above chance
    assert table[1][2:] == ["protonets", "B3", "85.00 ± 0.50", "6.7", "40.0 -> 85.0 -> 80.0",
                            "learns"]
    assert table[2][2:] == ["init_tune", "A3", "22.00 ± 1.00", "20.0", "trains nothing",
                            "does not learn: test within 5 points of chance"]
    assert table[3][2:] == ["pretrain_tune", "A3", "50.00 ± 1.00", "20.0",
                            "no validation curve", "learns"]


def test_components_pair_learners_that_differ_in_one_part_on_the_same_tasks():
    tune = np.array([0.2, 0.4, 0.6, 0.8])
    pretrained = tune + np.array([0.1, 0.2, 0.1, 0.2])  # +15 points on average
    found = [result("init_tune", "A3", 0, tune.mean(), per_task=tune),
             result("pretrain_tune", "A3", 0, pretrained.mean(), per_task=pretrained),
             # another budget: never paired with the 8x50x8 runs
             result("ewc_init", "A3", 0, 0.5, per_task=tune, budget="paper")]
    table = reference_checks.components(found)
    assert len(table) == 2
    difference = pretrained - tune
    ci = 3.182 * difference.std(ddof=1) / np.sqrt(difference.size)  # t(0.975, 3)
    assert table[1] == ["omniglot/full_nearest", "8x50x8", "A3", "pretraining", "pretrain_tune",
                        "init_tune", "+15.00", f"±{100 * ci:.2f}", "4"]


def test_runs_of_another_preset_are_neither_averaged_nor_paired_with_the_default_ones():
    """learns averages a cell's seeds within one setting (preset and options but the rounding
    ones), components pairs learners within one preset; the budget column names the setting
    where a learner's rows (a budget's pairs) differ in it."""
    tune = np.array([0.2, 0.4, 0.6, 0.8])
    default, published = ("none", "{}"), ("apr2020", '{"draws": "per_group"}')
    found = [{**result("init_tune", "A3", 0, tune.mean(), per_task=tune), "_setting": default},
             {**result("init_tune", "A3", 1, 0.9, per_task=tune + 0.1), "_setting": published},
             {**result("pretrain_tune", "A3", 0, 0.6, per_task=tune + 0.2),
              "_setting": published}]
    found[1]["config"]["spec_overrides"] = found[2]["config"]["spec_overrides"] = {
        "draws": "per_group"}
    rows = [{**row("init_tune", "A3", 0), "preset": "none", "options": "{}"},
            {**row("init_tune", "A3", 1), "preset": "apr2020",
             "options": '{"conv": "xla", "draws": "per_group"}'},  # conv: rounding only
            {**row("pretrain_tune", "A3", 0, "0.3", "0.6", "0.6"), "preset": "apr2020",
             "options": '{"draws": "per_group"}'}]
    table = reference_checks.learns(rows, found)
    assert [line[1:5] for line in table[1:]] == [
        ["8x50x8 [as_published=apr2020]", "init_tune", "A3", "90.00 ± 1.00"],
        ["8x50x8", "pretrain_tune", "A3", "60.00 ± 1.00"],  # one setting: no label
        ["8x50x8 [as_published=none]", "init_tune", "A3", "50.00 ± 1.00"]]
    assert table[2][6] == "30.0 -> 60.0 -> 60.0"  # its own row's curve
    # pretraining's effect: within apr2020 only (+10 points), never against the default run
    pairs = reference_checks.components(found)
    assert [line[1:7] for line in pairs[1:]] == [
        ["8x50x8 [as_published=apr2020]", "A3", "pretraining", "pretrain_tune", "init_tune",
         "+10.00"]]
