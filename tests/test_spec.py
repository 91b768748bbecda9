"""TaskSpec: validation, derived values, presets."""

import dataclasses

import pytest

from cfsl_jax.protocol.spec import PAPER_GRID, TaskSpec


def test_derived_values_of_a_ragged_spec():
    # NSS=7, CCI=3: groups of 3, 3, 1 support sets.
    spec = TaskSpec(nss=7, nc=4, ks=2, kt=3, cci=3, overwrite=False)
    assert spec.num_groups == 3
    assert spec.group_lengths == (3, 3, 1)
    assert spec.max_group_length == 3
    assert spec.num_classes == 12
    assert spec.support_size == 8
    assert spec.target_size == 7 * 4 * 3
    assert spec.num_outputs == 12
    assert spec.samples_per_class() == 3 * (2 + 3)
    per_class = dataclasses.replace(spec, target_mode="per_class", overwrite=True)
    assert per_class.target_size == 3 * 4 * 3
    assert per_class.num_outputs == 4
    assert per_class.samples_per_class() == 3 * 2 + 3


@pytest.mark.parametrize("cell, nss, cci, overwrite, kind", [
    ("B3", 3, 1, False, "B"), ("C3", 3, 1, True, "C"), ("A3", 3, 3, True, "A"),
    ("D4", 4, 2, False, "D"), ("B5", 5, 1, False, "B"), ("C5", 5, 1, True, "C"),
    ("A5", 5, 5, True, "A"), ("D8", 8, 2, False, "D"), ("B10", 10, 1, False, "B"),
    ("C10", 10, 1, True, "C"), ("A10", 10, 10, True, "A"),
])
def test_paper_grid(cell, nss, cci, overwrite, kind):
    spec = TaskSpec.preset(cell)
    assert (spec.nss, spec.cci, spec.overwrite, spec.task_type) == (nss, cci, overwrite, kind)
    assert (spec.nc, spec.ks, spec.kt, spec.target_mode) == (5, 1, 5, "per_class")
    assert TaskSpec.parse(cell) == spec
    # Every cell of the paper fits Omniglot's 20 drawings with per_class targets.
    spec.check_feasible(num_classes=1200, min_class_size=20)


def test_grid_is_the_papers_eleven_cells():
    assert PAPER_GRID == ("B3", "C3", "A3", "D4", "B5", "C5", "A5", "D8", "B10", "C10", "A10")


def test_type_presets_and_overrides():
    assert TaskSpec.parse("B7") == TaskSpec(7, 5, 1, 5, 1, False, "per_class")
    assert TaskSpec.parse("A6").cci == 6
    assert TaskSpec.preset("D", nss=9, cci=3).num_groups == 3
    assert TaskSpec.preset("C", nc=3, kt=2).num_outputs == 3


def test_nss1_cci1_is_every_type_a_b_c():
    # Rule 1 of the CFSL specification: CCI = 1, NSS = 1 generates the same task type whatever
    # overwrite is; A1 and B1 parse, so C1 (overwrite=True, CCI=1) must too
    for name in ("A1", "B1", "C1"):
        spec = TaskSpec.parse(name)
        assert (spec.nss, spec.cci, spec.overwrite) == (1, 1, name != "B1")
    assert TaskSpec.preset("C", nss=1) == TaskSpec.preset("A", nss=1)


@pytest.mark.parametrize("name, overrides, message", [
    ("B", dict(cci=2), "task type B"),
    ("C", dict(overwrite=False), "task type C"),
    ("A3", dict(cci=2), "task type A"),
    ("D", dict(nss=2), "task type D"),
    ("B3", dict(way=5), "unknown TaskSpec field"),
    ("E3", {}, "unknown task preset 'E3'"),
])
def test_contradicting_presets_raise(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        TaskSpec.preset(name, **overrides)


@pytest.mark.parametrize("field, value", [
    ("nss", 0), ("nc", -1), ("ks", 1.5), ("kt", "5"), ("cci", True), ("cci", 0),
])
def test_bad_numbers_name_the_field_and_value(field, value):
    fields = dict(nss=3, nc=5, ks=1, kt=5, cci=1, overwrite=False)
    fields[field] = value
    with pytest.raises(ValueError, match=rf"TaskSpec\.{field} .* got {value!r}"):
        TaskSpec(**fields)


def test_bad_mode_and_overwrite():
    with pytest.raises(ValueError, match="target_mode .* got 'per_task'"):
        TaskSpec(3, 5, 1, 5, 1, False, "per_task")
    with pytest.raises(ValueError, match="overwrite must be a bool, got 1"):
        TaskSpec(3, 5, 1, 5, 1, 1)
    with pytest.raises(ValueError, match="cannot parse task 'X3'"):
        TaskSpec.parse("X3")


def test_infeasible_specs_name_the_numbers_and_the_other_mode():
    a10 = TaskSpec.preset("A10", target_mode="per_support_set")
    with pytest.raises(ValueError, match=r"m\*\(KS\+KT\) = 60 .* holds 20; "
                                         r"target_mode='per_class' needs 15 and would fit"):
        a10.check_feasible(num_classes=1200, min_class_size=20)
    with pytest.raises(ValueError, match=r"m\*KS\+KT = 15 distinct samples .* holds 14$"):
        TaskSpec.preset("A10").check_feasible(1200, 14)
    with pytest.raises(ValueError, match=r"10\*5 = 50 distinct classes, but the split has 49"):
        TaskSpec.preset("B10").check_feasible(49, 20)
    TaskSpec.preset("B10").check_feasible(50, 6)  # exactly enough


def test_spec_is_hashable_and_frozen():
    spec = TaskSpec.preset("D8")
    assert hash(spec) == hash(TaskSpec.preset("D8"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.nss = 4
