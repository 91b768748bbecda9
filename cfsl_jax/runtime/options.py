"""Typed options: a frozen dataclass per learner or method, checked once, parsed from text.

    @dataclasses.dataclass(frozen=True)
    class MyOptions:
        filters: int = option(64, "Conv-4 width.", minimum=1)
        distance: str = option("dot", "Logit function.", choices=("dot", "euclidean"))

        def __post_init__(self):
            check_fields(self)

Each field carries its default, its type (the annotation), its allowed values
(``choices``) or bounds (``minimum``, ``above``, ``maximum``) and one line of
help. ``check_fields`` refuses a value of the wrong type or out of bounds with a
``UserError`` naming the option, the value and what is allowed; ``parse`` reads
``NAME=VALUE`` text against the field types (``true``/``false`` for bools,
``none`` for an optional value); ``describe`` lists the options for ``--help``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable, Iterable, Mapping, Sequence

from cfsl_jax.runtime import naming
from cfsl_jax.runtime.errors import UserError

_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def option(default: Any = dataclasses.MISSING, help: str = "", *,  # noqa: A002
           choices: Sequence[Any] | None = None, minimum: float | None = None,
           above: float | None = None, maximum: float | None = None,
           below: float | None = None, flag: str | None = "",
           factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with its help and limits: ``minimum`` <= v, ``above`` < v,
    v <= ``maximum``, v < ``below``; ``flag``: its command-line flag where a command makes
    flags of the dataclass (``cfsl_jax.launch.config_flags``; "": the field's name, None: no
    flag); ``factory``: a default_factory in place of ``default``."""
    metadata = dict(help=help, choices=None if choices is None else tuple(choices),
                    minimum=minimum, above=above, maximum=maximum, below=below, flag=flag)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def positive_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``; else a UserError naming ``name``,
    the value and the limit (the one integer check of the package)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        limit = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise UserError(f"{name} must be {limit}, got {value!r}")
    return value


def field_types(cls: type) -> dict[str, tuple[type, ...]]:
    """{field: the accepted Python types}, from the (string) annotations."""
    hints = typing.get_type_hints(cls)
    found = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) or \
            typing.get_origin(hint) is typing.Union else (hint,)
        found[field.name] = tuple(members)
    return found


def _type_name(accepted: tuple[type, ...]) -> str:
    return " | ".join("None" if t is type(None) else t.__name__ for t in accepted)


def _matches(value: object, accepted: tuple[type, ...]) -> bool:
    for kind in accepted:
        if kind is type(None) and value is None:
            return True
        if kind is bool and isinstance(value, bool):
            return True
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            return True
        if kind is str and isinstance(value, str):
            return True
    return False


def _limits(meta: Mapping[str, Any]) -> str:
    parts = []
    if meta.get("minimum") is not None:
        parts.append(f">= {meta['minimum']}")
    if meta.get("above") is not None:
        parts.append(f"> {meta['above']}")
    if meta.get("maximum") is not None:
        parts.append(f"<= {meta['maximum']}")
    if meta.get("below") is not None:
        parts.append(f"< {meta['below']}")
    return " and ".join(parts)


def check_fields(instance: Any) -> None:
    """UserError for the first field of ``instance`` whose value breaks its type or limits."""
    accepted = field_types(type(instance))
    for field in dataclasses.fields(instance):
        value, meta = getattr(instance, field.name), field.metadata
        kinds = accepted[field.name]
        if not _matches(value, kinds):
            raise UserError(f"option {field.name}={value!r} must be {_article(kinds)}")
        if value is None or isinstance(value, bool):
            continue
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise UserError(f"option {field.name}={value!r} must be one of {meta['choices']}")
        if isinstance(value, (int, float)) and not _within(value, meta):
            kind = "an integer" if int in kinds and float not in kinds else "a number"
            raise UserError(f"option {field.name}={value!r} must be {kind} {_limits(meta)}")


def check_limits(instance: Any, qualified: bool = True) -> None:
    """UserError for the first field of a config ``instance`` outside its ``choices`` or
    bounds, the field named by ``naming.name`` (``Owner.field``, or the command's flag)."""
    owner, accepted = type(instance).__name__, field_types(type(instance))
    for field in dataclasses.fields(instance):
        value, meta = getattr(instance, field.name), field.metadata
        label = naming.name(owner, field.name, qualified)
        if value is None and type(None) in accepted[field.name]:
            continue
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise UserError(f"{label} must be one of {meta['choices']}, got {value!r}")
        if float not in accepted[field.name] and meta.get("minimum") is not None:
            positive_int(label, value, meta["minimum"])
        elif _limits(meta) and not (isinstance(value, (int, float)) and _within(value, meta)):
            finite = "a finite number " if isinstance(value, float) and math.isinf(value) else ""
            raise UserError(f"{label} must be {finite}{_limits(meta)}, got {value!r}")


def _within(value: float, meta: Mapping[str, Any]) -> bool:
    return (math.isfinite(value)  # a limit is a finite number's (inf > 0 is no learning rate)
            and (meta.get("minimum") is None or value >= meta["minimum"])
            and (meta.get("above") is None or value > meta["above"])
            and (meta.get("maximum") is None or value <= meta["maximum"])
            and (meta.get("below") is None or value < meta["below"]))


def _article(kinds: tuple[type, ...]) -> str:
    words = {bool: "a bool (true or false)", int: "an integer", float: "a finite number",
             str: "a string", type(None): "none"}
    return " or ".join(words[k] for k in kinds)


def names(cls: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))


def build(cls: type, values: Mapping[str, Any], owner: str) -> Any:
    """``cls(**values)``, checked; a UserError starts with ``owner`` (e.g. "learner 'sca'")
    and names the option, its value and what is allowed (the valid names if unknown)."""
    unknown = sorted(set(values) - set(names(cls)))
    if unknown:
        raise UserError(f"{owner}: no option {', '.join(unknown)}; valid: "
                        f"{', '.join(sorted(names(cls)))}")
    try:
        return cls(**values)
    except UserError as error:
        raise UserError(f"{owner}: {error}") from None


def parse_value(cls: type, name: str, text: str) -> Any:
    """The value ``text`` of option ``name`` of ``cls``, read as the field's type."""
    kinds = field_types(cls)[name]
    word = text.strip().lower()
    if type(None) in kinds and word == "none":
        return None
    if bool in kinds and word in _BOOL_WORDS and not (int in kinds and word in "01"):
        return _BOOL_WORDS[word]
    for kind in (int, float):
        if kind in kinds:
            try:
                return kind(text)
            except ValueError:
                continue
    if str in kinds:
        return text
    raise UserError(f"option {name}={text} must be {_article(kinds)}")


def parse(cls: type, pairs: Iterable[str], owner: str) -> dict[str, Any]:
    """``NAME=VALUE`` strings -> {name: typed value} for ``cls``, checked by building it."""
    values = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UserError(f"{owner}: {pair!r} is not NAME=VALUE")
        name = name.strip()
        if name not in names(cls):
            build(cls, {name: None}, owner)  # raises: unknown option
        try:
            values[name] = parse_value(cls, name, text)
        except UserError as error:
            raise UserError(f"{owner}: {error}") from None
    build(cls, values, owner)
    return values


def describe(cls: type) -> list[str]:
    """One line per option: ``name: type = default  help`` (choices and limits appended)."""
    kinds = field_types(cls)
    lines = []
    for field in dataclasses.fields(cls):
        meta = field.metadata
        extra = (f" One of {', '.join(map(str, meta['choices']))}." if meta.get("choices")
                 else (f" ({_limits(meta)})" if _limits(meta) else ""))
        lines.append(f"  {field.name}: {_type_name(kinds[field.name])} = {field.default!r}"
                     f"\n      {meta.get('help', '')}{extra}")
    return lines
