"""Reference results as data: a sweep folder exported to ``docs/reference`` (small files only).

    from cfsl_jax.experiments import reference
    rows = reference.export("/work/reference_runs", "docs/reference")   # results.csv + runs/
    rows = reference.read_rows("docs/reference/results.csv")

Rules:

- One row per run of the sweep folder (any folder under it with a ``config.json``):
  ``complete`` where it has ``results.json``, ``partial`` where it has only a
  validation curve so far (its test columns are empty). ``COLUMNS`` lists the columns.
- Each run's ``results.json`` (with its per-task test accuracy and cross-entropy, what
  paired differences need), ``val_history.json`` and ``config.json`` are copied as they
  are to ``runs/<budget>/<dataset as the sweep names it>/<learner>/<cell>/seed<k>/`` (never
  a checkpoint; a partial run keeps its folder and row when it completes; a run of another
  setting than the default, an ``--as_published`` preset or other learner options, has a
  folder of its own, ``seed<k>-<setting>``: ``reference_folders``), so
  the numbers of a row are the bytes ``launch.verify --workdir=W`` checks:
  ``launch.verify --workdir=W --reference_csv=docs/reference/results.csv`` also checks
  that the row of W equals W's results.json (``row_differences``).
- ``cell``: the cell the run is reported under (``cells.cell_of``, as ``launch.report``):
  its config's task, or its own spec name where spec overrides make another task
  (``--task=B3 --overwrite --nss=5`` is a C5 task), which no Table 1 cell has; a partial
  run's from its config.json. Its folder under ``runs/`` keeps the config's task.
- ``table.md`` beside the CSV, the grid at a glance, is ``reference_report.write_table``'s.
- ``preset``: the ``--as_published`` preset whose settings the run carries
  (``as_published.preset_of``); ``none`` where no preset's settings are all there (the
  ``options`` column shows those that differ from the defaults).
- ``budget``: the name of the run's schedule (``budgets.name_of``: ``paper``,
  ``default``, ``quick``) or ``EPOCHSxSTEPSxBATCH``; ``paper_budget`` says whether it is
  the paper's. ``training_tasks``: tasks the run trained (or pretrained) on, epochs
  done x steps x meta-batch; 0 for a learner that trains nothing (Init+Tune, EWC-Init).
- ``commit``: the code's commit, from the sweep folder's ``provenance.jsonl`` (appended to
  by ``benchmarks/reference/run_cpu.sh``): the last invocation covering the run that
  started before the run's last file was written; ``unknown`` without one. Its last line
  cut short (a kill, a full disk) is dropped; a damaged line before it is refused in one
  line naming it (``read_provenance``).
- Exporting into a folder that already holds rows keeps the rows of other runs (another
  sweep folder: a GPU grid at the paper's budget) and replaces those of the same run.
- One export at a time writes into a folder (its lock, ``EXPORT_LOCK``: a second is refused
  in one line naming the holder, never interleaved); each file is replaced atomically.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Sequence

from cfsl_jax.experiments import reference_folders
from cfsl_jax.experiments.cells import cell_of
from cfsl_jax.experiments.cells import cell_order, learner_order
from cfsl_jax.runtime import checksums, files, locks
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import as_published, budgets
from cfsl_jax.training import results as results_io
from cfsl_jax.training.config import TrainConfig, from_json, resolved

COLUMNS: tuple[str, ...] = (
    "learner", "dataset", "cell", "seed", "budget", "paper_budget", "status", "preset",
    "options", "epochs", "iters_per_epoch", "meta_batch", "training_tasks", "val_tasks",
    "epochs_done", "val_acc_first", "val_acc_best", "val_acc_last", "test_tasks", "test_acc_mean",
    "test_acc_std", "test_acc_ci95", "test_ce_mean", "task_fingerprint", "commit", "device",
    "wall_seconds", "run")
# results.json's test field behind each test column (row_differences compares them)
TEST_FIELDS = {"test_acc_mean": "acc_mean", "test_acc_std": "acc_std",
               "test_acc_ci95": "acc_ci95", "test_ce_mean": "ce_mean"}
RUN_FILES = ("results.json", "val_history.json", "config.json")
EXPORT_LOCK = ".export.lock"  # an export's lock in its output folder, while it writes
SKIPPED = ("checkpoints", "xla_cache", "tensorboard", "report", "tensorflow_datasets")


def budget_name(config: TrainConfig) -> str:
    """``paper``/``default``/``quick`` where the schedule is one of them, else ExSxB."""
    return budgets.name_of(config) or \
        f"{config.epochs}x{config.iters_per_epoch}x{config.meta_batch}"


def _training(learner: str) -> str:
    from cfsl_jax.experiments.report import _pretrains
    from cfsl_jax.learners import get_learner
    from cfsl_jax.protocol.spec import TaskSpec
    return "pretrain" if _pretrains(learner) else \
        get_learner(learner, TaskSpec.preset("B3")).recipe.training


def training_tasks(config: TrainConfig, epochs_done: int) -> int:
    """Tasks trained (or pretrained) on in ``epochs_done`` epochs; 0 for a learner that does
    not train, or pretrains on uniformly drawn images."""
    kind = _training(config.learner)
    if kind == "none" or (kind == "pretrain" and config.pretrain_data != "tasks"):
        return 0
    return epochs_done * config.iters_per_epoch * config.meta_batch


PROVENANCE_FILE = "provenance.jsonl"
PROVENANCE_KEYS = ("start", "commit", "learners", "cell", "seeds")  # what ``_commit`` reads


def read_provenance(sweep_dir: str) -> list[dict]:
    """The invocations in ``sweep_dir/provenance.jsonl`` ([] without one). Its last line cut
    short by a kill or a full disk (no newline, not JSON) is dropped; any other line that is
    not an invocation (damaged, or edited) is a ``UserError`` naming the file and the line."""
    path = files.join(sweep_dir, PROVENANCE_FILE)
    if not files.exists(path):
        return []
    text = files.read_bytes(path).decode(errors="replace")
    lines = text.split("\n")
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the last, without its newline: an append cut short
                continue
            entry = None
        problem = _provenance_problem(entry)
        if problem:
            raise UserError(f"{path} line {number} {problem} (damaged or edited): repair or "
                            f"delete that line (the runs it covered are then exported with "
                            f"commit unknown)")
        entries.append(entry)
    return entries


def _provenance_problem(entry: Any) -> str | None:
    """What is wrong with a provenance line's JSON (None: an invocation ``_commit`` reads)."""
    from datetime import datetime
    if not isinstance(entry, dict):
        return "is not a JSON object"
    missing = [key for key in PROVENANCE_KEYS if not isinstance(entry.get(key), str)]
    if missing:
        return f"lacks {', '.join(missing)} (strings)"
    try:
        datetime.strptime(entry["start"], "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return f"has start {entry['start']!r}, not YYYY-MM-DDTHH:MM:SSZ"
    return None


def _commit(invocations: Sequence[dict], config: TrainConfig, finished: float) -> str:
    """The commit of the last invocation covering the run that started before ``finished``."""
    from datetime import datetime, timezone
    found = "unknown"
    for entry in invocations:
        start = datetime.strptime(entry["start"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=timezone.utc).timestamp()
        if (config.learner in entry["learners"].split(",") and entry["cell"] == config.task
                and str(config.seed) in entry["seeds"].split(",") and start <= finished):
            found = entry["commit"]
    return found


def run_dirs(sweep_dir: str) -> list[str]:
    """Every run folder under ``sweep_dir`` (a folder holding ``config.json``), sorted."""
    return sorted(root for root, _, names in files.walk(sweep_dir, skip=SKIPPED)
                  if "config.json" in names)


def _data_key(config: TrainConfig) -> str:
    return json.dumps([config.dataset, config.dataset_options], sort_keys=True)


def _changed_options(config: TrainConfig) -> dict[str, Any]:
    """The run's learner options that differ from today's defaults (config.json records them
    all; a run that ran a default since changed shows it)."""
    defaults = resolved(config.learner, {})
    return {k: v for k, v in config.learner_options.items() if defaults.get(k) != v}


def run_row(workdir: str, invocations: Sequence[dict] = (),
            variants: dict[str, str] | None = None) -> dict[str, Any]:
    """The row of one run folder (complete or partial); ``run`` is its folder under runs/.
    ``variants``: the dataset variant (results.json's ``dataset``) of each ``_data_key``,
    for a partial run (the variant is known once a run has finished)."""
    config_json = results_io.read_json(files.join(workdir, "config.json"))
    config = from_json(config_json)
    history = results_io.read_json(files.join(workdir, "val_history.json"), default=[])
    result = results_io.read_json(files.join(workdir, "results.json"), default={})
    val = [entry["val_acc"] for entry in history if "val_acc" in entry]
    budget = budget_name(config)
    last = max(os.path.getmtime(files.join(workdir, name)) for name in RUN_FILES
               if files.exists(files.join(workdir, name)))
    # the cell it is reported under (cells.cell_of): a partial run's from its config.json
    row = {"learner": config.learner, "cell": cell_of(result or {"config": config_json}),
           "seed": config.seed,
           "dataset": result["dataset"] if result else
           (variants or {}).get(_data_key(config), config.dataset),
           "budget": budget, "paper_budget": budget == "paper",
           "status": "complete" if result else "partial",
           "preset": as_published.preset_of(config),
           "options": json.dumps({**config.dataset_options, **config.spec_overrides,
                                  **_changed_options(config)}, sort_keys=True),
           "epochs": config.epochs, "iters_per_epoch": config.iters_per_epoch,
           "meta_batch": config.meta_batch,
           "training_tasks": training_tasks(config, config.epochs if result else len(history)),
           "val_tasks": config.val_tasks, "epochs_done": len(history),
           "val_acc_first": val[0] if val else "", "val_acc_best": max(val) if val else "",
           "val_acc_last": val[-1] if val else "", "test_tasks": config.test_tasks,
           "commit": _commit(invocations, config, last)}
    if result:
        test = result["test"]
        row.update({column: test[field] for column, field in TEST_FIELDS.items()})
        row.update(task_fingerprint=result["task_fingerprint"],
                   device=f"{result['backend']} x{result['devices']}",
                   wall_seconds=round(result["wall_seconds"], 1))
    # the sweep's own layout (config.dataset), so a run keeps its folder when it completes
    row["run"] = reference_folders.run_folder(config, budget)  # its setting, where not default
    return {column: row.get(column, "") for column in COLUMNS}


def _sort_key(row: dict, cells: list[str], learners: list[str]) -> tuple:
    return (row["dataset"], row["budget"], cells.index(row["cell"]),
            learners.index(row["learner"]), int(row["seed"]))


def sorted_rows(rows: Iterable[dict]) -> list[dict]:
    """Rows by dataset, budget, cell (the paper's grid order), learner (registry order), seed."""
    rows = list(rows)
    cells = cell_order(row["cell"] for row in rows)
    learners = learner_order(row["learner"] for row in rows)
    return sorted(rows, key=lambda row: _sort_key(row, cells, learners))


LATER_COLUMNS = ("preset",)  # columns a reference CSV written before them lacks


def read_rows(csv_path: str) -> list[dict[str, str]]:
    """The rows of a reference ``results.csv`` (strings, as written); a file that is not one
    (not UTF-8 text, or without its columns: a run's own results.csv, say) is refused in one
    line (UserError) naming it and what it lacks."""
    import csv
    import io
    try:
        reader = csv.DictReader(io.StringIO(files.read_text(csv_path)))
        rows, header = list(reader), reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as error:
        raise UserError(f"{csv_path} is not a reference results.csv ({error})") from None
    missing = [c for c in COLUMNS if c not in header and c not in LATER_COLUMNS]
    if missing:
        raise UserError(f"{csv_path} is not a reference results.csv (written by "
                        f"benchmarks.reference.export): it has no column "
                        f"{', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}")
    return rows


def remaining(rows: Iterable[dict[str, str]], budget: str, learners: str, cell: str,
              seeds: str, dataset: str = "omniglot/full") -> list[str]:
    """The comma-separated ``learners`` that lack a complete row (``dataset``'s variants,
    ``cell``, ``budget``) for one of the comma-separated ``seeds``, in the order given: what a
    sweep on another machine still has to run (``benchmarks/reference/run_cpu.sh``)."""
    done = {(row["learner"], int(row["seed"])) for row in rows
            if row["status"] == "complete" and row["budget"] == budget and row["cell"] == cell
            and row["dataset"].split("_")[0] == dataset}
    wanted = [int(seed) for seed in seeds.split(",")]
    return [learner for learner in learners.split(",")
            if any((learner, seed) not in done for seed in wanted)]


def export(sweep_dir: str, out_dir: str,
           table: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Write ``out_dir/results.csv`` and ``out_dir/runs/...`` from ``sweep_dir`` (``table``: and
    what ``table(out_dir)`` writes, e.g. ``reference_report.write_table``'s table.md, under the
    same lock; passed in, as reference_report imports this module); the rows. Every run file is
    read and checked first; then the writes, under ``out_dir``'s lock (``EXPORT_LOCK``: a second
    export into it is refused, ``locks.Busy`` naming the holder), each file replaced
    atomically."""
    invocations = read_provenance(sweep_dir)
    variants = {}
    for workdir in run_dirs(sweep_dir):
        found = results_io.read_json(files.join(workdir, "results.json"), default={})
        if found:
            variants[_data_key(from_json(found["config"]))] = found["dataset"]
    rows = [run_row(workdir, invocations, variants) for workdir in run_dirs(sweep_dir)]
    if not rows:
        raise FileNotFoundError(f"no run (a folder with config.json) under {sweep_dir!r}")
    copies = {}  # every run file checked against its checksum before anything is written
    for workdir, row in zip(run_dirs(sweep_dir), rows):
        for name in RUN_FILES:
            source = files.join(workdir, name)
            if files.exists(source):
                text = files.read_text(source)
                checksums.check_text(source, text)
                copies[files.join(out_dir, row["run"], name)] = text
    with locks.held(locks.path_in(out_dir, EXPORT_LOCK), f"reference folder {out_dir}"):
        # no run lands in a folder of another run (another setting: reference_folders); under
        # the lock, so that no other export fills the folder between the check and the writes
        reference_folders.check_targets(out_dir, run_dirs(sweep_dir),
                                        [row["run"] for row in rows])
        for target, text in copies.items():  # copied with their own checksums
            files.makedirs(files.dirname(target))
            checksums.write_text(target, text)
        csv_path = files.join(out_dir, "results.csv")
        ours = {row["run"] for row in rows}
        kept = [_with_columns(row, out_dir) for row in read_rows(csv_path)
                if row["run"] not in ours] if files.exists(csv_path) else []
        rows = sorted_rows([*kept, *rows])
        files.write_atomic(csv_path, results_io.csv_text(rows, COLUMNS))
        if table is not None:
            table(out_dir)
    return rows


def _with_columns(row: dict[str, str], out_dir: str) -> dict[str, Any]:
    """A kept row written before a column existed, with that column filled from its run's
    copied config.json (``preset``), and its ``cell`` as ``run_row`` names it now (a row
    written before the cell was ``cells.cell_of``'s)."""
    config_json = results_io.read_json(files.join(out_dir, row["run"], "config.json"),
                                       default={})
    if not config_json:  # no copied files (a hand-made row): kept as it is
        return row
    result = results_io.read_json(files.join(out_dir, row["run"], "results.json"), default={})
    row = {**row, "cell": cell_of(result or {"config": config_json})}
    if "preset" not in row:
        row = {**row, "preset": as_published.preset_of(from_json(config_json))}
    return row


def row_differences(row: dict[str, str], result: dict[str, Any]) -> list[str]:
    """How a results.csv row differs from the run's results.json (empty: the same numbers)."""
    differences = []
    for column, field in TEST_FIELDS.items():
        if row[column] == "" or float(row[column]) != float(result["test"][field]):
            differences.append(f"{column}: row {row[column]!r}, results.json "
                               f"{result['test'][field]!r}")
    if row["task_fingerprint"] != result["task_fingerprint"]:
        differences.append(f"task_fingerprint: row {row['task_fingerprint']!r}, results.json "
                           f"{result['task_fingerprint']!r}")
    return differences


def find_row(rows: Sequence[dict[str, str]], result: dict[str, Any]) -> dict[str, str] | None:
    """The complete row of the run ``result`` (a results.json) came from, or None."""
    config = from_json(result["config"])
    for row in rows:
        if (row["status"] == "complete" and row["learner"] == result["learner"]
                and row["dataset"] == result["dataset"] and row["cell"] == cell_of(result)
                and int(row["seed"]) == config.seed and row["budget"] == budget_name(config)
                and row.get("run", "") in ("", reference_folders.run_folder(
                    config, budget_name(config)))):  # its setting's row
            return row
    return None
