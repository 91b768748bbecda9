"""The typed record of one evaluation: what ``evaluate.evaluate`` returns and results.json's
``test`` entry holds.

    record = evaluate(learner, params, split, num_tasks=600)
    record.acc_mean, record.task_fingerprint, record.dataset_identity
    record.to_json()                       # the dict results.json stores
    EvalRecord.from_json(stored["test"])   # a results.json entry, old or new, as a record

``to_json`` leaves out the fields that were not measured (None), so a file
holds exactly the keys it always held; ``from_json`` reads every file the
package has written (a field a file lacks is None). ``record["acc_mean"]``
reads a field by name, as the dict it replaces.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class EvalRecord:
    """A learner's test (or validation) metrics over a fixed set of tasks."""

    acc_mean: float
    acc_std: float  # over tasks (ddof=0)
    acc_ci95: float  # normal 95% half-width 1.96 std / sqrt(num_tasks)
    ce_mean: float
    ce_std: float
    ce_ci95: float
    group_acc: tuple[float, ...]  # mean accuracy per class group
    num_tasks: int
    devices: int
    task_fingerprint: str  # evaluate.task_fingerprint of these tasks
    seconds: float
    tasks_per_s: float
    dataset_identity: str | None = None  # evaluate.dataset_identity of the split (None: older)
    atm: float | None = None  # None: cost metrics not measured
    macs_adapt: float | None = None
    macs_predict: float | None = None
    macs_per_task: float | None = None
    macs_per_meta_step: float | None = None  # meta-trained learners, after training
    retest_compile_seconds: float | None = None  # a re-test's own compile seconds
    per_task: Mapping[str, list[float]] | None = None  # {"acc", "ce"}: each task's, in order
    pack_runs: int | None = None  # evaluate(runs=True): the runs its one program evaluated
    tasks_in_turn: bool | None = None  # each device ran its tasks one at a time (else one
    # vmap); None: recorded before 2026-11-28 (one at a time then: per-task-weight learners on CPU)

    def __getitem__(self, name: str) -> Any:
        if name not in _FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        value = getattr(self, name, None) if name in _FIELDS else None
        return default if value is None else value

    def __contains__(self, name: str) -> bool:
        return name in _FIELDS and getattr(self, name) is not None

    def replace(self, **changes: Any) -> "EvalRecord":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The JSON dict (fields that are None left out; ``group_acc`` a list)."""
        out = {}
        for field in _FIELDS:
            value = getattr(self, field)
            if value is not None:
                out[field] = list(value) if field == "group_acc" else value
        return out

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> "EvalRecord":
        """A record from a results.json ``test`` entry (keys it does not know are ignored)."""
        values = {field: stored[field] for field in _FIELDS if field in stored}
        values["group_acc"] = tuple(values.get("group_acc", ()))
        for field in _REQUIRED:
            values.setdefault(field, None)
        return cls(**values)


_FIELDS = tuple(field.name for field in dataclasses.fields(EvalRecord))
_REQUIRED = tuple(field.name for field in dataclasses.fields(EvalRecord)
                  if field.default is dataclasses.MISSING)
