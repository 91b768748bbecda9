"""The ``launch.report --reference`` tables (experiments.reference_report, reference_checks) on
hand-built rows and results: which cell a row is, the as-published rows beside Table 1,
references holding two settings of a learner cell, and the other-classes mark."""

import json
import os

import numpy as np

from cfsl_jax.experiments import paper_results, reference, reference_checks, reference_report
from cfsl_jax.experiments.cells import cell_of
from cfsl_jax.training.config import TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONS = {"class_split": "authors", "resize": "nearest"}


def row(learner, cell, acc, seed=0, preset="none", status="complete", **options):
    """A results.csv row (strings)."""
    return {"dataset": "omniglot/full_nearest", "budget": "8x50x8", "learner": learner,
            "cell": cell, "seed": str(seed), "status": status, "test_acc_mean": str(acc),
            "test_acc_ci95": "0.004", "val_acc_last": "", "val_acc_first": "",
            "training_tasks": "3200", "paper_budget": "False", "preset": preset,
            "options": json.dumps({**OPTIONS, **options}, sort_keys=True)}


def result(learner, task, seed, per_task, overrides=None, options=None):
    """A results.json as ``reference_report.load`` returns it (without ``_setting``: read from
    the config as the export writes it)."""
    config = TrainConfig(learner=learner, task=task, seed=seed, dataset_options=dict(OPTIONS),
                         spec_overrides=overrides or {},
                         learner_options=options or {}).to_json()
    per_task = np.asarray(per_task, np.float64)
    return {"dataset": "omniglot/full_nearest", "learner": learner, "seed": seed,
            "config": config, "task_fingerprint": "f" + task, "_budget": "8x50x8",
            "test": {"acc_mean": float(per_task.mean()), "acc_ci95": 0.01,
                     "per_task": {"acc": list(per_task)}}}


# ---- 1. a run whose spec overrides make another task is that task's cell -----------------------

C5_FROM_B3 = {"overwrite": True, "nss": 5}


def test_a_run_whose_overrides_make_another_task_is_filed_under_its_own_spec_name(tmp_path):
    """results.csv's cell is ``cells.cell_of``'s (as ``launch.report``): task B3 with
    --overwrite --nss=5 is a C5 task, never B3's row, and compared with no Table 1 cell."""
    config = TrainConfig(learner="protonets", task="B3", seed=0, spec_overrides=C5_FROM_B3)
    (tmp_path / "config.json").write_text(json.dumps(config.to_json()))
    (tmp_path / "val_history.json").write_text(json.dumps([{"epoch": 0, "val_acc": 0.5}]))
    partial = reference.run_row(str(tmp_path))  # no results.json: from its config.json
    name = cell_of({"config": config.to_json()})
    assert name.startswith("C5(") and partial["cell"] == name and partial["status"] == "partial"
    assert partial["run"].endswith("/protonets/B3/seed0")  # its folder keeps the config's task
    rows = [row("protonets", "B3", 0.9), row("protonets", name, 0.4, **C5_FROM_B3)]
    beside = {line[2]: line for line in reference_report.beside_table1(
        rows, paper_results.TABLE1)[1:]}
    b3 = paper_results.TABLE1["values"]["omniglot"]["protonets"]["B3"]
    assert beside["B3"][5:] == ["90.00", paper_results.printed(b3), f"{90 - b3['mean']:+.2f}"]
    assert beside[name][5:] == ["40.00", "-", "-"]
    (_, table), = reference_report.grid(rows, paper_results.TABLE1)
    assert table[0][3:] == ["B3 ours", "B3 Table 1", f"{name} ours", f"{name} Table 1"]
    assert table[1][3:] == ["90.00 ± 0.40", paper_results.printed(b3), "-", "-"]
    assert table[2][3:] == ["-", paper_results.printed(b3), "40.00 ± 0.40", "-"]
    # the checks group a result by cell_of too, and find its row
    found = [result("protonets", "B3", 0, [0.9, 0.9]),
             result("protonets", "B3", 0, [0.4, 0.4], C5_FROM_B3)]
    rows = [{**r, "val_acc_best": ""} for r in rows]
    assert sorted(line[3] for line in reference_checks.learns(rows, found)[1:]) == ["B3", name]


def test_every_committed_reference_row_is_filed_under_the_cell_of_its_run():
    """docs/reference/results.csv as committed: no row is mis-filed (regenerating it leaves
    its cell column, and table.md, unchanged)."""
    out = os.path.join(REPO, "docs", "reference")
    rows = reference.read_rows(os.path.join(out, "results.csv"))
    assert rows
    for line in rows:
        config = json.load(open(os.path.join(out, line["run"], "config.json")))
        path = os.path.join(out, line["run"], "results.json")
        found = json.load(open(path)) if os.path.exists(path) else {"config": config}
        assert line["cell"] == cell_of(found), line["run"]
