"""A run's scalars, for a researcher to watch: JSON lines, and TensorBoard or W&B when asked.

    tracking = Tracking(workdir, tensorboard=True)
    tracking.scalars("train", step, {"loss": 0.41, "acc": 0.88, "steps_per_s": 3.2})
    tracking.close()

Every record is one line of ``workdir/metrics.jsonl``: ``{"phase": ..., "step": ..., "time":
unix seconds, <name>: <value>, ...}``. Phases: ``train`` / ``pretrain`` (the mean loss and
accuracy of the steps since the last record, the last step's loss, steps/s; a record per log
interval), ``val`` (accuracy and cross-entropy after each epoch), ``test`` (the test metrics,
per-group accuracy as ``group_acc_<g>``). A resumed run first drops the records of the steps
after the one it resumed from (``rewind``: a kill between two checkpoints left them, and they
are redone), then appends: no step is recorded twice.

The file is sealed (``checksums.seal_appended``: its length and SHA-256 in the workdir's
``checksums.json``) at every checkpoint (``seal``: the first reads the file, later ones
extend a running digest of the lines this run appended) and when the run ends (``close``); every
read checks that part (``read``: ``checksums.Corrupt``, one line naming the file, for a
changed number), the lines after it (a kill's) are read as they are, a line cut short
skipped. A rewind checks the file, then replaces it with its new seal
(``checksums.replace_appended``). A file deleted by hand has its seal dropped when the run
resumes (its records start again); a file written before seals is read unchecked.

``tensorboard=True`` also writes TensorBoard event files to ``workdir/tensorboard`` with
tensorboardX (the ``[tracking]`` extra; no TensorFlow), tag ``<phase>/<name>`` (``epoch``, an
index rather than a curve, only in the JSON lines), and the run's config: as text (tag
``config``, its config.json) and as TensorBoard hyperparameters (the HParams tab, one column
per config field, so runs can be compared by what they ran);
``wandb_project`` logs the same scalars to a Weights & Biases run of that project (``wandb``
installed separately), named after the workdir.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from typing import Any, Mapping

from cfsl_jax.runtime import checksums, files
from cfsl_jax.training import results
from cfsl_jax.runtime.errors import UserError

METRICS_FILE = "metrics.jsonl"
NOT_CURVES = ("epoch",)  # indices of a record, not plotted (they stay in the JSON lines)
HPARAM_METRICS = ("test/acc_mean", "test/ce_mean", "val/acc")  # the HParams tab's columns
ADVICE = ("restore it, or delete it and run the same command again (its records so far are "
          "lost; the run's numbers are in its results.json and val_history.json)")


def _optional(module: str, flag: str, package: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise UserError(f"{flag} needs the {package} package, which is not installed: "
                        f"pip install {package}") from None


class Tracking:
    """The scalar sinks of one run (``workdir`` None: none)."""

    def __init__(self, workdir: str | None, tensorboard: bool = False,
                 wandb_project: str | None = None, config: Mapping[str, Any] | None = None):
        self.path = files.join(workdir, METRICS_FILE) if workdir else None
        self.writer = self.wandb_run = None
        self._digest: checksums.RunningDigest | None = None  # of the lines this run appended
        primary = results.is_primary()
        if workdir and tensorboard and primary:
            writer = _optional("tensorboardX", "--tensorboard", "tensorboardX")
            self.writer = writer.SummaryWriter(logdir=files.join(workdir, "tensorboard"))
            if config:
                _write_config(self.writer, config)
        if workdir and wandb_project and primary:
            wandb = _optional("wandb", "--wandb_project", "wandb")
            self.wandb_run = wandb.init(project=wandb_project, name=files.basename(
                files.absolute(workdir)), config=dict(config or {}))
        if not primary:
            self.path = None
        if self.path and not files.isfile(self.path):
            checksums.forget_appended(self.path)  # deleted: its records start again

    def scalars(self, phase: str, step: int, values: Mapping[str, Any]) -> None:
        """Record ``values`` (numbers, or lists of numbers: one scalar per entry) at ``step``."""
        flat = {}
        for name, value in values.items():
            if isinstance(value, (list, tuple)):
                flat.update({f"{name}_{i}": float(v) for i, v in enumerate(value)})
            elif isinstance(value, numbers.Real):
                flat[name] = value if isinstance(value, int) else float(value)
        if self.path:
            line = {"phase": phase, "step": int(step), "time": round(time.time(), 3), **{
                k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                for k, v in flat.items()}}
            text = json.dumps(line, sort_keys=True) + "\n"
            files.append_text(self.path, text)
            if self._digest is not None:
                self._digest.update(text.encode())
        if self.writer is not None:
            for name, value in flat.items():
                if name in NOT_CURVES:
                    continue
                self.writer.add_scalar(f"{phase}/{name}", value, int(step))
            self.writer.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({f"{phase}/{name}": v for name, v in flat.items()}, step=int(step))

    def rewind(self, phase: str, step: int) -> None:
        """A resume of ``phase`` at ``step``: its records (and its ``val`` records) of later
        steps, written before a kill, are dropped (they are redone), in metrics.jsonl and in
        TensorBoard (``purge_step``); W&B starts a new run per process anyway."""
        if not self.path or not files.isfile(self.path):
            return
        data, sealed = checksums.read_appended(self.path, ADVICE)
        kept, kept_sealed, at = [], 0, 0
        lines = _lines(data)
        for line in lines:
            at += len(line)
            if line.endswith(b"\n") and not _after(line, phase, step):
                kept.append(line)
                kept_sealed += len(line) if at <= sealed else 0
        if len(kept) == len(lines):
            return
        checksums.replace_appended(self.path, b"".join(kept), kept_sealed)
        self._digest = None  # the next seal reads the file again
        if self.writer is not None:  # TensorBoard hides the events of the purged steps
            logdir = self.writer.logdir
            self.writer.close()
            self.writer = type(self.writer)(logdir=logdir, purge_step=step + 1)

    def recorded(self, phase: str, step: int, name: str) -> Any:
        """The value of ``name`` in the last ``phase`` record at ``step``, or None."""
        found = None
        for record in read(self.path) if self.path else ():
            if record.get("phase") == phase and record.get("step") == step and name in record:
                found = record[name]
        return found

    def seal(self) -> None:
        """Seal the records so far (a checkpoint was written): readers check them from now."""
        if self.path:
            self._digest = checksums.seal_appended(self.path, self._digest)

    def close(self) -> None:
        self.seal()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``config`` flattened to TensorBoard hyperparameters: nested mappings as ``a.b``, numbers,
    strings and booleans kept, anything else (lists, None) as its JSON text."""
    flat: dict[str, Any] = {}
    for name, value in config.items():
        if isinstance(value, Mapping):
            flat.update(hparams(value, f"{prefix}{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[f"{prefix}{name}"] = value
        else:
            flat[f"{prefix}{name}"] = json.dumps(value)
    return flat


def _write_config(writer: Any, config: Mapping[str, Any]) -> None:
    """The run's config into ``writer``'s event file: text (tag ``config``) and hparams."""
    from tensorboardX.summary import hparams as hparams_summaries

    text = json.dumps(dict(config), indent=2, sort_keys=True)
    writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)  # Markdown code
    experiment, session_start, _ = hparams_summaries(hparams(config),
                                                     dict.fromkeys(HPARAM_METRICS, 0.0))
    for summary in (experiment, session_start):  # the session's end: when the run's files end
        writer._get_file_writer().add_summary(summary)
    writer.flush()


def _after(line: bytes, phase: str, step: int) -> bool:
    """Whether ``line`` is a record of ``phase`` (or its validation) after ``step``, or a line
    cut short by a kill."""
    try:
        record = json.loads(line)
    except ValueError:
        return True
    return not isinstance(record, dict) or (
        record.get("phase") in (phase, "val") and record.get("step", 0) > step)


def _lines(data: bytes) -> list[bytes]:
    """``data``'s lines, each with its newline (the last one without, if it has none)."""
    parts = data.split(b"\n")
    return [part + b"\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def read(path: str) -> list[dict[str, Any]]:
    """The records of a metrics file, its sealed part checked (``checksums.Corrupt``: one line
    naming it); a line cut short by a kill (after the seal) is skipped."""
    if not files.isfile(path):
        return []
    records = []
    for line in _lines(checksums.read_appended(path, ADVICE)[0]):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
