"""Sweeps end to end (killed mid-way and resumed), the report's numbers, and Figure 4's numbers.

The sweep is the tiny config of tests/test_train.py on two learners x two cells x two seeds.
Its workers compile with ``jax_disable_most_optimizations`` (2-3x faster compiles for
programs that run a few steps) into the session's persistent compilation cache, which the
notebook tests share (tests/test_notebooks.py uses the same settings).
"""

import csv
import dataclasses
import json
import re
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from cfsl_jax.experiments import figures, paper_results, report, sweep, sweep_plan
from cfsl_jax.training import results, runs
from cfsl_jax.training.config import TrainConfig
from conftest import (TEST_PRECISION, TINY_SWEEP, TINY_SWEEP_LEARNER_OPTIONS,
                      WORKER_JAX_OPTIONS, interruptible_module)
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.runtime.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = TrainConfig(**TINY_SWEEP)
LEARNERS = ("protonets", "init_tune")
LEARNER_OPTIONS = TINY_SWEEP_LEARNER_OPTIONS
CELLS = ("B2", "C2")
SEEDS = (0, 1)
# The same sweep as command-line flags (launch/sweep.py).
TINY_FLAGS = ["--learners=protonets,init_tune", "--cells=B2,C2", "--seeds=0,1",
              "--learner_option=filters=8", "--learner_option=init_tune:inner_steps=1",
              "--dataset_option=num_classes=60", "--dataset_option=samples_per_class=8",
              "--nc=3", "--kt=2", "--epochs=2", "--iters_per_epoch=3", "--meta_batch=2",
              "--val_tasks=4", "--test_tasks=4", "--eval_batch=4", "--keep_best=2",
              "--log_every=2"]


def tiny_configs():
    configs, skipped = sweep_plan.grid(TINY, LEARNERS, CELLS, SEEDS, learner_options=LEARNER_OPTIONS)
    assert skipped == {} and len(configs) == 8
    return configs


def results_paths(sweep_dir):
    return sorted(os.path.join(root, "results.json") for root, _, files in os.walk(sweep_dir)
                  if "results.json" in files)


def started_runs(sweep_dir):
    return {root for root, _, files in os.walk(sweep_dir) if "config.json" in files}


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """Start the sweep's CLI, press Ctrl-C (SIGINT to its process group, as a terminal does) as
    soon as the first run has finished, then run the same sweep again through the API."""
    sweep_dir = str(tmp_path_factory.mktemp("sweep"))
    cache = jax.config.values["jax_compilation_cache_dir"]
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache,
           "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "CFSL_PROGRESS": "1"}
    # The CLI's workers compile into this session's cache (the flag's default is the user's
    # cache, which overrides JAX_COMPILATION_CACHE_DIR) at this process's precision (the flag's
    # default gives every matmul and convolution another precision setting): the API's workers
    # below, which inherit both, load the programs the CLI compiled.
    command = interruptible_module("launch.sweep", f"--workdir={sweep_dir}", "--workers=2",
                                   "--report=false", f"--precision={TEST_PRECISION}",
                                   f"--compilation_cache_dir={cache}", *TINY_FLAGS)
    log = open(tmp_path_factory.mktemp("sweep_log") / "log.txt", "w+")
    process = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while not results_paths(sweep_dir) and process.poll() is None:
            assert time.monotonic() < deadline, "no run finished in 10 minutes"
            time.sleep(0.2)
        if process.poll() is not None:
            log.seek(0)
            pytest.fail(f"the sweep ended before it was interrupted:\n{log.read()[-3000:]}")
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the CLI and its worker processes
        started = started_runs(sweep_dir)
        returncode = process.wait(timeout=300)  # a hang fails here, not a timing assertion
        workers_left = True
        for _ in range(300):  # the workers (and multiprocessing's helper) exit after the CLI
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                workers_left = False
                break
            time.sleep(0.1)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.seek(0)
        interrupted = {"returncode": returncode, "log": log.read(), "workers_left": workers_left,
                       "started": started, "started_after": started_runs(sweep_dir)}
        log.close()
    done_before = {path: os.stat(path).st_mtime_ns for path in results_paths(sweep_dir)}
    outcomes = sweep.run_sweep(tiny_configs(), sweep_dir, workers=2,
                               jax_options=WORKER_JAX_OPTIONS, log=lambda line: None)
    return sweep_dir, done_before, outcomes, interrupted


def test_ctrl_c_stops_the_sweep_at_once_and_says_how_to_continue(killed_and_resumed):
    interrupted = killed_and_resumed[3]
    assert interrupted["returncode"] == 130, interrupted["log"][-3000:]
    last = interrupted["log"].strip().splitlines()[-1]
    assert last.startswith("sweep interrupted: ") and last.endswith(
        "re-run the same command to continue"), last
    assert "Traceback" not in interrupted["log"]
    assert not interrupted["workers_left"]
    assert interrupted["started_after"] <= interrupted["started"]  # no queued run started


def test_a_killed_sweep_reruns_only_the_missing_runs(killed_and_resumed):
    sweep_dir, done_before, outcomes, _ = killed_and_resumed
    assert 1 <= len(done_before) < 8
    by_path = {os.path.join(o.run.workdir, "results.json"): o for o in outcomes}
    assert {p for p, o in by_path.items() if o.status == "skipped"} == set(done_before)
    assert sorted(o.status for o in outcomes) == (["finished"] * (8 - len(done_before))
                                                  + ["skipped"] * len(done_before))
    assert len(results_paths(sweep_dir)) == 8
    for path, mtime in done_before.items():  # finished runs were not touched again
        assert os.stat(path).st_mtime_ns == mtime
    assert os.path.isdir(os.path.join(sweep_dir, "synthetic", "protonets", "C2", "seed1"))
    # A third pass has nothing left to do.
    again = sweep.run_sweep(tiny_configs(), sweep_dir, workers=2, log=lambda line: None)
    assert {o.status for o in again} == {"skipped"}


def test_report_numbers_are_the_seed_statistics_of_the_runs(killed_and_resumed, tmp_path):
    sweep_dir = killed_and_resumed[0]
    runs = report.load_results(sweep_dir)
    # the tiny sweep overrides nc and kt: its runs are reported under their own spec names
    # (report.cell_of), never under Table 1's B2 and C2; a table of those names compares
    named = {cell: {report.cell_of(r) for r in runs if r["config"]["task"] == cell}
             for cell in CELLS}
    assert all(len(names) == 1 and cell not in names for cell, names in named.items())
    named = {cell: names.pop() for cell, names in named.items()}
    b2 = named["B2"]
    assert b2.startswith("B2(") and "nc=3" in b2 and "kt=2" in b2
    paper = {"source": "a test table", "values": {"synthetic": {
        "protonets": {b2: {"mean": 50.0, "std": 1.5}}}}}
    paths = report.write_report(sweep_dir, str(tmp_path), paper)
    markdown = open(paths["markdown"]["synthetic"]).read()
    accuracy_csv = {(row["learner"], row["cell"]): row
                    for row in csv.DictReader(open(paths["csv"]["synthetic"]["acc"]))}
    table = report.table(report.aggregate(runs, "acc"), "synthetic", "acc")
    assert table[0] == ["learner", b2, named["C2"]]
    assert [row[0] for row in table[1:]] == list(LEARNERS)
    for i, learner in enumerate(LEARNERS):
        for j, cell in enumerate(CELLS):
            values = [r["test"]["acc_mean"] for r in sorted(runs, key=lambda r: r["seed"])
                      if r["learner"] == learner and r["config"]["task"] == cell]
            assert len(values) == 2
            mean, std = np.mean(values), np.std(values, ddof=1)  # sample std across seeds
            row = accuracy_csv[(learner, named[cell])]
            assert float(row["mean"]) == pytest.approx(mean, abs=1e-12)
            assert float(row["std"]) == pytest.approx(std, abs=1e-12)
            assert float(row["ci95"]) == pytest.approx(  # t(0.975, 1)
                12.706 * std / np.sqrt(2), abs=1e-12)
            expected = f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if std else "")
            assert table[i + 1][j + 1] == expected and expected in markdown
    for metric, field in (("ce", "ce_mean"), ("atm", "atm"), ("macs", "macs_per_task")):
        rows = list(csv.DictReader(open(paths["csv"]["synthetic"][metric])))
        for row in rows:
            values = [r["test"][field] for r in runs
                      if r["learner"] == row["learner"] and report.cell_of(r) == row["cell"]]
            assert float(row["mean"]) == pytest.approx(np.mean(values), rel=1e-12)
    # The paper's number sits beside ours, with the difference in points.
    ours = float(accuracy_csv[("protonets", b2)]["mean"])
    assert float(accuracy_csv[("protonets", b2)]["difference"]) == pytest.approx(ours - 0.5)
    assert accuracy_csv[("init_tune", b2)]["paper_mean"] == ""
    row = f"| protonets | {b2} | {table[1][1]} | 50.00 ± 1.50 | {100 * ours - 50:+.2f} |"
    assert row in markdown
    assert_curves_drawn(paths["figure3"]["synthetic"])


def test_report_compares_with_the_shipped_paper_numbers(tmp_path):
    """With no table given, the report puts the shipped Omniglot number beside ours
    (omniglot/small compares with the paper's omniglot); a cell off the grid has none."""
    test_numbers = {("omniglot/small", "B3", 0): 0.90, ("omniglot/small", "B3", 1): 0.92,
                    ("omniglot/small", "B2", 0): 0.80, ("omniglot/full", "B3", 0): 0.93}
    for (dataset, cell, seed), acc in test_numbers.items():
        config = TrainConfig(dataset=dataset, task=cell, seed=seed)
        result = {"dataset": dataset, "learner": "protonets", "seed": seed,
                  "spec": dataclasses.asdict(TaskSpec.parse(cell)), "config": config.to_json(),
                  "test": {"acc_mean": acc, "ce_mean": 0.5, "atm": 0.1, "macs_per_task": 1e6}}
        run_dir = tmp_path / "sweep" / dataset.replace("/", "-") / cell / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "results.json").write_text(json.dumps(result))
    assert paper_results.TABLE1["values"]["omniglot"]["protonets"]["B3"] == {
        "mean": 95.3, "std": 0.12, "mean_printed": "95.30", "std_printed": "0.12"}  # Table 1
    paths = report.write_report(str(tmp_path / "sweep"), str(tmp_path / "report"),
                                figure3=False)
    rows = {row["cell"]: row for row in
            csv.DictReader(open(paths["csv"]["omniglot/small"]["acc"]))}
    assert float(rows["B3"]["paper_mean"]) == pytest.approx(0.953)
    assert float(rows["B3"]["paper_std"]) == pytest.approx(0.0012)
    assert float(rows["B3"]["difference"]) == pytest.approx(0.91 - 0.953)
    assert rows["B2"]["paper_mean"] == rows["B2"]["difference"] == ""
    markdown = open(paths["markdown"]["omniglot/small"]).read()
    assert "| protonets | B3 | 91.00 ± 1.41 | 95.30 ± 0.12 | -4.30 |" in markdown  # ddof=1
    assert "| protonets | B2 |" not in markdown.split("vs the paper")[1]
    assert paper_results.SOURCE in markdown
    assert "The paper used omniglot" in markdown  # a subset of its characters
    full = open(paths["markdown"]["omniglot/full"]).read()  # the paper's own images
    # ... but not its classes: the default class split is not the authors' (Table 1's)
    assert "| protonets | B3 | 93.00 | 95.30 ± 0.12 | -2.30 † |" in full
    assert ("(† Runs on Omniglot's class_split=ordered: other training, validation and test "
            "characters than Table 1's, which came from the authors' split "
            "(`--dataset_option=class_split=authors`), so the difference is indicative only"
            in full)
    assert "The paper used" not in full
    assert "pretraining" not in full  # no run of the sweep pretrains
    result = json.loads((tmp_path / "sweep" / "omniglot-full" / "B3" / "seed0" /
                         "results.json").read_text())
    pretrained = tmp_path / "sweep" / "omniglot-full" / "pretrain_tune"
    pretrained.mkdir()
    (pretrained / "results.json").write_text(json.dumps({**result, "learner": "pretrain_tune"}))
    paths = report.write_report(str(tmp_path / "sweep"), str(tmp_path / "report"),
                                figure3=False)
    assert ("(pretraining: the same schedule on the images of training tasks)."
            in open(paths["markdown"]["omniglot/full"]).read())
    # on the authors' class split, the paper's classes too: no mark, no note
    for path in (tmp_path / "sweep" / "omniglot-full").rglob("results.json"):
        result = json.loads(path.read_text())
        config = TrainConfig(dataset="omniglot/full", task=result["config"]["task"],
                             seed=result["seed"], dataset_options={"class_split": "authors"})
        path.write_text(json.dumps({**result, "config": config.to_json()}))
    paths = report.write_report(str(tmp_path / "sweep"), str(tmp_path / "report"),
                                figure3=False)
    full = open(paths["markdown"]["omniglot/full"]).read()
    assert "| protonets | B3 | 93.00 | 95.30 ± 0.12 | -2.30 |" in full
    assert "†" not in full and "indicative" not in full


def _result(dataset, learner, seed, acc, **fields):
    """A results.json of a run of TrainConfig(**fields) (its spec resolved as a run's)."""
    config = TrainConfig(dataset=dataset, learner=learner, seed=seed, **fields)
    return {"dataset": dataset, "learner": learner, "seed": seed,
            "spec": dataclasses.asdict(config.spec), "spec_name": config.spec.name,
            "config": config.to_json(),
            "test": {"acc_mean": acc, "ce_mean": 0.5, "atm": 0.1, "macs_per_task": 1e6}}


def test_a_folder_of_runs_at_different_budgets_says_each_budget():
    """Two sweeps of other budgets into one folder (each run's own config matches, so both are
    accepted): the report names each budget with its learners, not the first run's for all."""
    one = [_result("omniglot/full", "protonets", 0, 0.9, task="B3", epochs=1),
           _result("omniglot/full", "init_tune", 0, 0.2, task="B3", epochs=1)]
    assert "Budget per run: 600 test tasks, 1 epoch x " in report.dataset_markdown(
        one, "omniglot/full", report.load_paper_table())
    mixed = report.dataset_markdown(
        [one[0], _result("omniglot/full", "init_tune", 0, 0.2, task="B3", epochs=50)],
        "omniglot/full", report.load_paper_table())
    assert ("**Budgets differ between runs**, so their numbers are not comparable: protonets: "
            "600 test tasks, 1 epoch x ") in mixed and "; init_tune: 600 test tasks, 50 epochs x " \
        in mixed


def test_a_run_whose_overrides_make_another_paper_cell_is_reported_under_that_cell(tmp_path):
    """task='B3' with --overwrite --nss=5 runs C5's TaskSpec: it is reported as C5, beside a
    C5 run and compared with Table 1's C5, never as B3; runs of one spec reached by other
    names are one experiment; overrides of how the paper-era code sampled or labelled
    (--as_published's) keep the cell; a spec outside the grid keeps its own spec name."""
    authors = {"class_split": "authors"}
    results = [
        _result("omniglot/full", "protonets", 0, 0.93, task="B3", dataset_options=authors),
        _result("omniglot/full", "protonets", 1, 0.40, task="B3", dataset_options=authors,
                spec_overrides={"overwrite": True, "nss": 5}),
        _result("omniglot/full", "protonets", 2, 0.42, task="C3", dataset_options=authors,
                spec_overrides={"nss": 5}),
        _result("omniglot/full", "protonets", 3, 0.38, task="C5", dataset_options=authors),
        _result("omniglot/full", "protonets", 0, 0.45, task="D4", dataset_options=authors,
                spec_overrides={"label_offset": "per_support_set",
                                "target_mode": "per_support_set", "draws": "per_group"})]
    assert [report.cell_of(r) for r in results] == ["B3", "C5", "C5", "C5", "D4"]
    # a record without spec/spec_name (its config alone), and a bare task type, name the cell
    assert report.cell_of({"config": results[1]["config"]}) == "C5"
    assert report.cell_of({"config": TrainConfig(task="B").to_json()}) == "B3"
    c5 = paper_results.TABLE1["values"]["omniglot"]["protonets"]["C5"]
    alone = report.aggregate([results[1]], "acc")  # C5 named B3: Table 1's C5, not its B3
    assert list(alone) == [("omniglot/full", "protonets", "C5")]
    assert report.paper_comparison(alone, "omniglot/full", paper_results.TABLE1)[1] == [
        "protonets", "C5", "40.00", paper_results.printed(c5), f"{40 - c5['mean']:+.2f}"]
    accuracy = report.aggregate(results, "acc")  # one experiment: no refusal
    assert set(accuracy) == {("omniglot/full", "protonets", c) for c in ("B3", "C5", "D4")}
    assert accuracy[("omniglot/full", "protonets", "B3")].values == (0.93,)
    assert accuracy[("omniglot/full", "protonets", "C5")].values == (0.40, 0.42, 0.38)
    comparison = report.paper_comparison(accuracy, "omniglot/full", paper_results.TABLE1)
    assert [row[:2] for row in comparison[1:]] == [["protonets", "B3"], ["protonets", "D4"],
                                                   ["protonets", "C5"]]
    assert comparison[1][-1] == "-2.30"  # 93.00 - 95.30: the B3 run alone
    # the same experiment check holds the C5 runs together whichever comes first
    report.check_same_experiment(("omniglot/full", "protonets", "C5"), results[3], results[1])
    report.check_same_experiment(("omniglot/full", "protonets", "C5"), results[1], results[2])
    # a spec outside the grid: its own spec name, compared with no Table 1 cell
    b7 = _result("omniglot/full", "protonets", 0, 0.7, task="B3", dataset_options=authors,
                 spec_overrides={"nss": 7})
    name = TaskSpec.preset("B", nss=7).name
    assert name == "B7(cci=1,nc=5,ks=1,kt=5,per_class)" and report.cell_of(b7) == name
    assert report.cell_of({"config": TrainConfig(task="B7").to_json()}) == "B7"
    alone = report.aggregate([b7], "acc")
    assert report.paper_comparison(alone, "omniglot/full", paper_results.TABLE1)[1:] == []
    for index, result in enumerate(results + [b7]):
        (tmp_path / "sweep" / str(index)).mkdir(parents=True)
        (tmp_path / "sweep" / str(index) / "results.json").write_text(json.dumps(result))
    markdown = open(report.write_report(str(tmp_path / "sweep"), str(tmp_path / "report"),
                                        figure3=False)["markdown"]["omniglot/full"]).read()
    assert "| protonets | C5 |" in markdown.split("vs the paper")[1]
    assert f"| protonets | {name} |" not in markdown.split("vs the paper")[1]
    # a cell's runs that differ in their spec are still refused, in one line
    other = _result("omniglot/full", "protonets", 4, 0.5, task="C3", dataset_options=authors,
                    spec_overrides={"nss": 5, "target_mode": "per_support_set"})
    assert report.cell_of(other) == "C5"  # another target mode: the cell, PROTOCOL_FIELDS aside
    with pytest.raises(UserError, match="differ in spec_overrides, task, not only in their"):
        report.aggregate([results[3], other], "acc")
    with pytest.raises(UserError, match="differ in spec_overrides, not only in their seed"):
        report.aggregate([results[0], _result(
            "omniglot/full", "protonets", 1, 0.9, task="B3", dataset_options=authors,
            spec_overrides={"target_mode": "per_support_set"})], "acc")


@pytest.mark.parametrize("label_offset", ["per_class_group", "per_support_set"])
def test_a_d_cell_beside_table_1_says_how_the_paper_labelled_it(tmp_path, label_offset):
    spec = dataclasses.replace(TaskSpec.parse("D4"), label_offset=label_offset,
                               target_mode="per_support_set")
    config = TrainConfig(dataset="omniglot/small", task="D4", spec_overrides={
        "label_offset": label_offset, "target_mode": "per_support_set"})
    result = {"dataset": "omniglot/small", "learner": "protonets", "seed": 0,
              "spec": dataclasses.asdict(spec), "config": config.to_json(),
              "test": {"acc_mean": 0.6, "ce_mean": 0.5, "atm": 0.1, "macs_per_task": 1e6}}
    (tmp_path / "sweep" / "r").mkdir(parents=True)
    (tmp_path / "sweep" / "r" / "results.json").write_text(json.dumps(result))
    paths = report.write_report(str(tmp_path / "sweep"), str(tmp_path / "report"),
                                figure3=False)
    markdown = open(paths["markdown"]["omniglot/small"]).read()
    assert "| protonets | D4 |" in markdown
    assert ("Table 1's D cells come from code that labelled each support set on its own"
            in markdown) == (label_offset == "per_class_group")


def test_a_cell_whose_seeds_ran_different_experiments_is_refused():
    """Two runs of one cell that differ in a learner option are two experiments: averaging
    them would print one number for both. Seeds, logging and evaluation batch may differ."""
    def result(seed, acc, **fields):
        config = TrainConfig(task="B3", seed=seed, **fields)
        return {"dataset": "synthetic", "learner": "protonets", "seed": seed,
                "spec": dataclasses.asdict(TaskSpec.parse("B3")), "config": config.to_json(),
                "test": {"acc_mean": acc, "ce_mean": 0.5, "atm": 0.1, "macs_per_task": 1e6}}
    same = [result(0, 0.6), result(1, 0.7, log_every=7, eval_batch=10, checkpoint_every=3,
                                   learner_options={"conv": "xla", "tasks_on_cpu": "vmap"})]
    assert report.aggregate(same, "acc")[("synthetic", "protonets", "B3")].mean == \
        pytest.approx(0.65)
    mixed = [result(0, 0.6), result(1, 0.38, learner_options={"distance": "dot"})]
    with pytest.raises(ValueError, match=re.escape(
            "synthetic/protonets/B3: the runs of seeds 0 and 1 differ in learner_options, not "
            "only in their seed")):
        report.aggregate(mixed, "acc")
    with pytest.raises(ValueError, match="differ in eval_seed, meta_batch"):
        report.aggregate([result(0, 0.6), result(1, 0.6, eval_seed=5, meta_batch=2)], "acc")


def test_dry_run_lists_every_run_with_its_status(killed_and_resumed):
    sweep_dir = killed_and_resumed[0]
    result = subprocess.run([sys.executable, "-m", "launch.sweep", f"--workdir={sweep_dir}",
                             "--dry_run", *TINY_FLAGS, "--seeds=2"], cwd=REPO,  # 0,1 + 2
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sum(line.startswith("done ") for line in lines) == 8
    assert sum(line.startswith("new ") for line in lines) == 4
    assert lines[-1] == "12 runs: 8 done, 4 new"
    assert "synthetic/init_tune/C2/seed2" in result.stdout


def test_a_changed_budget_is_a_conflict_and_is_not_run(killed_and_resumed):
    sweep_dir = killed_and_resumed[0]
    longer = TrainConfig(**{**TINY.to_json(), "epochs": 3})
    configs, _ = sweep_plan.grid(longer, ["protonets"], ["B2"], [0])
    outcomes = sweep.run_sweep(configs, sweep_dir, workers=2, log=lambda line: None)
    assert [o.status for o in outcomes] == ["conflict"]
    assert "fields: epochs" in outcomes[0].detail


def test_a_changed_learner_option_default_is_a_conflict_naming_the_sweep_flag(tmp_path):
    """A ProtoNets run saved before ``tasks_on_cpu`` (its config.json without it: it ran ``vmap``)
    in a sweep directory: today's sweep is a conflict whose line names the option, both values
    and the sweep's flag that continues it; with that flag the run is the sweep's own."""
    config = tiny_configs()[0]
    assert config.learner == "protonets"
    sweep_dir = str(tmp_path / "sweep")
    workdir = sweep_plan.run_dir(sweep_dir, config)
    runs.check_workdir_config(workdir, config)
    saved = results.read_json(os.path.join(workdir, "config.json"))
    del saved["learner_options"]["tasks_on_cpu"]
    results.write_json(os.path.join(workdir, "config.json"), saved)
    (_, status, detail), = sweep_plan.plan([config], sweep_dir)
    assert status == "conflict"
    assert detail == (f"{workdir} holds a run with a different config: learner_options "
                      f"tasks_on_cpu: the workdir ran vmap, this command gives in_turn (add "
                      f"--learner_option=protonets:tasks_on_cpu=vmap to continue it)")
    old = dataclasses.replace(config, learner_options={**config.learner_options,
                                                       "tasks_on_cpu": "vmap"})
    assert sweep_plan.plan([old], sweep_dir)[0][1] == "partial"


def test_a_learner_that_does_not_build_is_skipped_with_its_reason():
    configs, skipped = sweep_plan.grid(TINY, LEARNERS, CELLS, [0],
                                  learner_options={"init_tune": {"no_such_option": 1}})
    assert {c.learner for c in configs} == {"protonets"} and len(configs) == 2
    assert "no_such_option" in skipped["init_tune"]
    with pytest.raises(ValueError, match="unknown learner"):
        sweep_plan.grid(TINY, ["nope"], CELLS, [0])
    with pytest.raises(ValueError, match=r"cells lists a value twice: \['B2', 'B2'\]"):
        sweep_plan.grid(TINY, LEARNERS, ["B2", "B2"], [0])
    assert sweep_plan.run_dir("/s", TrainConfig(dataset="omniglot/small", task="D8", seed=2)) \
        == "/s/omniglot-small/protonets/D8/seed2"


def test_figure4_numbers_follow_the_shapes(tmp_path):
    """Type C: ProtoNets' ATM falls as 1/NSS (a fixed NC-label buffer over growing support
    inputs); init_tune's state is a constant number of bytes over NSS x the support bytes of
    one set; per-task MACs of the fine-tuning learner are affine in NSS (adapt x NSS +
    predict on NSS x NC x KT targets), with the same adapt cost at every NSS."""
    nss_values = (1, 2, 4)
    curves, skipped = figures.cost_curves(
        LEARNERS, nss_values, task_type="C", log=lambda line: None,
        learner_options={"protonets": {"filters": 8}, "init_tune": {"filters": 8,
                                                                    "inner_steps": 1}})
    assert skipped == {}
    protonets, init_tune = curves["protonets"], curves["init_tune"]
    assert [p["nss"] for p in protonets] == list(nss_values)
    np.testing.assert_allclose([p["atm"] * p["nss"] for p in protonets], protonets[0]["atm"],
                               rtol=1e-12)
    assert len({p["state_bytes"] for p in init_tune}) == 1
    np.testing.assert_allclose([p["support_bytes"] / p["nss"] for p in init_tune],
                               5 * 1 * 28 * 28 * 1 * 4, rtol=0)  # NC*KS float32 images
    np.testing.assert_allclose([p["atm"] for p in init_tune],
                               [init_tune[0]["state_bytes"] / p["support_bytes"]
                                for p in init_tune], rtol=1e-12)
    assert len({p["macs_adapt"] for p in init_tune}) == 1
    macs = np.array([p["macs_per_task"] for p in init_tune])
    assert macs[1] > 1.9 * macs[0]
    # Affine up to XLA's count of batch reductions (0.015% off with these tiny convolutions).
    np.testing.assert_allclose(macs[2] - macs[1], 2 * (macs[1] - macs[0]), rtol=1e-3)
    assert_curves_drawn(figures.plot_cost_curves(curves, str(tmp_path / "figure4.png")))


def assert_curves_drawn(path: str) -> None:
    """``path`` is a PNG of a figure with coloured curves on it (not an empty frame: axes, ticks
    and text are grey)."""
    import matplotlib.image
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) >= 200, image.shape
    rgb = image[..., :3]
    coloured = (rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.25
    assert coloured.mean() > 1e-3, coloured.mean()


def test_gpu_workers_share_the_gpus_that_exist(monkeypatch):
    # More workers than GPUs: each worker sees one GPU that exists, round-robin (a worker given
    # a GPU index past the last one fails CUDA's start and falls back to the CPU).
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [sweep.worker_env("gpu", slot, 1, 3)["CUDA_VISIBLE_DEVICES"] for slot in range(3)] == [
        "0"] * 3
    assert [sweep.worker_env("cuda", slot, 2, 3)["CUDA_VISIBLE_DEVICES"] for slot in range(3)] == [
        "0", "1", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert [sweep.worker_env("gpu", slot, 2, 3)["CUDA_VISIBLE_DEVICES"] for slot in range(3)] == [
        "4", "6", "4"]
    assert sweep.worker_env("cpu", 1, 1, 2) == {}


def test_gpu_workers_sharing_a_gpu_split_its_memory(monkeypatch):
    # jax's default preallocation gives the first process 75 % of the GPU, so a second worker
    # on it would run out of memory: workers sharing a GPU each get an equal share of 0.9.
    for name in ("CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                 "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR"):
        monkeypatch.delenv(name, raising=False)
    fractions = [sweep.worker_env("gpu", slot, 1, 3).get("XLA_PYTHON_CLIENT_MEM_FRACTION")
                 for slot in range(3)]
    assert fractions == ["0.300"] * 3
    two_gpus = [sweep.worker_env("cuda", slot, 2, 3) for slot in range(3)]
    assert [env.get("XLA_PYTHON_CLIENT_MEM_FRACTION") for env in two_gpus] == [
        "0.450", None, "0.450"]  # GPU 0 holds slots 0 and 2, GPU 1 slot 1 alone
    assert sweep.worker_env("gpu", 0, 1, 1) == {"CUDA_VISIBLE_DEVICES": "0"}
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the user's own setting
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in sweep.worker_env("gpu", 1, 1, 3)


def test_figure4_says_which_learners_lines_coincide(tmp_path):
    def curve(atm, macs):
        return [{"nss": n, "atm": atm / n, "macs_per_task": macs * n} for n in (1, 10)]

    curves = {"init_tune": curve(2.0, 5.0), "pretrain_tune": curve(2.0, 5.0),
              "ewc_init": curve(4.0, 5.0), "protonets": curve(1.0, 1.0)}
    assert figures.coinciding(curves, "atm") == [["init_tune", "pretrain_tune"]]
    assert figures.coinciding(curves, "macs_per_task") == [["init_tune", "pretrain_tune",
                                                            "ewc_init"]]
    assert_curves_drawn(figures.plot_cost_curves(curves, str(tmp_path / "f4.png")))
    # within 1 % at every NSS: one line hides the other (init_tune and maml_low differ by 0.4 %)
    close = {"init_tune": curve(2.0, 5.0), "maml_low": curve(2.0, 5.0 * 1.004),
             "protonets": curve(2.0, 5.0 * 1.05)}
    assert figures.coinciding(close, "macs_per_task") == [["init_tune", "maml_low"]]


def test_paired_differences_compare_learners_task_by_task_on_shared_tasks():
    from cfsl_jax.experiments.paired import paired_rows

    def run(learner, seed, acc, fingerprint="f", cell="B3", **data):
        return {"dataset": "d", "learner": learner, "seed": seed, "config": {"task": cell, **data},
                "task_fingerprint": fingerprint,
                "test": {"acc_mean": float(np.mean(acc)), "per_task": {"acc": list(acc)}}}

    results = [run("protonets", 0, [0.9, 0.8, 1.0, 0.7]), run("protonets", 1, [0.7, 0.8, 1.0, 0.9]),
               run("maml_low", 0, [0.6, 0.8, 0.9, 0.7]),
               run("sca", 0, [0.1, 0.1, 0.1, 0.1], fingerprint="other tasks"),
               # the same indices in another class split of the characters: other tasks
               run("ewc_init", 0, [0.2] * 4, dataset="omniglot/full",
                   dataset_options={"class_split": "authors"}),
               {**run("init_tune", 0, [0.0] * 4), "test": {"acc_mean": 0.0}}]  # no per-task
    rows = paired_rows(results, "d")
    assert rows[0][:4] == ["cell", "learner", "against", "difference (points)"]
    # protonets per task (seeds averaged): 0.8, 0.8, 1.0, 0.8; maml_low - protonets:
    # -0.2, 0, -0.1, -0.1 -> mean -0.1, sample std 0.0816, CI t(0.975, 3) 3.182 * 0.0816 / 2
    # = 0.1299 (Student's t over the 4 tasks: 1.96 and the population std gave 0.0693)
    assert rows[1:] == [["B3", "maml_low", "protonets", "-10.00", "±12.99", "4"]]
    assert paired_rows(results, "another dataset") == [rows[0]]
    # --eval_seed=seed: each seed tests its own tasks; each seed's pairs, pooled (the largest
    # set of tasks alone was one seed's, while the note said the seeds were averaged)
    own = [run("protonets", 0, [0.9, 0.8], "s0"), run("protonets", 1, [0.7, 0.6], "s1"),
           run("maml_low", 0, [0.8, 0.8], "s0"), run("maml_low", 1, [0.5, 0.6], "s1")]
    # differences -0.1, 0, -0.2, 0: mean -0.075, sample std 0.0957, CI 3.182 * 0.0957 / 2
    assert paired_rows(own, "d")[1:] == [["B3", "maml_low", "protonets", "-7.50", "±15.23",
                                          "4"]]


def test_the_sweeps_status_lines_are_in_the_progress_format(tmp_path):
    from cfsl_jax.training import runs
    done, other = tiny_configs()[:2]
    sweep_dir = str(tmp_path / "sweep")
    runs.check_workdir_config(sweep_plan.run_dir(sweep_dir, done), done)
    with open(os.path.join(sweep_plan.run_dir(sweep_dir, done), "results.json"), "w") as f:
        json.dump({}, f)
    taken = dataclasses.replace(other, seed=other.seed + 7)  # another run's config in its folder
    runs.check_workdir_config(sweep_plan.run_dir(sweep_dir, other), taken)
    lines = []
    outcomes = sweep.run_sweep([done, other], sweep_dir, workers=0, log=lines.append)
    assert [o.status for o in outcomes] == ["skipped", "conflict"]
    assert lines[0].startswith("[sweep] conflict: ")
    assert lines[1:] == [f"[sweep] {sweep_dir}: 2 runs: 1 done before (skipped), 1 conflicting, "
                         f"0 to run"]


def test_launch_report_refuses_a_cell_of_two_experiments_in_one_line(tmp_path):
    """A sweep folder whose cell holds runs of two experiments is the user's input to fix: one
    ``error:`` line (a UserError), no traceback."""
    from launch_inprocess import command_module, run_in_process
    from test_cli import assert_error
    for seed, options in ((0, {}), (1, {"distance": "dot"})):
        (tmp_path / "sweep" / str(seed)).mkdir(parents=True)
        (tmp_path / "sweep" / str(seed) / "results.json").write_text(json.dumps(_result(
            "synthetic", "protonets", seed, 0.5, task="B3", learner_options=options)))
    with command_module("report") as module:
        outcome = run_in_process(module, "report", [f"--sweep_dir={tmp_path / 'sweep'}",
                                                    f"--out_dir={tmp_path / 'out'}"])
    assert_error(outcome, "synthetic/protonets/B3: the runs of seeds 0 and 1 differ in "
                          "learner_options, not only in their seed")


def test_a_sweep_stopped_by_sigterm_exits_with_its_status(monkeypatch, tmp_path):
    """SIGTERM while a sweep's run trains (in this process): the sweep's stop carries 143
    (128 + SIGTERM), which the command exits with, as launch.train's stop does. It was a bare
    KeyboardInterrupt: every sweep stop exited 130, as Ctrl-C's."""
    from cfsl_jax.training import train
    built = train.init_params

    def init_then_signal(*args, **kwargs):
        params = built(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the run: lands here, synchronously
        return params

    monkeypatch.setattr(train, "init_params", init_then_signal)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt) as stopped:
            sweep.run_sweep(tiny_configs()[:1], str(tmp_path / "sweep"), workers=0,
                            log=lambda line: None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert str(stopped.value).startswith("sweep interrupted: 0 of 1 runs finished")
    assert getattr(stopped.value, "exit_status", 130) == 128 + signal.SIGTERM
