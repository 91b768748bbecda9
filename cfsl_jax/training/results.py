"""Results of a run: results.json, a CSV row, a readable table.

``results.json`` records what is needed to reproduce and to check a run: the
seed, the spec, the dataset and its splits with their sizes, the package and
jax versions, the backend, and the test set's ``task_fingerprint``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any, Sequence

import jax

import cfsl_jax
from cfsl_jax.protocol import metrics
from cfsl_jax.runtime import backend, checksums, files, stops
# read_json: re-exported for training/'s readers of a workdir (loop, runs, experiments/)
from cfsl_jax.runtime.json_files import is_primary, read_json, write_json  # noqa: F401
from cfsl_jax.training.records import EvalRecord

CSV_FIELDS = ("learner", "dataset", "spec", "seed", "acc_mean", "acc_std", "acc_ci95",
              "ce_mean", "ce_std", "atm", "macs_per_task", "macs_per_meta_step",
              "wall_seconds", "retest")  # retest: 1 for a re-test's row (launch.evaluate)


def split_sizes(splits) -> dict[str, dict[str, int]]:
    return {name: {"classes": int(s.class_table.shape[0]), "images": int(s.images.shape[0])}
            for name, s in splits.items()}


PACKS_FILE = "packs.json"  # how a pack computed a run's steps (``record_steps``)


def record_steps(workdir: str, phase: str, from_step: int, pack: dict[str, Any] | None) -> None:
    """Note in ``workdir/packs.json`` that a session computes ``phase``'s steps from
    ``from_step`` on, in a pack (``pack``: its seeds, axis and steps per call) or alone
    (None). A pack's numbers equal its runs' solo numbers only up to the rounding of batched
    kernels, so a run says where a pack trained it; only runs a pack ever trained have the
    file. An entry of ``phase`` from ``from_step`` or later is replaced (a session's steps after
    its last checkpoint are redone by the next). ``results.json``'s ``packs`` copies the file."""
    path = files.join(workdir, PACKS_FILE)
    if (pack is None and not files.exists(path)) or not is_primary():
        return
    kept = [entry for entry in read_json(path, default=[])
            if entry["phase"] != phase or entry["from_step"] < from_step]
    write_json(path, [*kept, {"phase": phase, "from_step": from_step, "pack": pack}])


def record(config, learner, splits, report: EvalRecord, workdir: str,
           wall_seconds: float, best_epochs: list[int],
           compile_since: dict[str, float] | None = None,
           run_stats: dict[str, Any] | None = None, retest: bool = False,
           pack_test: bool = False) -> dict[str, Any]:
    """Write workdir/results.json (``test``: ``report.to_json()``) and workdir/results.csv,
    print the table; return the results.json dict.

    ``dataset`` is the variant the splits came from (``omniglot/small``, not ``omniglot``);
    ``compile_since``: ``backend.compile_totals()`` at the run's start (its own compile
    statistics are recorded, not the process's); ``run_stats`` (a re-test: the training run's
    compile statistics) replace them; ``retest``: the row is marked a re-test's; ``pack_test``:
    its pack's one program tested the run (``pack_eval.test_pack``: ``test_in_pack``)."""
    from cfsl_jax.training.evaluate import data_digest
    spec = learner.spec
    out = {
        "learner": learner.name,
        "dataset": splits["test"].info.dataset_variant,
        "spec": dataclasses.asdict(spec),
        "spec_name": spec.name,
        "seed": config.seed,
        "splits": split_sizes(splits),
        "image_shape": list(splits["test"].images.shape[1:]),
        "package_version": cfsl_jax.__version__,
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        **(backend.compile_stats(compile_since) if run_stats is None else run_stats),
        "devices": report.devices,
        "best_epochs": best_epochs,
        "wall_seconds": wall_seconds,
        "config": config.to_json(),
        "test": report.to_json(),
        "task_fingerprint": report.task_fingerprint,
        # the test data itself (class names, order, images), which the fingerprint is not
        "test_data_sha256": data_digest(splits["test"]),
        checksums.CLAIM: True,  # without its folder's checksums.json it is read as damaged
    }
    if report.atm is not None:
        out["macs_rule"] = metrics.MACS_RULE  # the rules its costs were counted by
    if pack_test:
        out["test_in_pack"] = True
    packs = read_json(files.join(workdir, PACKS_FILE), default=[])
    if packs:
        out["packs"] = packs
    if is_primary():
        with stops.deferred():  # results.json (the run is done) and its CSV row go together
            write_json(files.join(workdir, "results.json"), out)
            write_csv_row(files.join(workdir, "results.csv"), csv_row(out, retest))
        print(table(out))
    return out


def mend_csv(workdir: str, result: dict[str, Any]) -> None:
    """Write ``workdir``'s results.csv from its results.json dict ``result`` when it is missing
    (a kill landed between the two writes: the finished run is not written again)."""
    path = files.join(workdir, "results.csv")
    if is_primary() and not files.exists(path):
        retest = result.get("test", {}).get("retest_compile_seconds") is not None
        write_csv_row(path, csv_row(result, retest))


def test_record(result: dict[str, Any]) -> EvalRecord:
    """The test metrics of a results.json dict, as a record."""
    return EvalRecord.from_json(result["test"])


def csv_row(result: dict[str, Any], retest: bool = False) -> dict[str, Any]:
    test = test_record(result)
    row = {"learner": result["learner"], "dataset": result["dataset"],
           "spec": result["spec_name"], "seed": result["seed"],
           "wall_seconds": round(result["wall_seconds"], 2), "retest": int(retest)}
    for field in CSV_FIELDS:
        if field not in row:
            row[field] = test.get(field, "")
    return row


def write_csv_row(path: str, row: dict[str, Any]) -> None:
    """Add a row (the header first if the file is new); a row the file holds already (a
    second re-test with the same numbers) is not added again. The file is replaced whole
    (``files.write_atomic``), never appended to: a kill or a full disk leaves it as it was. A
    last row without its line end (an append of an older version cut short) is dropped, not
    glued to the new row; a file written before a column was added gets it (``retest`` 0 for
    its rows)."""
    existing = files.read_text(path) if files.exists(path) else ""
    if existing and not existing.endswith("\n"):
        existing = existing[:existing.rfind("\n") + 1]
    if existing and existing.splitlines()[0] != ",".join(CSV_FIELDS):
        rows = [{**dict.fromkeys(CSV_FIELDS, ""), "retest": 0, **old}
                for old in csv.DictReader(io.StringIO(existing))]
        existing = csv_text([{k: r[k] for k in CSV_FIELDS} for r in rows], CSV_FIELDS)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=CSV_FIELDS)
    writer.writerow(row)
    if text.getvalue().rstrip("\r\n") in existing.splitlines()[1:]:
        return
    files.write_atomic(path, existing + text.getvalue() if existing else
                       csv_text([row], CSV_FIELDS))


def csv_text(rows: Sequence[dict[str, Any]], fields: Sequence[str] | None = None) -> str:
    """``rows`` as CSV text with a header (``fields``, default the first row's keys)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(fields or rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def table(result: dict[str, Any]) -> str:
    """A readable summary of one run's test metrics."""
    test = test_record(result)
    lines = [f"{result['learner']} on {result['dataset']} {result['spec_name']} "
             f"seed {result['seed']} ({test.num_tasks} test tasks)",
             f"  accuracy       {test.acc_mean:.4f} ± {test.acc_std:.4f} "
             f"(95% CI ± {test.acc_ci95:.4f})",
             f"  cross-entropy  {test.ce_mean:.4f} ± {test.ce_std:.4f}"]
    if test.group_acc:
        lines.append("  per-group acc  " + " ".join(f"{a:.3f}" for a in test.group_acc))
    if test.atm is not None:
        lines.append(f"  ATM            {test.atm:.4g}")
        lines.append(f"  MACs per task  {test.macs_per_task:.4g} "
                     f"(init + adapt {test.macs_adapt:.4g} x NSS + predict "
                     f"{test.macs_predict:.4g})")
    if test.macs_per_meta_step is not None:
        lines.append(f"  MACs per meta-training step per task  {test.macs_per_meta_step:.4g}")
    lines.append(f"  task fingerprint {result['task_fingerprint'][:16]}…  "
                 f"wall time {result['wall_seconds']:.1f}s")
    return "\n".join(lines)
