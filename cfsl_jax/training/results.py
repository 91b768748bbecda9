"""Results of a run: results.json, a CSV row, a readable table.

``results.json`` records what is needed to reproduce and to check a run: the
seed, the spec, the dataset and its splits with their sizes, the package and
jax versions, the backend, and the test set's ``task_fingerprint``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import io
from typing import Any, Sequence

import jax

import cfsl_jax
from cfsl_jax.runtime import backend, checksums, files
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training.records import EvalRecord

CSV_FIELDS = ("learner", "dataset", "spec", "seed", "acc_mean", "acc_std", "acc_ci95",
              "ce_mean", "ce_std", "atm", "macs_per_task", "macs_per_meta_step",
              "wall_seconds")


def is_primary() -> bool:
    """Whether this process writes files (the first host of a multi-host run)."""
    return jax.process_index() == 0


def write_json(path: str, payload: Any) -> None:
    """Write JSON atomically (``files.write_atomic``: a temporary file renamed), so a kill never
    leaves half a file, on a local disk or on gs://; a run's config.json, val_history.json and
    results.json with their SHA-256 (``checksums``: checked by ``read_json``).

    Only the primary process writes (every host of a multi-host run computes the same).
    """
    if not is_primary():
        return
    checksums.write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def read_json(path: str, default: Any = None) -> Any:
    """The JSON in ``path`` (``default`` when it does not exist and one is given); a file that is
    not valid JSON (truncated, corrupt), or that fails its recorded checksum
    (``checksums.Corrupt``), is a UserError naming it and what to do."""
    if not files.exists(path):
        if default is not None:
            return default
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(checksums.read_checked(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid JSON (truncated or corrupt: {error}); delete it to "
                        f"let the command write it again, or give another folder") from None


def split_sizes(splits) -> dict[str, dict[str, int]]:
    return {name: {"classes": int(s.class_table.shape[0]), "images": int(s.images.shape[0])}
            for name, s in splits.items()}


def record(config, learner, splits, report: EvalRecord, workdir: str,
           wall_seconds: float, best_epochs: list[int],
           compile_since: dict[str, float] | None = None,
           run_stats: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write workdir/results.json (``test``: ``report.to_json()``) and workdir/results.csv,
    print the table; return the results.json dict.

    ``dataset`` is the variant the splits came from (``omniglot/small``, not ``omniglot``);
    ``compile_since``: ``backend.compile_totals()`` at the run's start (its own compile
    statistics are recorded, not the process's); ``run_stats`` (a re-test: the training run's
    compile statistics) replace them."""
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
    }
    if is_primary():
        write_json(files.join(workdir, "results.json"), out)
        write_csv_row(files.join(workdir, "results.csv"), csv_row(out))
        print(table(out))
    return out


def test_record(result: dict[str, Any]) -> EvalRecord:
    """The test metrics of a results.json dict, as a record."""
    return EvalRecord.from_json(result["test"])


def csv_row(result: dict[str, Any]) -> dict[str, Any]:
    test = test_record(result)
    row = {"learner": result["learner"], "dataset": result["dataset"],
           "spec": result["spec_name"], "seed": result["seed"],
           "wall_seconds": round(result["wall_seconds"], 2)}
    for field in CSV_FIELDS:
        if field not in row:
            row[field] = test.get(field, "")
    return row


def write_csv_row(path: str, row: dict[str, Any]) -> None:
    """Append a row (writing the header first if the file is new)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=CSV_FIELDS)
    if not files.exists(path):
        writer.writeheader()
    writer.writerow(row)
    files.append_text(path, text.getvalue())


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
                     f"(adapt {test.macs_adapt:.4g} x NSS + predict "
                     f"{test.macs_predict:.4g})")
    if test.macs_per_meta_step is not None:
        lines.append(f"  MACs per meta-training step per task  {test.macs_per_meta_step:.4g}")
    lines.append(f"  task fingerprint {result['task_fingerprint'][:16]}…  "
                 f"wall time {result['wall_seconds']:.1f}s")
    return "\n".join(lines)
