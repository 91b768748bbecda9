"""Command-line flags made from a config dataclass's fields: one place per field.

    TRAIN = config_flags.define(TrainConfig, __name__, parsers={"task": parse_task})
    values = TRAIN.values()                      # {field: value} read from the parsed flags
    with naming.field_names(TRAIN.names()):      # a mistake names --epochs, not a field
        TrainConfig(**values).check()

Each field's flag takes its help, choices and limits from the field
(``cfsl_jax.runtime.options.option``): ``flag`` spells the flag otherwise (None: no flag),
``choices`` make an enum flag; a bool is ``--[no]NAME``, an int, a float or a str (optional or
not) its absl flag, a tuple a comma-list flag, a dict a repeatable ``NAME=VALUE`` flag.
``parsers`` turn a flag's text into the field's value where the type alone does not say how
(``--eval_seed=seed``, the learner options of ``--learner``). An override field's flag
defaults to None and ``values`` holds it only where given (the ``--nss``, ``--nc``, ... that
replace a task's fields). The limits are checked by the config itself, inside
``naming.field_names(names())``, so a mistake is raised in the flags' words.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from typing import Any, Callable, Mapping, NamedTuple

from absl import flags

from cfsl_jax.runtime.options import field_types

from .flag_types import define_list

FLAGS = flags.FLAGS


class ConfigFlags(NamedTuple):
    """The flags of one config class: ``flags`` maps a field to its flag's name."""

    owner: type
    flags: dict[str, str]
    parsers: Mapping[str, Callable[[Any], Any]]
    overrides: frozenset[str]  # fields whose flag defaults to None: set only where given

    def names(self) -> dict[str, str]:
        """``{"TrainConfig.epochs": "--epochs", ...}``: ``naming.field_names``' table."""
        return {f"{self.owner.__name__}.{field}": f"--{flag}" for field, flag in self.flags.items()}

    def present(self) -> list[str]:
        """The fields whose flag the command line gives."""
        return [field for field, flag in self.flags.items() if FLAGS[flag].present]

    def values(self, **given: Any) -> dict[str, Any]:
        """{field: its flag's value, parsed} (of an override only where given); a field in
        ``given`` takes that value instead."""
        present = self.present()
        fields = [f for f in self.flags if f not in self.overrides or f in present]
        return {field: given[field] if field in given else self.parse(field)
                for field in (*fields, *(f for f in given if f not in fields))}

    def parse(self, field: str) -> Any:
        value = FLAGS[self.flags[field]].value
        return self.parsers[field](value) if field in self.parsers else value


def flag_of(field: dataclasses.Field) -> str | None:
    """The flag of a config field: its ``flag`` metadata ("" or absent: the field's name)."""
    flag = field.metadata.get("flag", "")
    return field.name if flag == "" else flag


def define(owner: type, module: str, parsers: Mapping[str, Callable[[Any], Any]] | None = None,
           defined: tuple[str, ...] = (), only: tuple[str, ...] | None = None,
           overrides: bool | tuple[str, ...] = False) -> ConfigFlags:
    """Define the flags of ``owner``'s fields (those ``only`` names, where given), listed in
    ``--help`` under ``module`` (a script's ``__name__``); ``defined``: fields whose flags an
    earlier ``define`` made (they are in the table, not defined again); ``overrides``: the
    fields (True: all) whose flag defaults to None and sets the field only where given."""
    parsers = dict(parsers or {})
    names = [field.name for field in dataclasses.fields(owner)]
    overrides = frozenset(names if overrides is True else overrides or ())
    kinds = field_types(owner)
    table = {}
    for field in dataclasses.fields(owner):
        flag = flag_of(field)
        if flag is None or (only is not None and field.name not in only):
            continue
        table[field.name] = flag
        if field.name not in defined:
            _define_one(field, flag, kinds[field.name], field.name in parsers,
                        field.name in overrides, module_name(module))
    return ConfigFlags(owner, table, parsers, overrides)


def module_name(name: str) -> str:
    """The module a flag is listed under in ``--help``: ``name``, or the script's path when it
    runs as ``__main__`` (``python -m launch.train``)."""
    return sys.argv[0] if name == "__main__" else name


def _define_one(field: dataclasses.Field, flag: str, kinds: tuple[type, ...], parsed: bool,
                override: bool, module: str) -> None:
    meta = field.metadata
    default = None if override or field.default is dataclasses.MISSING else field.default
    kind = next(k for k in kinds if k is not type(None))
    common = dict(help=meta.get("help", ""), module_name=module)
    if dict in kinds:
        flags.DEFINE_multi_string(flag, [], **common)
    elif typing.get_origin(kind) is tuple:
        define_list(flag, [str(item) for item in default], common["help"], module=module)
    elif meta.get("choices") is not None:
        flags.DEFINE_enum(flag, default, [str(c) for c in meta["choices"]], **common)
    elif parsed or kind is str:
        flags.DEFINE_string(flag, None if default is None else str(default), **common)
    elif kind is bool:
        flags.DEFINE_bool(flag, default, **common)
    elif kind is int:
        flags.DEFINE_integer(flag, default, **common)
    elif kind is float:
        flags.DEFINE_float(flag, default, **common)
    else:
        raise TypeError(f"{field.name}: no flag for a field of type {kind}")
