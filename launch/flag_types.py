"""List flags that take comma lists and repeats alike: ``--figure=a,b`` is
``--figure=a --figure=b``.

    learners = define_list("learners", [], "Learners.", module=__name__)
    figure = define_list("figure", ["accuracy_nss"], "Figures.",
                         enum_values=["accuracy_nss", "atm_macs"], module=__name__)

absl's ``DEFINE_list`` keeps only the last of repeated flags and ``DEFINE_multi_*`` does not
split commas; these flags do both, and check each item against ``enum_values`` (an unknown
item is absl's one-line ``flag --figure=x: value should be one of <...>``).
"""

from __future__ import annotations

import sys
from typing import Iterable, Sequence

from absl import flags


class CommaMultiFlag(flags.MultiFlag):
    """A repeatable flag whose every occurrence may be a comma list (items are stripped)."""

    def _parse(self, arguments) -> list:
        items = [arguments] if isinstance(arguments, str) else list(arguments)
        pieces = []
        for item in items:
            pieces += [p.strip() for p in item.split(",") if p.strip()] if isinstance(
                item, str) else [item]
        try:
            return [self.parser.parse(piece) for piece in pieces]
        except (TypeError, ValueError) as error:
            typed = arguments if isinstance(arguments, str) else ",".join(map(str, items))
            raise flags.IllegalFlagValueError(f"flag --{self.name}={typed}: {error}") from None

    def flag_type(self) -> str:
        return "comma list or repeated"


def define_list(name: str, default: Iterable[str], help: str,  # pylint: disable=redefined-builtin
                enum_values: Sequence[str] | None = None,
                flag_values: flags.FlagValues = flags.FLAGS, *,
                module: str) -> flags.FlagHolder:
    """A ``CommaMultiFlag`` of strings (of ``enum_values`` when given), listed in ``--help``
    under ``module`` (the defining module's ``__name__``)."""
    parser = flags.EnumParser(list(enum_values)) if enum_values else flags.ArgumentParser()
    flag = CommaMultiFlag(parser, flags.ArgumentSerializer(), name, list(default),
                          f"{help} A comma list, or repeat the flag.")
    flag.help = flag.help.split(";\n    repeat this option")[0]  # MultiFlag's own sentence
    # Listed under the module named explicitly: absl's ``disclaim_key_flags`` would record
    # this module's id(), which a later module object can reuse once this one is re-imported
    # and collected, and that module's flags would then be listed under its importer.
    return flags.DEFINE_flag(flag, flag_values,
                             module_name=sys.argv[0] if module == "__main__" else module)
