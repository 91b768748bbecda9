"""The paper's Table 1 in cfsl_jax/experiments/paper_results.py: every printed cell, digits as printed."""

from __future__ import annotations

import re

import pytest

from cfsl_jax.experiments import paper_results
from cfsl_jax.learners import LEARNERS
from cfsl_jax.protocol.spec import PAPER_GRID

# (dataset, learner, cell) -> the entry as printed, read by hand from the paper's Table 1.
HAND_CHECKED = {
    ("omniglot", "protonets", "B3"): ("95.30", "0.12"),
    ("omniglot", "protonets", "C3"): ("45.44", "0.19"),
    ("omniglot", "init_tune", "B3"): ("10.87", "0.01"),
    ("omniglot", "pretrain_tune", "A5"): ("31.89", "1.10"),
    ("omniglot", "ewc_pretrain", "B10"): ("3.23", "0.02"),
    ("omniglot", "maml_low", "C10"): ("27.82", "0.03"),
    ("omniglot", "sca", "D4"): ("49.71", "0.01"),
    ("slimagenet64", "init_tune", "B3"): ("8.4", "0.01"),
    ("slimagenet64", "ewc_init", "D8"): ("2.93", "0.00"),
    ("slimagenet64", "maml_high", "A10"): ("75.6", "0.10"),
    ("slimagenet64", "sca", "A10"): ("77.4", "0.06"),
}


def test_table1_has_all_176_cells_with_the_printed_decimals():
    values = paper_results.parse_table1(paper_results.TABLE1_TEXT)
    assert values == paper_results.TABLE1["values"]
    assert sorted(values) == ["omniglot", "slimagenet64"]
    count = 0
    for dataset, learners in values.items():
        assert sorted(learners) == sorted(LEARNERS), dataset
        for learner, cells in learners.items():
            assert list(cells) == list(PAPER_GRID), (dataset, learner)
            for cell, entry in cells.items():
                count += 1
                assert re.fullmatch(r"\d+\.\d\d?", entry["mean_printed"]), entry
                assert re.fullmatch(r"\d\.\d\d", entry["std_printed"]), entry
                assert entry["mean"] == float(entry["mean_printed"])
                assert entry["std"] == float(entry["std_printed"])
    assert count == 176
    # Every entry of the text is one cell: 16 rows x 11 "mean±std".
    assert paper_results.TABLE1_TEXT.count("±") == 176


@pytest.mark.parametrize("key", sorted(HAND_CHECKED))
def test_hand_checked_cells(key):
    dataset, learner, cell = key
    entry = paper_results.TABLE1["values"][dataset][learner][cell]
    assert (entry["mean_printed"], entry["std_printed"]) == HAND_CHECKED[key]
    assert paper_results.printed(entry) == " ± ".join(HAND_CHECKED[key])


def test_trailing_zeros_are_kept():
    entry = paper_results.TABLE1["values"]["omniglot"]["protonets"]["B3"]
    assert paper_results.printed(entry) == "95.30 ± 0.12"  # not 95.3
    assert paper_results.printed({"mean": 95.3, "std": 0.1}) == "95.30 ± 0.10"  # a JSON table


def test_a5_header_misprint_is_the_only_header_difference():
    assert paper_results.HEADER_MISPRINTS == {("A5", "CCI"): "1"}
    broken = paper_results.TABLE1_TEXT.replace("CCI | 1 | 1 | 3", "CCI | 1 | 1 | 4", 1)
    with pytest.raises(ValueError, match=r"A3\): CCI printed 4, the cell has 3"):
        paper_results.parse_table1(broken)


def test_the_feb_2020_csv_is_a_separate_source_that_differs_from_table1():
    """Issue 11, finding 1: the CSV's fine-tuning rows are Table 1's, with Pre. & Tune under
    "fine-tune-pretrained"; 11 of its 12 D cells differ from Table 1 (rounded to its decimal)."""
    table = paper_results.TABLE1["values"]["omniglot"]
    csv = paper_results.AUTHORS_CSV_FEB2020["values"]["omniglot"]
    assert csv["pretrain_tune"]["B3"]["mean"] == 10.0 and table["pretrain_tune"]["B3"]["mean"] == 9.97
    assert csv["init_tune"]["B3"]["mean"] == 10.9 and table["init_tune"]["B3"]["mean"] == 10.87
    differ = [(learner, cell) for learner in csv for cell in ("D4", "D8")
              if round(table[learner][cell]["mean"], 1) != csv[learner][cell]["mean"]]
    assert len(differ) == 11
    assert paper_results.AUTHORS_CSV_FEB2020["source"] != paper_results.TABLE1["source"]
    # its NSS=1 rows (a one-support-set task): the fine-tuners' A cells lie near them, flat in NSS
    one_set = paper_results.AUTHORS_CSV_ONE_SUPPORT_SET
    assert set(one_set) == set(csv) and one_set["init_tune"] == {"mean": 43.0, "std": 0.0}
    assert one_set["pretrain_tune"] == {"mean": 33.1, "std": 2.04}
    for learner in ("init_tune", "pretrain_tune"):
        assert all(abs(table[learner][cell]["mean"] - one_set[learner]["mean"]) < 3
                   for cell in ("A3", "A5", "A10"))


def test_report_wording_for_one_seed_and_one_epoch():
    """Issue 13, Found 10: no "± where the seeds agree" with one seed, and "1 epoch"."""
    import dataclasses

    from cfsl_jax.experiments import report
    from cfsl_jax.training.config import TrainConfig
    from cfsl_jax.protocol.spec import TaskSpec

    config = TrainConfig(dataset="slimagenet64", learner="protonets", task="B3", epochs=1,
                               iters_per_epoch=2)
    result = {"dataset": "slimagenet64", "learner": "protonets", "seed": 0,
              "spec": dataclasses.asdict(TaskSpec.parse("B3")), "config": config.to_json(),
              "test": {"acc_mean": 0.25, "ce_mean": 1.5, "atm": 0.1, "macs_per_task": 1e6}}
    text = report.dataset_markdown([result], "slimagenet64", paper_results.TABLE1)
    assert "1 run;" in text and "1 epoch x 2 iterations" in text
    assert "one seed per cell" in text and "seeds agree" not in text
    # The SlimageNet64 cell of Table 1, as printed, and the difference in points.
    assert "| protonets | B3 | 25.00 | 24.1 ± 0.05 | +0.90 |" in text
