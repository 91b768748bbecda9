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

B7_FROM_B3 = {"nss": 7}  # a task outside the paper's grid


def test_a_run_whose_overrides_make_another_task_is_filed_under_its_own_spec_name(tmp_path):
    """results.csv's cell is ``cells.cell_of``'s (as ``launch.report``): task B3 with --nss=7
    is another task, never B3's row: its own spec name, compared with no Table 1 cell."""
    config = TrainConfig(learner="protonets", task="B3", seed=0, spec_overrides=B7_FROM_B3)
    (tmp_path / "config.json").write_text(json.dumps(config.to_json()))
    (tmp_path / "val_history.json").write_text(json.dumps([{"epoch": 0, "val_acc": 0.5}]))
    partial = reference.run_row(str(tmp_path))  # no results.json: from its config.json
    name = cell_of({"config": config.to_json()})
    assert name.startswith("B7(") and partial["cell"] == name and partial["status"] == "partial"
    # its folder keeps the config's task, and names its overrides (reference_folders)
    assert partial["run"].endswith("/protonets/B3/seed0-nss=7")
    rows = [row("protonets", "B3", 0.9), row("protonets", name, 0.4, **B7_FROM_B3)]
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
             result("protonets", "B3", 0, [0.4, 0.4], B7_FROM_B3)]
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


# ---- 2. an --as_published row reproduces the paper-era behaviour on purpose ---------------------

FEB = {"draws": "independent", "label_offset": "per_support_set",
       "target_mode": "per_support_set"}
APR = {**FEB, "draws": "per_group"}


def test_an_as_published_row_of_a_paper_era_cell_shows_its_difference_and_what_it_leaves_out():
    """Beside Table 1 and in the grid, a row trained under the preset whose options model the
    cell's paper-era behaviour is compared with Table 1 (no note in its place, no `*`); one
    that reproduces part of it says what it leaves out (and keeps the `*`)."""
    rows = [row("protonets", "C3", 0.5),  # the specification's: the paper-era note
            row("protonets", "C3", 0.46, preset="feb2020", last_sample_prototype=True, **FEB),
            row("maml_low", "D4", 0.27, preset="apr2020", restart_each_support_set=True,
                **APR),
            row("ewc_init", "C3", 0.3, preset="feb2020", **FEB),  # no preset re-copies EWC
            row("protonets", "D4", 0.49, preset="feb2020", last_sample_prototype=True, **FEB)]
    values = paper_results.TABLE1["values"]["omniglot"]
    beside = {(line[1], line[2], line[3]): line[-1]
              for line in reference_report.beside_table1(rows, paper_results.TABLE1)[1:]}
    assert beside[("protonets", "C3", "8x50x8 [as_published=none] (3,200)")].startswith("paper-era cell: ")
    assert beside[("protonets", "C3", "8x50x8 [as_published=feb2020] (3,200)")] == (
        f"{46 - values['protonets']['C3']['mean']:+.2f} (as published: feb2020 reproduces this "
        f"paper-era cell)")
    assert beside[("maml_low", "D4", "8x50x8 (3,200)")] == (
        f"{27 - values['maml_low']['D4']['mean']:+.2f} (as published: apr2020 reproduces this "
        f"paper-era cell)")
    assert beside[("ewc_init", "C3", "8x50x8 (3,200)")] == (
        f"{30 - values['ewc_init']['C3']['mean']:+.2f} (as published, feb2020, in part: not the "
        f"re-copy of the weights at every support set "
        f"(--learner_option=restart_each_support_set=True))")
    assert beside[("protonets", "D4", "8x50x8 [as_published=feb2020] (3,200)")].endswith(
        "(as published, feb2020, in part: Table 1's D cells came from the apr2020 code)")
    (_, table), = reference_report.grid(rows, paper_results.TABLE1)
    entries = {(line[0], line[1]): dict(zip(table[0], line)) for line in table[1:]}
    printed = {(learner, cell): paper_results.printed(values[learner][cell])
               for learner, cell in (("protonets", "C3"), ("maml_low", "D4"),
                                     ("ewc_init", "C3"), ("protonets", "D4"))}
    proto_none = entries[("protonets", "8x50x8 [as_published=none]")]
    proto_feb = entries[("protonets", "8x50x8 [as_published=feb2020]")]
    assert proto_none["C3 Table 1"] == printed[("protonets", "C3")] + "*"
    assert proto_feb["C3 Table 1"] == printed[("protonets", "C3")]  # reproduced: no *
    assert proto_feb["D4 Table 1"] == printed[("protonets", "D4")] + "*"  # only in part
    assert entries[("maml_low", "8x50x8")]["D4 Table 1"] == printed[("maml_low", "D4")]
    assert entries[("ewc_init", "8x50x8")]["C3 Table 1"] == printed[("ewc_init", "C3")] + "*"
    assert "`--as_published` row" in reference_report.GRID_NOTE


# ---- 3. a reference holding two settings of a learner cell ---------------------------------------


def fake_run(sweep_dir, learner, seed, per_task, options=None, task="A3", **config_fields):
    """A finished run's folder (config.json, val_history.json, results.json) as training
    writes them, with the given per-task test accuracy; its config (a dict)."""
    config = TrainConfig(learner=learner, task=task, seed=seed, epochs=2, iters_per_epoch=3,
                         meta_batch=2, test_tasks=len(per_task), learner_options=options or {},
                         **config_fields).to_json()
    folder = sweep_dir / f"{learner}_{task}_{seed}"
    folder.mkdir(parents=True)
    acc = np.asarray(per_task, np.float64)
    result = {"dataset": "omniglot/full_nearest", "learner": learner, "seed": seed,
              "config": config, "task_fingerprint": "f" + task, "backend": "cpu",
              "devices": 1, "wall_seconds": 1.0,
              "test": {"acc_mean": float(acc.mean()), "acc_std": float(acc.std()),
                       "acc_ci95": 0.01, "ce_mean": 1.0, "per_task": {"acc": list(acc)}}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "val_history.json").write_text(json.dumps([{"epoch": 0, "val_acc": 0.3},
                                                         {"epoch": 1, "val_acc": 0.4}]))
    (folder / "results.json").write_text(json.dumps(result))
    return config


def test_a_reference_with_two_settings_of_a_learner_cell_pairs_each_setting_on_its_own(tmp_path):
    """Runs of one learner and cell with other learner options share a budget group (one
    preset, dataset options, spec overrides): the paired differences and "what each part
    adds" keep the settings apart, named by their options, instead of refusing the reference
    (paired.per_task_accuracy's same-experiment check)."""
    tune = np.array([0.2, 0.4, 0.6, 0.8])
    sweep = tmp_path / "sweep"
    fake_run(sweep, "init_tune", 0, tune)
    fake_run(sweep, "init_tune", 1, tune + 0.1, {"inner_steps": 1})
    fake_run(sweep, "pretrain_tune", 0, tune + 0.2)
    reference.export(str(sweep), str(tmp_path / "ref"))
    rows, found = reference_report.load(str(tmp_path / "ref"))
    parts = reference_checks.components(found)
    assert [line[4:7] for line in parts[1:]] == [
        ["pretrain_tune", "init_tune [inner_steps unset]", "+20.00"],
        ["pretrain_tune", "init_tune [inner_steps=1]", "+10.00"]]
    pairs = reference_report.paired(found)
    assert [line[3:6] for line in pairs[1:]] == [
        ["init_tune [inner_steps unset]", "pretrain_tune", "-20.00"],
        ["init_tune [inner_steps=1]", "pretrain_tune", "-10.00"]]
    paths = reference_report.write(str(tmp_path / "ref"), str(tmp_path / "out"))
    assert "| init_tune [inner_steps=1] | pretrain_tune | -10.00 |" in open(
        paths["markdown"]).read()


# ---- 4. smaller defects ----------------------------------------------------------------------


def test_your_runs_beside_a_reference_with_two_settings_name_each_reference_setting(tmp_path):
    """beside_yours: one of your runs beside both reference runs of its cell (your seed is in
    neither, so every seed): the reference budget names each one's setting."""
    tune = np.array([0.2, 0.4, 0.6, 0.8])
    sweep = tmp_path / "sweep"
    fake_run(sweep, "init_tune", 0, tune)
    fake_run(sweep, "init_tune", 1, tune + 0.1, {"inner_steps": 1})
    reference.export(str(sweep), str(tmp_path / "ref"))
    _, found = reference_report.load(str(tmp_path / "ref"))
    mine = {k: v for k, v in found[0].items() if not k.startswith("_")}
    mine = {**mine, "seed": 5, "config": {**mine["config"], "seed": 5}}
    rows = reference_report.beside_yours(found, [mine])
    assert [line[6:] for line in rows[1:]] == [
        ["2x3x2 [inner_steps unset] seed 0", "+0.00 ± 0.00 (4)"],
        ["2x3x2 [inner_steps=1] seed 1", "-10.00 ± 0.00 (4)"]]
    # one setting: the budget alone, as before
    assert reference_report.beside_yours(found[:1], [mine])[1][6] == "2x3x2 seed 0"


def test_figure3_draws_the_paper_shape_only_and_a_lone_other_shape_under_its_name(monkeypatch):
    """A run of another shape (B3's config with --nc=3) is never drawn on a learner's line of
    the paper's cells; a sweep of one other shape alone (a small test sweep) is drawn, its
    shape in the title."""
    import dataclasses

    from cfsl_jax.experiments import figures, report
    from cfsl_jax.protocol.spec import TaskSpec
    drawn = []
    monkeypatch.setattr(figures.plotting, "save", lambda figure, path: drawn.append(figure) or path)

    def found(cell, acc, **overrides):
        spec = dataclasses.asdict(TaskSpec.preset(cell[0], nss=int(cell[1:]), **overrides))
        return report.Aggregate(acc, 0.0, (acc,), (0,), spec)
    accuracy = {("d", "protonets", "B3"): found("B3", 0.9), ("d", "protonets", "B5"):
                found("B5", 0.8), ("d", "protonets", "C5"): found("C5", 0.5),
                ("d", "protonets", "B4(nc=3)"): found("B4", 0.99, nc=3)}
    assert figures.plot_accuracy_vs_nss(accuracy, "f.png") == "f.png"
    b_panel, c_panel = drawn[-1].axes
    assert [list(c.lines[0].get_xdata()) for c in b_panel.containers] == [[3, 5]]
    assert [list(c.lines[0].get_ydata()) for c in b_panel.containers] == [[90.0, 80.0]]
    assert [list(c.lines[0].get_xdata()) for c in c_panel.containers] == [[5]]
    small = {("d", "protonets", "B2(nc=3)"): found("B2", 0.7, nc=3, kt=2)}
    assert figures.plot_accuracy_vs_nss(small, "g.png", title="T") == "g.png"
    assert drawn[-1]._suptitle.get_text().startswith("T (NC=3, KS=1, KT=2)")
    assert figures.figure3_shape([small[("d", "protonets", "B2(nc=3)")].spec,
                                  accuracy[("d", "protonets", "B4(nc=3)")].spec]) is None


def test_a_reference_row_on_other_omniglot_classes_than_table1s_is_marked():
    """The † of launch.report: beside Table 1 on the difference, in the grid on Table 1's
    number, for a row on full Omniglot with a class split other than the authors'."""
    rows = [row("protonets", "B3", 0.9), row("protonets", "B3", 0.8, class_split="ordered")]
    b3 = paper_results.TABLE1["values"]["omniglot"]["protonets"]["B3"]
    beside = [line[-1] for line in reference_report.beside_table1(rows, paper_results.TABLE1)[1:]]
    assert beside == [f"{90 - b3['mean']:+.2f}", f"{80 - b3['mean']:+.2f} †"]
    (_, table), = reference_report.grid(rows, paper_results.TABLE1)
    assert [line[4] for line in table[1:]] == [paper_results.printed(b3),
                                               paper_results.printed(b3) + "†"]
    assert "`†`" in reference_report.GRID_NOTE


def test_a_hand_made_record_without_spec_is_reported_from_its_config(tmp_path):
    """report.aggregate and the D-cell note read the TaskSpec from the config where
    results.json has no ``spec`` (a hand-made or older record); it raised KeyError."""
    from cfsl_jax.experiments import report
    for seed, (task, overrides) in enumerate((("B3", {}), ("D4", {}), ("B3", {"nss": 7}))):
        config = TrainConfig(dataset="omniglot/full", learner="protonets", task=task, seed=seed,
                             spec_overrides=overrides).to_json()
        (tmp_path / "sweep" / str(seed)).mkdir(parents=True)
        (tmp_path / "sweep" / str(seed) / "results.json").write_text(json.dumps(
            {"dataset": "omniglot/full", "learner": "protonets", "seed": seed,
             "config": config, "test": {"acc_mean": 0.5, "ce_mean": 0.5, "atm": 0.1,
                                        "macs_per_task": 1e6}}))
    results = report.load_results(str(tmp_path / "sweep"))
    accuracy = report.aggregate(results, "acc")
    assert {key[2]: found.spec["nss"] for key, found in accuracy.items()} == {
        "B3": 3, "D4": 4, "B7(cci=1,nc=5,ks=1,kt=5,per_class)": 7}
    paths = report.write_report(str(tmp_path / "sweep"), str(tmp_path / "report"))
    text = open(paths["markdown"]["omniglot/full"]).read()
    assert "Table 1's D cells come from code that labelled each support set" in text


def test_a_row_out_of_step_with_its_copied_results_is_refused_naming_both(tmp_path):
    """An export killed after copying a run's new files but before writing results.csv leaves
    the row of the run's earlier export beside its new results.json: the tables refuse them in
    one line (a number never shown from the wrong file), and exporting again brings them in step."""
    import pytest
    from cfsl_jax.runtime import checksums
    from cfsl_jax.runtime.errors import UserError
    sweep = tmp_path / "sweep"
    fake_run(sweep, "init_tune", 0, [0.2, 0.4, 0.6, 0.8])
    reference.export(str(sweep), str(tmp_path / "ref"))
    run = reference.read_rows(str(tmp_path / "ref" / "results.csv"))[0]["run"]
    copied = str(tmp_path / "ref" / run / "results.json")
    newer = {**json.load(open(copied))}
    newer["test"] = {**newer["test"], "acc_mean": 0.55}  # the run tested again, say
    checksums.write_text(copied, json.dumps(newer))  # copied, then the export was killed
    with pytest.raises(UserError) as refused:
        reference_report.load(str(tmp_path / "ref"))
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'ref' / 'results.csv'}: the row of {run} is not "
                              f"its {copied} (test_acc_mean: row '0.5', results.json 0.55)")
    assert "\n" not in message and "export the sweep again" in message
    (sweep / "init_tune_A3_0" / "results.json").write_text(json.dumps(newer))
    reference.export(str(sweep), str(tmp_path / "ref"))
    rows, found = reference_report.load(str(tmp_path / "ref"))
    assert rows[0]["test_acc_mean"] == "0.55" and found[0]["test"]["acc_mean"] == 0.55
