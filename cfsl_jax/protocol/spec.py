"""TaskSpec: the numbers that define a continual few-shot learning task.

A CFSL task is ``nss`` support sets seen one at a time, then one target set
(the rules: ``cfsl_jax/protocol/sampler.py``; the settings against the paper and the
authors' code: ``docs/fidelity.md``). ``TaskSpec`` is a frozen, validated,
hashable dataclass, so it can be a static argument of ``jax.jit``.

        spec = TaskSpec(nss=10, nc=5, ks=1, kt=5, cci=1, overwrite=False)
        spec = TaskSpec.preset("D8")          # a cell of the paper's grid
        spec = TaskSpec.preset("B", nss=7)    # a task type with overrides

Task types: A new samples (cci >= nss, overwrite), B new classes (cci=1, no
overwrite), C new classes with overwrite (cci=1, overwrite), D new classes
and samples (1 < cci < nss, no overwrite).

Labels without overwrite (``label_offset``): ``"per_class_group"`` (default, the
specification) labels class group g with g*NC..g*NC+NC-1, so every support set
of a group shows its classes under the same labels. ``"per_support_set"`` is
what the authors' paper-era code did (docs/fidelity.md): support set n, and its target part, are labelled n*NC..n*NC+NC-1, so
when CCI > 1 one class carries a different label in each support set of its
group, ``num_outputs`` becomes NSS*NC, and a learner can be right on at most one
of the m = min(CCI, NSS) labels of a class: the published D accuracies (every
Omniglot D cell of Table 1 is below 50 %) reflect it. It only changes tasks with
overwrite False and CCI > 1, and needs ``target_mode="per_support_set"`` there
(a per_class target sample would have no single label).

Samples (``draws``): ``"distinct"`` (default, the specification): no sample
appears twice in a task. ``"per_group"`` (the authors' Apr-2020 code, commit
5b814ac, ``data.py`` ``get_set``): each class of a group gives KS+KT samples once,
and every support set of the group (and its target part) reuses them.
``"independent"`` (the Feb-2020 code, commit 39025a3, ``data.py`` ``get_set``
called once per support set): each group draws its NC classes on its own (a
class can recur in a later group, under another label), and each support set
draws fresh KS+KT samples of its group's classes; it needs
``target_mode="per_support_set"``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Literal

from cfsl_jax.runtime import naming
from cfsl_jax.runtime.options import check_limits, option

TargetMode = Literal["per_support_set", "per_class"]
TARGET_MODES: tuple[str, ...] = ("per_support_set", "per_class")
LabelOffset = Literal["per_class_group", "per_support_set"]
LABEL_OFFSETS: tuple[str, ...] = ("per_class_group", "per_support_set")
Draws = Literal["distinct", "per_group", "independent"]
DRAWS: tuple[str, ...] = ("distinct", "per_group", "independent")
TASK_TYPES: tuple[str, ...] = ("A", "B", "C", "D")

# The paper's grid: NC=5, KS=1, KT=5, per_class targets; cell -> (type, NSS, CCI).
_GRID: dict[str, tuple[str, int, int]] = {
        "B3": ("B", 3, 1), "C3": ("C", 3, 1), "A3": ("A", 3, 3), "D4": ("D", 4, 2),
        "B5": ("B", 5, 1), "C5": ("C", 5, 1), "A5": ("A", 5, 5), "D8": ("D", 8, 2),
        "B10": ("B", 10, 1), "C10": ("C", 10, 1), "A10": ("A", 10, 10),
}
PAPER_GRID: tuple[str, ...] = tuple(_GRID)
# Defaults for a bare task type ("A", "B", ...): (NSS, CCI).
_TYPE_DEFAULTS: dict[str, tuple[int, int]] = {"A": (3, 3), "B": (3, 1), "C": (3, 1), "D": (4, 2)}
_PAPER_SHAPE = dict(nc=5, ks=1, kt=5, target_mode="per_class")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A CFSL task specification (symbols as in the README's table)."""

    # The help of each field is its override flag's (``--nss``, ... of launch.train).
    nss: int = option(help="Override: support sets per task.", minimum=1)
    nc: int = option(help="Override: classes per support set.", minimum=1)  # way
    ks: int = option(help="Override: shots per class in a support set.", minimum=1)
    kt: int = option(help="Override: target samples per class.", minimum=1)
    cci: int = option(help="Override: class change interval.", minimum=1)
    overwrite: bool = option(help="Override: labels restart at 0 in every class group.")
    target_mode: TargetMode = option("per_support_set", "Override: target sampling mode.",
                                     choices=TARGET_MODES)
    label_offset: LabelOffset = option(  # without overwrite: group g or support set n
        "per_class_group", "Override: labels without overwrite offset per class group (the "
        "spec) or per support set (the authors' paper-era code; needs "
        "--target_mode=per_support_set where CCI > 1). docs/fidelity.md.", choices=LABEL_OFFSETS)
    draws: Draws = option(  # samples: distinct in the task, or as the paper-era code
        "distinct", "Override: samples distinct in a task (the spec), per_group (one draw "
        "reused by a group's support sets: the Apr-2020 code) or independent (every support set "
        "draws its own, groups their own classes: the Feb-2020 code; needs "
        "--target_mode=per_support_set). docs/fidelity.md.", choices=DRAWS)

    def __post_init__(self):
        def name(field: str) -> str:
            return naming.name("TaskSpec", field)
        if not isinstance(self.overwrite, bool):
            raise ValueError(f"{name('overwrite')} must be a bool, got {self.overwrite!r}")
        check_limits(self)
        if self.draws == "independent" and self.target_mode != "per_support_set":
            raise ValueError(f"{name('draws')}='independent' draws every support set's target "
                             f"part with it; it needs target_mode='per_support_set'")
        if self.relabels_within_groups and self.target_mode == "per_class":
            raise ValueError(
                    f"{name('label_offset')}='per_support_set' with cci={self.cci} and "
                    f"overwrite=False labels a class differently in each support set of its "
                    f"group, so a per_class target sample has no single label; use "
                    f"target_mode='per_support_set' (as the authors' code)")

    # ---- derived values ------------------------------------------------------
    @property
    def num_groups(self) -> int:
        """I = ceil(NSS / CCI) class groups."""
        return math.ceil(self.nss / self.cci)

    @property
    def group_lengths(self) -> tuple[int, ...]:
        """Support sets in each group; the last one may be shorter."""
        full = min(self.cci, self.nss)
        return (full,) * (self.num_groups - 1) + (self.nss - (self.num_groups - 1) * self.cci,)

    @property
    def max_group_length(self) -> int:
        """m = min(CCI, NSS): support sets in the longest group."""
        return min(self.cci, self.nss)

    @property
    def num_classes(self) -> int:
        """Distinct classes a task draws: I * NC."""
        return self.num_groups * self.nc

    @property
    def support_size(self) -> int:
        """Samples in one support set: NC * KS."""
        return self.nc * self.ks

    @property
    def target_size(self) -> int:
        """Samples in the target set."""
        parts = self.nss if self.target_mode == "per_support_set" else self.num_groups
        return parts * self.nc * self.kt

    @property
    def relabels_within_groups(self) -> bool:
        """Whether ``label_offset`` gives one class several labels (per_support_set, no
        overwrite, groups of more than one support set)."""
        return (self.label_offset == "per_support_set" and not self.overwrite
                and self.max_group_length > 1)

    @property
    def num_outputs(self) -> int:
        """Output units a learner needs: NC with overwrite, else NC * I (NC * NSS when
        ``label_offset="per_support_set"``)."""
        if self.overwrite:
            return self.nc
        return self.nc * (self.nss if self.label_offset == "per_support_set" else self.num_groups)

    def samples_per_class(self, target_mode: str | None = None) -> int:
        """Distinct samples one class must supply: m*(KS+KT) or m*KS+KT (KS+KT when the
        support sets of a group reuse one draw or draw their own: ``draws``)."""
        mode = target_mode or self.target_mode
        if self.draws != "distinct":
            return self.ks + self.kt
        m = self.max_group_length
        return m * (self.ks + self.kt) if mode == "per_support_set" else m * self.ks + self.kt

    @property
    def task_type(self) -> str | None:
        """'A', 'B', 'C' or 'D' when the spec is one of the paper's types, else None."""
        if self.cci >= self.nss and self.overwrite:
            return "A"
        if self.cci == 1:
            return "C" if self.overwrite else "B"
        if 1 < self.cci < self.nss and not self.overwrite:
            return "D"
        return None

    @property
    def name(self) -> str:
        """Short readable name, e.g. 'D8(cci=2,nc=5,ks=1,kt=5,per_class)'."""
        kind = self.task_type or "X"
        offset = ",labels_per_support_set" if self.relabels_within_groups else ""
        draws = "" if self.draws == "distinct" else f",draws={self.draws}"
        return (f"{kind}{self.nss}(cci={self.cci},nc={self.nc},ks={self.ks},kt={self.kt},"
                        f"{'overwrite,' if self.overwrite else ''}{self.target_mode}{offset}"
                        f"{draws})")

    @property
    def distinct_classes(self) -> int:
        """Classes a split must hold: I * NC (NC when groups draw on their own)."""
        return self.nc if self.draws == "independent" else self.num_classes

    # ---- feasibility -----------------------------------------------------------
    def check_feasible(self, num_classes: int, min_class_size: int) -> None:
        """Raise ValueError when a split cannot supply this spec."""
        if self.distinct_classes > num_classes:
            raise ValueError(
                    f"{self.name} needs ceil(NSS/CCI)*NC = {self.num_groups}*{self.nc} = "
                    f"{self.num_classes} distinct classes, but the split has {num_classes}")
        need = self.samples_per_class()
        if need > min_class_size and self.draws != "distinct":
            raise ValueError(f"{self.name} needs KS+KT = {need} distinct samples of a class, "
                             f"but the smallest class of the split holds {min_class_size}")
        if need > min_class_size:
            formula = ("m*(KS+KT)" if self.target_mode == "per_support_set" else "m*KS+KT")
            message = (f"{self.name} needs {formula} = {need} distinct samples of a class "
                                  f"(m = min(CCI, NSS) = {self.max_group_length}), but the smallest class "
                                  f"of the split holds {min_class_size}")
            other = "per_class" if self.target_mode == "per_support_set" else "per_support_set"
            other_need = self.samples_per_class(other)
            if other_need <= min_class_size:
                message += f"; target_mode={other!r} needs {other_need} and would fit"
            raise ValueError(message)

    # ---- constructors ----------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides) -> TaskSpec:
        """A paper cell ('B3', 'D8', ...) or a task type ('A'..'D') with overrides.

        The paper's settings are NC=5, KS=1, KT=5 and per_class targets. Overrides
        that contradict the named type (e.g. ``preset('B', cci=2)``) raise.
        """
        if name in _GRID:
            kind, nss, cci = _GRID[name]
        elif name in _TYPE_DEFAULTS:
            kind = name
            nss, cci = _TYPE_DEFAULTS[name]
            if "nss" in overrides and "cci" not in overrides:
                nss = overrides["nss"]
                cci = nss if kind == "A" else (1 if kind in "BC" else min(2, max(nss - 1, 1)))
        else:
            raise ValueError(
                    f"unknown task preset {name!r}; valid: paper cells {PAPER_GRID} or types {TASK_TYPES}")
        fields = dict(_PAPER_SHAPE, nss=nss, cci=cci, overwrite=kind in "AC")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown TaskSpec field(s) {sorted(unknown)} for preset {name!r}")
        fields.update(overrides)
        spec = cls(**fields)
        # Rule 1 of the specification: CCI = 1, NSS = 1 is the same task whatever overwrite
        # is, so it is every one of types A, B and C (task_type names it A or B)
        same_task = spec.nss == 1 and spec.cci == 1 and kind in "ABC"
        if spec.task_type != kind and not same_task:
            raise ValueError(
                    f"preset {name!r} is task type {kind} ({_TYPE_RULES[kind]}), but "
                    f"nss={spec.nss}, cci={spec.cci}, overwrite={spec.overwrite} is "
                    f"{'type ' + spec.task_type if spec.task_type else 'none of A-D'}")
        return spec

    @classmethod
    def parse(cls, text: str) -> TaskSpec:
        """Parse 'D8' (a paper cell), 'B' (a type) or 'B7' (a type with NSS=7)."""
        text = text.strip()
        match = re.fullmatch(r"([A-D])(\d*)", text)
        if match is None:
            raise ValueError(
                f"cannot parse task {text!r}; valid: a paper cell {PAPER_GRID}, "
                f"a type {TASK_TYPES}, or a type with NSS such as 'B7'")
        if text in _GRID or not match.group(2):
            return cls.preset(text)
        return cls.preset(match.group(1), nss=int(match.group(2)))


_TYPE_RULES = {
        "A": "cci >= nss, overwrite=True",
        "B": "cci = 1, overwrite=False",
        "C": "cci = 1, overwrite=True",
        "D": "1 < cci < nss, overwrite=False",
}
