"""Reference results as data (experiments.reference), their report (experiments.reference_report,
launch.report --reference) and the closed form of Table 1's paper-era cells (experiments.paper_era).

The fixture sweep is the tiny synthetic config of tests/test_sweep_report.py: ProtoNets (seeds 0
and 1) and Init+Tune on B2, and ProtoNets on C2, trained in this process; the C2 run is left
partial: stopped in its second epoch, as a sweep stopped mid-run leaves it.
"""

import csv
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cfsl_jax.experiments import paper_era, paper_results, reference, reference_report, sweep_plan
from cfsl_jax.experiments.cells import cell_of
from cfsl_jax.experiments.verify import reference_row_differences
from cfsl_jax.protocol.metrics import t975
from cfsl_jax.runtime import checksums
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import as_published, loop, train
from cfsl_jax.training.config import TrainConfig
from conftest import TINY_SWEEP, TINY_SWEEP_LEARNER_OPTIONS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = (("protonets", "B2", 0), ("protonets", "B2", 1), ("init_tune", "B2", 0),
        ("protonets", "C2", 0))


@pytest.fixture(scope="module")
def fixture_sweep(tmp_path_factory):
    """(sweep folder, {(learner, cell, seed): results.json dict}) with C2 left partial."""
    sweep_dir = str(tmp_path_factory.mktemp("reference_sweep"))
    found = {}
    for learner, cell, seed in RUNS:
        options = {**TINY_SWEEP["learner_options"], **TINY_SWEEP_LEARNER_OPTIONS.get(learner, {})}
        config = TrainConfig(**{**TINY_SWEEP, "learner_options": options}, learner=learner,
                             task=cell, seed=seed)
        workdir = sweep_plan.run_dir(sweep_dir, config)
        if cell == "C2":  # partial: stopped in epoch 1, after epoch 0 was validated
            with pytest.raises(loop.Interrupted):
                train.train_and_evaluate(config, workdir, stop_after_steps=4)
            continue
        found[(learner, cell, seed)] = train.train_and_evaluate(config, workdir)
    with open(os.path.join(sweep_dir, "provenance.jsonl"), "w") as log:
        log.write(json.dumps({"start": "2000-01-01T00:00:00Z", "commit": "abc123",
                              "flagfile": "f", "learners": "protonets,init_tune",
                              "cell": "B2", "seeds": "0,1"}) + "\n")
    return sweep_dir, found


def test_export_writes_a_row_per_run_with_the_numbers_of_its_results(fixture_sweep, tmp_path):
    sweep_dir, found = fixture_sweep
    rows = reference.export(sweep_dir, str(tmp_path))
    # the tiny sweep's nc=3, kt=2 make other tasks than B2 and C2: filed under their spec names
    # (cells.cell_of, as launch.report), the partial run's read from its config.json
    b2, c2 = "B2(cci=1,nc=3,ks=1,kt=2,per_class)", "C2(cci=1,nc=3,ks=1,kt=2,overwrite,per_class)"
    assert [(r["learner"], r["cell"], r["seed"], r["status"]) for r in rows] == [
        ("protonets", b2, 0, "complete"), ("protonets", b2, 1, "complete"),
        ("init_tune", b2, 0, "complete"), ("protonets", c2, 0, "partial")]
    written = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert list(written[0]) == list(reference.COLUMNS)
    for row in written[:3]:
        result = found[(row["learner"], "B2", int(row["seed"]))]
        assert float(row["test_acc_mean"]) == result["test"]["acc_mean"]  # every digit
        assert float(row["test_ce_mean"]) == result["test"]["ce_mean"]
        assert row["task_fingerprint"] == result["task_fingerprint"]
        assert row["commit"] == "abc123" and row["device"] == f"cpu x{result['devices']}"
        assert row["budget"] == "2x3x2" and row["paper_budget"] == "False"
        copied = json.load(open(tmp_path / row["run"] / "results.json"))
        assert copied == result and reference.row_differences(row, result) == []
        assert not os.path.exists(tmp_path / row["run"] / "checkpoints")
        # the copies carry their checksums (read back checked, without a 'before checksums' note)
        copied_names = sorted(set(os.listdir(tmp_path / row["run"])) & set(reference.RUN_FILES))
        assert "results.json" in copied_names
        assert checksums.recorded(str(tmp_path / row["run"])) == copied_names
    # 2 epochs x 3 steps x 2 tasks; Init+Tune trains nothing; the partial run: its 1 epoch done
    assert [row["training_tasks"] for row in written] == ["12", "12", "0", "6"]
    assert [row["preset"] for row in written] == ["none"] * 4  # the specification's defaults
    # the grid at a glance, generated from the CSV as written
    path = reference_report.write_table(str(tmp_path))
    text = open(path, encoding="utf-8").read()
    assert text == reference_report.table_file_text(*reference_report.load(str(tmp_path)))
    assert text.startswith(reference_report.table_file_text(written).rstrip("\n"))
    assert "## Does every learner learn?" in text and f"| init_tune | {b2} |" in text
    assert "| protonets | 2x3x2 | 12 |" in open(path, encoding="utf-8").read()
    partial = written[3]
    assert partial["test_acc_mean"] == "" and partial["commit"] == "unknown"  # not a B2 run
    history = json.load(open(tmp_path / partial["run"] / "val_history.json"))
    assert float(partial["val_acc_last"]) == history[-1]["val_acc"]
    # every row of a cell shares the test tasks (evaluation seed 0)
    assert len({row["task_fingerprint"] for row in written[:3]}) == 1


def test_export_refuses_a_run_file_that_fails_its_checksum(fixture_sweep, tmp_path):
    sweep_dir, _ = fixture_sweep
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy, ignore=shutil.ignore_patterns("checkpoints"))
    damaged = sorted(copy.rglob("results.json"))[-1]  # not the first run exported
    damaged.write_text(damaged.read_text().replace('"acc_mean": 0.', '"acc_mean": 1.', 1))
    with pytest.raises(checksums.Corrupt, match="fails its checksum") as caught:
        reference.export(str(copy), str(tmp_path / "out"))
    assert caught.value.path == str(damaged)
    assert not (tmp_path / "out").exists()  # nothing written, not even the runs before it


def test_a_row_that_differs_from_the_run_is_named_and_reexport_keeps_other_rows(
        fixture_sweep, tmp_path):
    sweep_dir, found = fixture_sweep
    reference.export(sweep_dir, str(tmp_path))
    csv_path = str(tmp_path / "results.csv")
    workdir = os.path.join(sweep_dir, "synthetic", "protonets", "B2", "seed0")
    assert reference_row_differences(workdir, csv_path) == []
    # another CSV (the run's own results.csv, a binary file) is refused in one line, no row read
    not_one = (f"{workdir}/results.csv is not a reference results.csv (written by benchmarks."
               f"reference.export): it has no column cell, budget, paper_budget, status, ...")
    with pytest.raises(UserError, match=re.escape(not_one)):
        reference_row_differences(workdir, os.path.join(workdir, "results.csv"))
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00learner")
    with pytest.raises(UserError, match="binary.csv is not a reference results.csv .'utf-8' "):
        reference.read_rows(str(tmp_path / "binary.csv"))
    rows = reference.read_rows(csv_path)
    other = {**rows[0], "budget": "paper", "run": "runs/paper/x", "test_acc_mean": "0.5"}
    rows[0] = {**rows[0], "test_acc_mean": "0.25"}
    with open(csv_path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=reference.COLUMNS)
        writer.writeheader()
        writer.writerows([*rows, other])
    assert reference_row_differences(workdir, csv_path) == [
        f"{csv_path} test_acc_mean: row '0.25', results.json "
        f"{found[('protonets', 'B2', 0)]['test']['acc_mean']!r}"]
    again = reference.export(sweep_dir, str(tmp_path))  # replaces this sweep's rows only
    assert [row["budget"] for row in again].count("paper") == 1
    assert reference_row_differences(workdir, csv_path) == []
    # a CSV written before the preset column: a kept row gets it from its run's config.json
    assert {row["preset"] for row in again} == {"none"}
    feb = as_published.apply(TrainConfig(learner="protonets", task="B2"), "feb2020")
    os.makedirs(tmp_path / "runs" / "paper" / "x")
    checksums.write_text(str(tmp_path / "runs" / "paper" / "x" / "config.json"),
                         json.dumps(feb.to_json()))
    rows = reference.read_rows(csv_path)
    with open(csv_path, "w", newline="") as out:
        old_columns = [c for c in reference.COLUMNS if c != "preset"]
        writer = csv.DictWriter(out, fieldnames=old_columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    assert "preset" not in reference.read_rows(csv_path)[0]
    kept = [row for row in reference.export(sweep_dir, str(tmp_path)) if row["budget"] == "paper"]
    assert [row["preset"] for row in kept] == ["feb2020"]
    assert list(reference.read_rows(csv_path)[0]) == list(reference.COLUMNS)


def test_reference_report_pairs_learners_and_your_runs_on_the_same_tasks(fixture_sweep,
                                                                          tmp_path):
    sweep_dir, found = fixture_sweep
    reference.export(sweep_dir, str(tmp_path / "ref"))
    paths = reference_report.write(str(tmp_path / "ref"), str(tmp_path / "out"), sweep_dir)
    text = open(paths["markdown"]).read()
    proto = np.mean([found[("protonets", "B2", s)]["test"]["per_task"]["acc"] for s in (0, 1)],
                    axis=0)
    tune = np.asarray(found[("init_tune", "B2", 0)]["test"]["per_task"]["acc"])
    best, other = (proto, tune) if proto.mean() >= tune.mean() else (tune, proto)
    difference = other - best
    # Student's t over the tasks, the sample std (ddof=1)
    ci = t975(difference.size - 1) * difference.std(ddof=1) / np.sqrt(difference.size)
    assert f"| {100 * difference.mean():+.2f} | ±{100 * ci:.2f} | {difference.size} |" in text
    # protonets B2 beside Table 1 (no B2 cell there): mean ± std over its two seeds
    accs = [found[("protonets", "B2", s)]["test"]["acc_mean"] for s in (0, 1)]
    assert f"| {100 * np.mean(accs):.2f} ± {100 * np.std(accs, ddof=1):.2f} |" in text
    # a run of the user's sweep against the same run in the reference: paired difference 0
    assert "| +0.00 ± 0.00 (4) |" in text
    assert os.path.getsize(paths["figure"]) > 1000


def test_paper_era_cells_follow_only_the_last_support_set_counts():
    # ProtoNets C cells: p/NSS + (1 - 1/NSS)/NC with p = A3/A5/A10 (98.73, 98.73, 98.65)
    assert paper_era.predicted("protonets", "C3") == pytest.approx(100 * (0.9873 / 3 + 2 / 15))
    assert [round(paper_era.predicted("protonets", c), 2) for c in ("C3", "C5", "C10")] == [
        46.24, 35.75, 27.87]
    # MAML++ L D cells: p/NSS + (1 - CCI/NSS)/(NSS*NC), p = A3 (99.38), A5 (99.41)
    assert paper_era.predicted("maml_low", "D4") == pytest.approx(
        100 * (0.9938 / 4 + 0.5 / 20))
    assert [round(paper_era.predicted("maml_low", c), 2) for c in ("D4", "D8")] == [
        27.34, 14.30]
    assert paper_era.predicted("maml_low", "B3") == pytest.approx(100 * (0.9938 / 3 + 2 / 45))
    assert paper_era.note("protonets", "B3") is None and paper_era.predicted("sca", "C3") is None
    assert "last support" in paper_era.note("maml_low", "D8")
    # a learner that carries its state on a D cell: the 1/CCI cap, p/CCI (ProtoNets A3 98.73)
    assert paper_era.predicted("protonets", "D4") == pytest.approx(98.73 / 2)
    assert "1/CCI" in paper_era.note("sca", "D8") and paper_era.note("sca", "B3") is None
    # the fine-tuners re-copied their weights too: C cells by the formula (Init+Tune A3 44.76),
    # A cells are the authors' one-support-set result (43.0), B and D have no closed form
    assert paper_era.predicted("init_tune", "C3") == pytest.approx(100 * (0.4476 / 3 + 2 / 15))
    assert paper_era.predicted("ewc_pretrain", "C10") == pytest.approx(30.14 / 10 + 18)
    assert [paper_era.predicted("init_tune", c) for c in ("A3", "A10")] == [43.0, 43.0]
    assert paper_era.predicted("pretrain_tune", "A5") == 33.1
    assert paper_era.predicted("ewc_init", "A3") is None  # no EWC row in the authors' file
    assert {paper_era.predicted("init_tune", c) for c in ("B3", "D4", "D8")} == {None}
    assert "one-support-set" in paper_era.note("pretrain_tune", "A3")
    assert "no commit holds EWC code" in paper_era.note("ewc_init", "D4")
    assert {row[0] for row in paper_era.table()[1:]} == {
        "protonets", "maml_low", "maml_high", "sca", "init_tune", "pretrain_tune", "ewc_init",
        "ewc_pretrain"}
    # the pretrained learners' note: solved for the last set's accuracy p, Table 1's C cells
    # imply 38.7-43.0 %, 7-11 points above their A cells (30-33); the init learners' agree
    values = paper_results.TABLE1["values"]["omniglot"]
    for learner in paper_era.FINE_TUNERS:
        gaps = [nss * (values[learner][f"C{nss}"]["mean"] - 100 * (1 - 1 / nss) / 5)
                - values[learner][f"A{nss}"]["mean"] for nss in (3, 5, 10)]
        pretrained = learner.endswith("pretrain") or learner == "pretrain_tune"
        assert all(7 <= gap <= 11 for gap in gaps) if pretrained else \
            all(abs(gap) < 4.1 for gap in gaps), (learner, gaps)
        assert ("7-11 points below" in paper_era.note(learner, "A3")) == pretrained


def test_reference_beside_table1_shows_the_difference_or_the_paper_era_note():
    def row(learner, cell, acc):
        return {"dataset": "omniglot/full", "budget": "cpu", "learner": learner, "cell": cell,
                "seed": "0", "status": "complete", "test_acc_mean": str(acc),
                "val_acc_last": "", "training_tasks": "3200"}
    rows = [row("sca", "B3", 0.9), row("protonets", "C3", 0.5), row("init_tune", "B3", 0.2)]
    table = {(r[1], r[2]): r[-1] for r in reference_report.beside_table1(
        rows, paper_results.TABLE1)[1:]}
    sca_b3 = paper_results.TABLE1["values"]["omniglot"]["sca"]["B3"]["mean"]
    assert table[("sca", "B3")] == f"{90 - sca_b3:+.2f}"
    assert table[("protonets", "C3")].startswith("paper-era cell: ProtoNets' paper-era prototype")
    assert "that alone predicts 46.24" in table[("protonets", "C3")]
    assert table[("init_tune", "B3")] == (
        f"paper-era cell: {paper_era.note('init_tune', 'B3')}; its closed form needs a number "
        "Table 1 does not give, so no difference is shown")
    # a dataset Table 1 does not have, compared with one's own numbers: the note, no prediction
    theirs = {"source": "mine", "values": {"synthetic": {"protonets": {"C3": {
        "mean": 50.0, "std": 1.0}}}}}
    mine = [{**row("protonets", "C3", 0.5), "dataset": "synthetic"}]
    assert reference_report.beside_table1(mine, theirs)[1][-1].endswith(
        "its closed form needs a number Table 1 does not give, so no difference is shown")
    assert paper_era.predicted("protonets", "C3", "synthetic") is None
    assert paper_era.predicted("protonets", "C3", "slimagenet64") is not None


def test_the_grid_puts_each_learner_and_cell_beside_table1_with_seeds_and_partial_runs():
    def row(learner, cell, acc, seed=0, budget="8x50x8", status="complete"):
        return {"dataset": "omniglot/full_nearest", "budget": budget, "learner": learner,
                "cell": cell, "seed": str(seed), "status": status, "test_acc_mean": str(acc),
                "test_acc_ci95": "0.004", "val_acc_last": "", "training_tasks": "3200",
                "paper_budget": str(budget == "paper")}
    rows = [row("sca", "B3", 0.9, budget="4x25x8"), row("protonets", "C3", 0.5),
            row("protonets", "B3", 0.97, 0, "paper"), row("protonets", "B3", 0.96, 1, "paper"),
            row("protonets", "B3", 0.92), row("maml_low", "B3", "", status="partial"),
            row("protonets", "B3", "", seed=1, status="partial")]
    (title, table), (paper_title, paper_table) = reference_report.grid(rows,
                                                                       paper_results.TABLE1)
    assert title == "omniglot/full_nearest, reduced budgets"
    assert paper_title == "omniglot/full_nearest, the paper's budget"
    assert table[0] == ["learner", "budget", "training tasks", "B3 ours", "B3 Table 1",
                        "C3 ours", "C3 Table 1"]
    values = paper_results.TABLE1["values"]["omniglot"]
    assert table[1] == ["protonets", "8x50x8", "3,200", "92.00 ± 0.40 (+1 partial)",
                        paper_results.printed(values["protonets"]["B3"]), "50.00 ± 0.40",
                        paper_results.printed(values["protonets"]["C3"]) + "*"]
    assert table[2][:4] == ["maml_low", "8x50x8", "-", "partial"]
    assert table[2][4].endswith("*") and table[2][5:] == [
        "-", paper_results.printed(values["maml_low"]["C3"]) + "*"]
    assert table[3][:5] == ["sca", "4x25x8", "3,200", "90.00 ± 0.40",
                            paper_results.printed(values["sca"]["B3"])]  # not paper-era
    assert paper_table[1][3] == "96.50 ± 0.71 (2 seeds)"  # mean ± std over seeds


def test_the_committed_grid_table_is_the_one_its_csv_generates():
    """docs/reference/table.md is written with results.csv; a hand edit or a stale copy fails."""
    out = os.path.join(REPO, "docs", "reference")
    with open(os.path.join(out, reference_report.TABLE_FILE), encoding="utf-8") as f:
        assert f.read() == reference_report.table_file_text(*reference_report.load(out))


def test_report_reference_from_the_command_line(tmp_path):
    command = [sys.executable, "-m", "launch.report", "--reference",
               f"--reference_dir={tmp_path / 'none'}", f"--out_dir={tmp_path / 'out'}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "CFSL_PROGRESS": "0"})
    assert done.returncode == 2 and not os.path.exists(tmp_path / "out")
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: --reference_dir={tmp_path / 'none'}: holds no results.csv (the reference data: "
        f"a checkout's docs/reference)")


def test_the_convergence_axis_is_logarithmic_when_budgets_differ_by_more_than_20x(tmp_path):
    from cfsl_jax.experiments import reference_report
    from test_sweep_report import assert_curves_drawn
    cpu, paper = np.array([400.0, 3200.0]), np.array([500.0, 125_000.0])
    assert reference_report.log_scale([cpu, paper])  # 125,000 > 20 x 400
    assert not reference_report.log_scale([cpu, np.array([0.0, 0.0])])  # test-only rows: 0
    assert not reference_report.log_scale([np.array([0.0])])
    path = reference_report.plot_convergence(
        {"B3": {"a (8x50x8)": (cpu, np.array([80.0, 90.0])),
                "b (paper)": (paper, np.array([85.0, 96.0])),
                "c (8x50x8)": (np.array([0.0, 0.0]), np.array([20.0, 20.0]))}},
        str(tmp_path / "c.png"))
    assert_curves_drawn(path)


def test_remaining_names_the_learners_a_grid_still_has_to_run():
    def row(learner, cell, seed, budget="8x50x8", status="complete",
            dataset="omniglot/full_nearest"):
        return {"learner": learner, "cell": cell, "seed": str(seed), "budget": budget,
                "status": status, "dataset": dataset}
    rows = [row("protonets", "B3", 0), row("maml_low", "B3", 0), row("protonets", "B3", 1),
            row("maml_low", "B3", 1, status="partial"), row("init_tune", "C3", 0, "paper"),
            row("ewc_init", "C3", 0, dataset="slimagenet64_nearest"), row("sca", "C3", 0)]
    assert reference.remaining(rows, "8x50x8", "protonets,maml_low", "B3", "0") == []
    # a partial row is still to run; one missing seed of several is enough
    assert reference.remaining(rows, "8x50x8", "maml_low,protonets", "B3", "0,1") == [
        "maml_low"]
    assert reference.remaining(rows, "8x50x8", "protonets", "B3", "0,1,2") == ["protonets"]
    # another budget, dataset or cell does not count
    assert reference.remaining(rows, "8x50x8", "init_tune,ewc_init,sca", "C3", "0") == [
        "init_tune", "ewc_init"]
    assert reference.remaining(rows, "4x25x8", "sca", "C3", "0") == ["sca"]
    assert reference.remaining(rows, "8x50x8", "protonets", "B3", "0", "slimagenet64") == [
        "protonets"]
    # the committed rows: B3 at the CPU budget and ProtoNets B3 at the paper's are complete
    committed = reference.read_rows(os.path.join(REPO, "docs", "reference", "results.csv"))
    assert reference.remaining(committed, "8x50x8", "protonets,maml_low,init_tune,"
                               "pretrain_tune,ewc_init,ewc_pretrain", "B3", "0") == []
    assert reference.remaining(committed, "paper", "protonets", "B3", "0,1,2") == []


def test_every_committed_row_is_its_checksummed_run_files_and_a_cell_shares_its_test_tasks():
    """docs/reference as committed: a wrong number there would be reported as right."""
    out = os.path.join(REPO, "docs", "reference")
    rows = reference.read_rows(os.path.join(out, "results.csv"))
    assert [row["run"] for row in rows] == [row["run"] for row in reference.sorted_rows(rows)]
    assert len({row["run"] for row in rows}) == len(rows)
    fingerprints = {}
    for row in rows:
        folder = os.path.join(out, row["run"])
        for name in reference.RUN_FILES:  # each copied file is the one its checksum recorded
            path = os.path.join(folder, name)
            if os.path.exists(path):
                checksums.check_text(path, open(path, "rb").read())
        assert checksums.has_manifest(folder), row["run"]
        config = json.load(open(os.path.join(folder, "config.json")))
        filed = json.load(open(os.path.join(folder, "results.json"))) \
            if row["status"] == "complete" else {"config": config}
        assert (config["learner"], cell_of(filed), config["seed"]) == (
            row["learner"], row["cell"], int(row["seed"]))
        if row["status"] != "complete":
            assert not os.path.exists(os.path.join(folder, "results.json")), row["run"]
            continue
        result = json.load(open(os.path.join(folder, "results.json")))
        assert reference.row_differences(row, result) == [], row["run"]
        assert int(row["test_tasks"]) == 600
        fingerprints.setdefault((row["dataset"], row["cell"]), set()).add(
            row["task_fingerprint"])
    assert fingerprints and all(len(found) == 1 for found in fingerprints.values()), fingerprints
    on_disk = {os.path.relpath(root, out) for root, _, names in os.walk(os.path.join(out, "runs"))
               if "config.json" in names}
    assert on_disk == {row["run"] for row in rows}  # no run folder without its row


def test_a_run_retested_under_paper_era_options_starts_from_its_own_test_tasks(fixture_sweep):
    """paper_era.retest (benchmarks/paper_era_finetune.py): 'carried' is the run's own first
    tasks, bit for bit; the restart changes what reaches the target set (B2: two sets)."""
    sweep_dir, found = fixture_sweep
    run = found[("init_tune", "B2", 0)]
    config = TrainConfig(**{**TINY_SWEEP, "learner_options": {
        **TINY_SWEEP["learner_options"], **TINY_SWEEP_LEARNER_OPTIONS.get("init_tune", {})}},
        learner="init_tune", task="B2", seed=0)
    workdir = sweep_plan.run_dir(sweep_dir, config)
    carried = paper_era.retest(workdir, "carried", 3)
    assert carried["per_task"] == run["test"]["per_task"]["acc"][:3]
    restart = paper_era.retest(workdir, "restart", 3)
    assert restart["task_fingerprint"] == carried["task_fingerprint"]
    assert restart["per_task"] != carried["per_task"]
    assert len(restart["group_acc"]) == 2  # one per support set's class group


def test_run_cpu_names_each_budget_as_the_csv_does_and_gives_each_budget_its_own_folders():
    """run_cpu.sh's budget map (which rows a new machine still has to run) is what each flag
    file's schedule is called in results.csv; a budget that shares a learner and cell with
    another runs in its own folder (a run's folder names no budget)."""
    import re
    here = os.path.join(REPO, "benchmarks", "reference")
    script = open(os.path.join(here, "run_cpu.sh"), encoding="utf-8").read()
    budgets = dict(re.findall(r"\[(\S+\.flags)\]=(\S+?)[ )]", script))
    assert set(budgets) == {"cpu_3200.flags", "cpu_800.flags", "cpu_1600.flags"}
    for name, expected in budgets.items():
        flags = {}
        for path in ("common.flags", name):
            for line in open(os.path.join(here, path), encoding="utf-8"):
                key, _, value = line.strip().lstrip("-").partition("=")
                flags[key] = value
        config = TrainConfig(**{k: int(flags[k]) for k in ("epochs", "iters_per_epoch",
                                                         "meta_batch")})
        assert reference.budget_name(config) == expected, name
    names = dict(re.findall(r"^(cheap|costly)=(\S+)", script, re.M))
    names["cell"] = re.search(r"^for cell in ([\w ]+); do", script, re.M).group(1).split()
    calls = re.findall(r"^ *sweep (\S+) (\S+) (\S+) (\S+) ?(\S*)", script, re.M)
    assert len(calls) == 6
    folders: dict[tuple, set] = {}
    for flagfile, learners, cells, seeds, folder in calls:
        learners = names[learners.strip('"$')] if learners.startswith('"$') else learners
        cells = names["cell"] if cells == '"$cell"' else [cells]
        for learner in learners.split(","):
            for cell in cells:
                folders.setdefault((learner, cell, folder), set()).add(budgets[flagfile])
    assert folders[("sca", "B3", "")] == {"4x25x8"}
    assert folders[("sca", "B3", "cpu_1600")] == {"8x25x8"}
    assert all(len(found) == 1 for found in folders.values()), folders


def test_your_runs_pair_only_with_reference_runs_on_the_same_dataset_options():
    """A run on Omniglot's default class split has the reference runs' dataset name and task
    fingerprint (it ignores the class split) but other test images: it is not paired with the
    reference's class_split=authors runs, and one line says it was left out."""
    _, found = reference_report.load(os.path.join(REPO, "docs", "reference"))
    ref = next(r for r in found if (r["learner"], r["config"]["task"], r["seed"], r["_budget"])
               == ("protonets", "B3", 0, "8x50x8"))
    assert ref["config"]["dataset_options"]["class_split"] == "authors"
    same = {k: v for k, v in ref.items() if not k.startswith("_")}
    ordered = {**same, "config": {**same["config"], "dataset_options": {
        **same["config"]["dataset_options"], "class_split": "ordered"}}}
    rows = reference_report.beside_yours(found, [same, ordered])
    mine = [row for row in rows[1:] if row[1:3] == ["protonets", "B3 seed 0"]]
    assert len(rows) == 1 + len(mine)  # the reference's B3 seed 0 of each budget, once
    assert {row[-2] for row in mine} == {"8x50x8 seed 0", "paper seed 0"}
    assert [row[-1] for row in mine if row[-2] == "8x50x8 seed 0"] == ["+0.00 ± 0.00 (600)"]
    line = reference_report.other_data(found, [same, ordered])
    assert line == (
        'Left out, not paired: omniglot/full_nearest protonets B3 seed 0 ({"resize": '
        '"nearest"}): the reference ran them on other dataset options ({"class_split": '
        '"authors", "resize": "nearest"}), so on other test images.')  # ordered: the default
    assert reference_report.other_data(found, [same]) is None


def test_runs_of_another_preset_or_options_are_never_averaged_together():
    """results.csv's preset and options columns: an --as_published run and a default one are
    two rows of the grid and of the comparison with Table 1; options that change only the
    rounding (config.COMPUTATION_OPTIONS: conv) do not split a cell's seeds."""
    options = {"class_split": "authors", "resize": "nearest"}

    def row(acc, seed, preset="none", **more):
        return {"dataset": "omniglot/full_nearest", "budget": "8x50x8", "learner": "protonets",
                "cell": "B3", "seed": str(seed), "status": "complete",
                "test_acc_mean": str(acc), "test_acc_ci95": "0.004", "val_acc_last": "",
                "training_tasks": "3200", "paper_budget": "False", "preset": preset,
                "options": json.dumps({**options, **more}, sort_keys=True)}
    rows = [row(0.90, 0), row(0.92, 1, conv="gemm_grad"),
            row(0.50, 0, "apr2020", draws="per_group", distance="dot")]
    (_, table), = reference_report.grid(rows, paper_results.TABLE1)
    assert [line[:4] for line in table[1:]] == [
        ["protonets", "8x50x8 [as_published=none]", "3,200", "91.00 ± 1.41 (2 seeds)"],
        ["protonets", "8x50x8 [as_published=apr2020]", "3,200", "50.00 ± 0.40"]]
    beside = reference_report.beside_table1(rows, paper_results.TABLE1)
    assert [(line[3], line[4], line[5], line[7]) for line in beside[1:]] == [
        ("8x50x8 [as_published=none] (3,200)", "2", "91.00 ± 1.41", "-4.30"),
        ("8x50x8 [as_published=apr2020] (3,200)", "1", "50.00", "-45.30")]
    # one preset, other options: the options that differ name the rows
    rows[2] = row(0.40, 0, draws="per_group")
    assert [line[1] for line in reference_report.grid(rows, paper_results.TABLE1)[0][1][1:]] \
        == ["8x50x8 [draws unset]", "8x50x8 [draws=\"per_group\"]"]
    # only the rounding differs (the committed results.csv: conv): one row, as before
    assert [line[1:4] for line in reference_report.grid(
        rows[:2], paper_results.TABLE1)[0][1][1:]] == [["8x50x8", "3,200",
                                                        "91.00 ± 1.41 (2 seeds)"]]
