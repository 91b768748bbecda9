"""How each dataset's images are preprocessed: the options, their defaults, and old runs' values.

    from cfsl_jax.datasets.preprocessing import PREPROCESSING, with_preprocessing
    with_preprocessing("omniglot/full", {})               # {"resize": "nearest"}
    with_preprocessing("omniglot/full", {}, legacy=True)  # {"resize": "lanczos"}

One option per dataset family (``docs/fidelity.md`` has the sources):

- Omniglot ``resize``: ``nearest`` (default) resizes the 105x105 1-bit PNGs to
  28x28 with nearest neighbour, so every pixel is ink or paper: what the authors'
  ``transforms.Resize((28, 28))`` does to these images (Pillow resizes a mode
  "1" image with NEAREST whatever filter is asked). ``lanczos``: greyscale, then
  LANCZOS (antialiased grey edges). Each is its own prepared builder config.
- SlimageNet64 ``normalisation``: ``imagenet`` (default) subtracts the ImageNet
  mean and divides by its std per channel after /255, as the authors'
  ``transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))``;
  ``unit``: /255 only, values in [0, 1]. Applied on device
  (``cfsl_jax.data.gather_normalised``); the prepared images are the same.

``legacy`` is the value a run saved before the option existed used, so its
config reads back as the images it was trained on.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Preprocessing(NamedTuple):
    """A dataset family's preprocessing option: its values, default, and legacy value."""

    option: str
    values: tuple[str, ...]
    default: str  # the authors' preprocessing
    legacy: str  # what a run saved before the option existed used


PREPROCESSING: dict[str, Preprocessing] = {
    "omniglot": Preprocessing("resize", ("nearest", "lanczos"), "nearest", "lanczos"),
    "slimagenet64": Preprocessing("normalisation", ("imagenet", "unit"), "imagenet", "unit"),
}


class Normalisation(NamedTuple):
    """Per-channel ``(x - mean) / std``, applied to images already divided by 255."""

    mean: tuple[float, ...]
    std: tuple[float, ...]


IMAGENET = Normalisation((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def family(dataset: str) -> Preprocessing | None:
    """The preprocessing option of ``dataset`` (``omniglot/full`` -> Omniglot's), if any."""
    return PREPROCESSING.get(dataset.split("/")[0])


def with_preprocessing(dataset: str, options: dict[str, Any], legacy: bool = False
                       ) -> dict[str, Any]:
    """``options`` with the dataset's preprocessing option set where it is not given: to its
    default, or with ``legacy`` to the value runs used before the option existed."""
    found = family(dataset)
    if found is None or found.option in options:
        return dict(options)
    return {**options, found.option: found.legacy if legacy else found.default}
