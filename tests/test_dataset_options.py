"""A dataset option given at its default is the option unset (``data.normalised_options``):
``--dataset_option=class_split=ordered`` on Omniglot, ``num_classes=1623`` on the synthetic set
make the same run as a command without them, so their configs compare equal, their seeds are one
experiment in a report and one setting in ``launch.report --reference``, and an old config.json
that recorded such an option reads back as one without it (the file itself is not rewritten)."""

import dataclasses
import json

import pytest

from cfsl_jax import data
from cfsl_jax.experiments import reference_checks, reference_yours, report
from cfsl_jax.fluid.config import FluidConfig, comparable
from cfsl_jax.training.config import TrainConfig, from_json
from cfsl_jax.training.runs import config_differences

# (dataset, options given at their defaults, options given at other values)
CASES = [
    ("omniglot/full", {"class_split": "ordered"}, {"class_split": "authors"}),
    ("omniglot", {"class_split": "ordered"}, {"class_split": "authors"}),
    ("synthetic", {"num_classes": 1623, "samples_per_class": 20, "image_size": 28, "seed": 0},
     {"num_classes": 60, "seed": 1}),
]


@pytest.mark.parametrize("dataset, default, other", CASES)
def test_an_option_given_at_its_default_is_the_config_without_it(dataset, default, other):
    given, unset = (TrainConfig(dataset=dataset, dataset_options=dict(options))
                    for options in (default, {}))
    assert given == unset and given.to_json() == unset.to_json()
    assert config_differences(given.to_json(), unset) == []
    assert config_differences(unset.to_json(), given) == []
    # an old config.json that recorded the default (written before the options were
    # normalised): read back as the config without it, in memory
    saved = {**unset.to_json(), "dataset_options": {**unset.to_json()["dataset_options"],
                                                    **default}}
    assert from_json(saved) == from_json(unset.to_json())
    assert config_differences(saved, unset) == []
    # other values stay, and differ
    changed = TrainConfig(dataset=dataset, dataset_options={**default, **other})
    assert changed.dataset_options == other
    assert config_differences(changed.to_json(), unset) == ["dataset_options"]


def test_only_an_option_at_its_default_of_its_type_is_dropped():
    assert data.normalised_options("synthetic", {"num_classes": 1623.0, "seed": True}) == {
        "num_classes": 1623.0, "seed": True}  # the loader judges these
    assert data.normalised_options("omniglot/full", {"resize": "nearest", "x": 1}) == {
        "resize": "nearest", "x": 1}  # the preprocessing option stays as given; unknown too
    assert data.normalised_options("slimagenet64", {"normalisation": "imagenet"}) == {
        "normalisation": "imagenet"}


def test_an_option_at_its_default_loads_the_split_it_loads_unset():
    """The same images and the same variant (what the task fingerprint names)."""
    options = {"num_classes": 30, "samples_per_class": 4}
    unset = data.load_split("synthetic", "test", **options)
    given = data.load_split("synthetic", "test", **options, image_size=28, seed=0)
    assert given.info == unset.info
    assert (given.images == unset.images).all()


def _result(seed, dataset_options, acc):
    """A results.json of an Omniglot ProtoNets B3 run; its config.json as written before the
    options were normalised (``dataset_options`` recorded as given, with the resize)."""
    config = TrainConfig(learner="protonets", task="B3", dataset="omniglot/full", seed=seed)
    saved = {**config.to_json(), "dataset_options": {"resize": "nearest", **dataset_options}}
    return {"dataset": "omniglot/full", "learner": "protonets", "seed": seed,
            "spec": dataclasses.asdict(config.spec), "spec_name": config.spec.name,
            "config": saved, "task_fingerprint": "f",
            "test": {"acc_mean": acc, "ce_mean": 0.5, "atm": 0.1, "macs_per_task": 1e6}}


def test_seeds_with_an_option_at_its_default_and_unset_are_one_experiment_and_setting():
    given, unset = _result(0, {"class_split": "ordered"}, 0.9), _result(1, {}, 0.8)
    report.check_same_experiment(("omniglot/full", "protonets", "B3"), unset, given)
    report.check_same_experiment(("omniglot/full", "protonets", "B3"), given, unset)
    assert report.aggregate([given, unset], "acc")[
        ("omniglot/full", "protonets", "B3")].values == (0.9, 0.8)
    assert reference_checks.result_setting(given) == reference_checks.result_setting(unset)
    assert reference_checks.setting("none", from_json(given["config"]).dataset_options) == \
        reference_checks.setting("none", from_json(unset["config"]).dataset_options)
    assert reference_yours._data_options(given) == reference_yours._data_options(unset) == \
        json.dumps({"resize": "nearest"})
    # another class split is still another experiment
    authors = _result(2, {"class_split": "authors"}, 0.7)
    with pytest.raises(ValueError, match="differ in dataset_options"):
        report.check_same_experiment(("omniglot/full", "protonets", "B3"), unset, authors)
    assert reference_checks.result_setting(authors) != reference_checks.result_setting(unset)


def test_a_fluid_config_with_an_option_at_its_default_is_the_one_without_it():
    given = FluidConfig(dataset="synthetic", dataset_options={
        "num_classes": 6424, "samples_per_class": 1061, "seed": 0, "image_size": 28})
    assert given == FluidConfig() and given.to_json() == FluidConfig().to_json()
    real = FluidConfig(dataset="omniglot/full", dataset_options={"class_split": "ordered"})
    assert real.dataset_options == {}
    # a run stored before (results.json's config, as its to_json wrote it) is the same config
    stored = json.loads(json.dumps({**FluidConfig().to_json(), "dataset_options": {
        "num_classes": 6424, "samples_per_class": 1061, "seed": 0}}))
    assert comparable(stored) == json.loads(json.dumps(FluidConfig().to_json()))
