"""A hyperparameter chosen on validation data: one JSON line per measurement, then the choice.

``Selection`` collects validation scores of each candidate value (one per cell, stream or
seed) and ``select`` prints and returns the value with the highest mean score; a tie goes to
the value listed first (list the grid from the weakest setting up, so a tie keeps it).
"""

from __future__ import annotations

import json


class Selection:
    """Scores per candidate value of the hyperparameter ``name``."""

    def __init__(self, name: str):
        self.name = name
        self.scores: dict[float, list[float]] = {}

    def record(self, value: float, score: float, **details) -> None:
        """Add one validation score of ``value``; print it with ``details`` as a JSON line."""
        self.scores.setdefault(value, []).append(score)
        print(json.dumps({self.name: value, "val_acc": score, **details}), flush=True)

    def select(self) -> float:
        """The value of highest mean score (first listed on a tie); printed as a JSON line."""
        means = {value: sum(v) / len(v) for value, v in self.scores.items()}
        best = max(means, key=means.get)
        print(json.dumps({f"selected_{self.name}": best, "mean_val_acc": means}), flush=True)
        return best


def grid(texts: list[str]) -> list[float]:
    """The values of a comma-separated flag, as floats, in the order given."""
    return [float(text) for text in texts]
