"""The command line is made from the configs: every config field is a flag and every flag a
field (or one of a command's listed non-config flags); a new field is a flag with its help and
its checks, its mistakes named by the flag."""

import dataclasses

import pytest
from absl import flags

from cfsl_jax.fluid.experiment import FluidConfig
from cfsl_jax.fluid.protocol import Schedule
from cfsl_jax.fluid.sequences import StreamConfig
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.runtime import naming
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.runtime.options import option
from cfsl_jax.training.config import TrainConfig
from launch_inprocess import command_module

CLI_FLAGS = {"verbose", "validate_only"}  # launch/cli.py's, on every command


def launch_flags() -> set[str]:
    """The flags the launch modules define (what a command's --help lists)."""
    return {flag.name for module, defined in flags.FLAGS.flags_by_module_dict().items()
            if "launch" in module for flag in defined}


def config_fields(*classes, without=()) -> set[str]:
    return {f"{cls.__name__}.{field.name}" for cls in classes
            for field in dataclasses.fields(cls)} - set(without)


def test_every_train_config_field_is_a_flag_and_every_flag_a_field():
    with command_module("train") as train:
        tables = (train.TRAIN, train.SPEC)
        # spec_overrides is the --nss, --nc, ... flags: TaskSpec's fields
        assert config_fields(TrainConfig, TaskSpec, without=["TrainConfig.spec_overrides"]) == {
            name for table in tables for name in table.names()}
        from_fields = {flag for table in tables for flag in table.flags.values()}
        assert not from_fields & set(train.NOT_CONFIG)
        assert launch_flags() == from_fields | set(train.NOT_CONFIG) | CLI_FLAGS
        assert {"test_tasks", "nss", "learner_option", "dataset_option", "weight_decay"} <= \
            from_fields
        for flag in from_fields:  # each with its help from the field
            assert flags.FLAGS[flag].help.strip(), flag


def test_every_fluid_config_field_is_a_flag_and_every_flag_a_field():
    with command_module("fluid") as fluid:
        tables = (fluid.FLUID, fluid.STREAM, fluid.SCHEDULE)
        # the stream and the schedule are their own fields' flags; a schedule's start and
        # warmup are each method's own (no flag)
        assert config_fields(FluidConfig, StreamConfig, Schedule, without=[
            "FluidConfig.stream", "FluidConfig.schedule", "Schedule.start",
            "Schedule.warmup_every", "Schedule.warmup_until"]) == {
            name for table in tables for name in table.names()}
        from_fields = {flag for table in tables for flag in table.flags.values()}
        cluster = {flag.name for module, defined in flags.FLAGS.flags_by_module_dict().items()
                   if module.endswith("cluster") for flag in defined}
        assert launch_flags() == from_fields | set(fluid.NOT_CONFIG) | CLI_FLAGS | cluster
        assert {"stream_classes", "stream_length", "method", "method_option"} <= from_fields


@dataclasses.dataclass(frozen=True)
class Extended(TrainConfig):
    """TrainConfig with one more field: the one edit a new flag needs."""

    warmup_steps: int = option(3, "Steps of learning-rate warm-up.", minimum=1)


def test_a_new_field_is_a_flag_with_its_help_default_and_check():
    from cfsl_jax.launch import config_flags
    table = config_flags.define(Extended, "tests.extended", only=("warmup_steps",))
    try:
        assert flags.FLAGS["warmup_steps"].help == "Steps of learning-rate warm-up."
        assert flags.FLAGS["warmup_steps"].default == 3
        flags.FLAGS(["prog", "--warmup_steps=0"])
        config = Extended(**table.values())
        assert config.warmup_steps == 0
        with pytest.raises(UserError, match=r"^Extended.warmup_steps must be a positive "
                                            r"integer, got 0$"):
            config.check()
        with naming.field_names(table.names()), pytest.raises(
                UserError, match=r"^--warmup_steps must be a positive integer, got 0$"):
            config.check()
    finally:
        flags.FLAGS.unparse_flags()
        delattr(flags.FLAGS, "warmup_steps")
