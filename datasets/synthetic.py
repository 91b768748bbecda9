"""Procedurally generated glyph classes: the embedded dataset (no download).

`generate(num_classes, samples_per_class, image_size, seed)` returns
`(images uint8 [N, H, W, 1], labels int32 [N])`, class-major (sample `s` of
class `c` is row `c * samples_per_class + s`), a pure function of its
arguments (numpy `default_rng(seed)`; this is data generation, not a JAX
random choice).

Rules:
- A class is 2-5 strokes, each a quadratic Bezier curve whose control points
  lie in the central area; half of the strokes after the first start where the
  previous one ended, so glyphs are partly connected.
- A sample is its class's strokes with per-sample jitter: control-point noise,
  a small affine map (rotation ~ 7 deg, per-axis scale ~ 8 %, shear, shift
  ~ 1 px at 28x28) and a stroke width jitter (~ 15 %).
- Rendering splats Gaussian ink along each curve (points spaced <= ~1 px,
  weighted by arc length so a stroke has a uniform cross-profile). The splat
  is separable, so an image is one small matrix product `Gy^T @ Gx`: the
  default 1623 x 20 at 28x28 takes 1.3 s on 2 idle cores. Work is chunked
  to bound memory.
- Ink is dark on a light background, like Omniglot: 255 = paper.

`CfslSynthetic` is a TFDS builder (`cfsl_synthetic`) with the same features and
class split rule as `cfsl_omniglot` (1623 classes -> 1200/211/212), so the set
can be prepared like the others. `cfsl_jax.data.load_split("synthetic", ...)`
does not use it: it calls `generate` and builds the split in memory (faster,
no disk).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from cfsl_jax.runtime import progress

from .omniglot import SPLITS, example_features, split_ranges

MIN_STROKES, MAX_STROKES = 2, 5
CHUNK = 512  # samples rendered at once (bounds the [chunk, points, size] temporaries)


def class_name(class_index: int) -> str:
    return f"synthetic/glyph{class_index:04d}"


def _class_strokes(rng: np.random.Generator, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Control points [C, MAX_STROKES, 3, 2] in [-1, 1] coordinates and a stroke mask [C, MAX_STROKES]."""
    num_strokes = rng.integers(MIN_STROKES, MAX_STROKES + 1, size=num_classes)
    mask = np.arange(MAX_STROKES)[None, :] < num_strokes[:, None]
    start = rng.uniform(-0.6, 0.6, size=(num_classes, MAX_STROKES, 2))
    angle = rng.uniform(0.0, 2 * np.pi, size=(num_classes, MAX_STROKES))
    length = rng.uniform(0.5, 1.1, size=(num_classes, MAX_STROKES))
    bend = rng.normal(0.0, 0.3, size=(num_classes, MAX_STROKES))
    connect = rng.random(size=(num_classes, MAX_STROKES)) < 0.5
    direction = np.stack([np.cos(angle), np.sin(angle)], axis=-1)
    points = np.empty((num_classes, MAX_STROKES, 3, 2))
    for stroke in range(MAX_STROKES):
        p0 = start[:, stroke]
        if stroke > 0:  # start at the previous stroke's end for some strokes
            p0 = np.where(connect[:, stroke, None], points[:, stroke - 1, 2], p0)
        p2 = np.clip(p0 + length[:, stroke, None] * direction[:, stroke], -0.7, 0.7)
        normal = np.stack([-direction[:, stroke, 1], direction[:, stroke, 0]], axis=-1)
        p1 = 0.5 * (p0 + p2) + bend[:, stroke, None] * normal
        points[:, stroke] = np.stack([p0, np.clip(p1, -0.8, 0.8), p2], axis=1)
    return points, mask


def _render(control: np.ndarray, mask: np.ndarray, width: np.ndarray, image_size: int) -> np.ndarray:
    """Control points [n, S, 3, 2], mask [n, S], width (pixels) [n] -> uint8 [n, H, W]."""
    n = control.shape[0]
    steps = max(12, image_size)  # points per stroke: spacing <= ~1 px for the longest strokes
    t = (np.arange(steps) + 0.5) / steps
    bernstein = np.stack([(1 - t) ** 2, 2 * t * (1 - t), t**2], axis=-1)  # [T, 3]
    derivative = np.stack([-2 * (1 - t), 2 * (1 - 2 * t), 2 * t], axis=-1)  # dB/dt [T, 3]
    points = np.matmul(bernstein, control)  # [n, S, T, 2]
    velocity = np.matmul(derivative, control)
    half = image_size / 2.0
    pixels = ((points + 1.0) * half - 0.5).astype(np.float32)  # [-1, 1] -> pixel-centre coordinates
    sigma = width / 2.355  # FWHM -> sigma, [n]
    # Arc length per point (pixels) / (sqrt(2 pi) sigma): the summed splats give a unit-peak profile.
    weight = np.linalg.norm(velocity, axis=-1) * (half / steps) / (np.sqrt(2 * np.pi) * sigma[:, None, None])
    weight = (weight * mask[:, :, None]).reshape(n, -1, 1).astype(np.float32)
    inv = (-0.5 / sigma**2).astype(np.float32).reshape(n, 1, 1)
    grid = np.arange(image_size, dtype=np.float32)

    def splat(coords: np.ndarray) -> np.ndarray:  # [n, P, 1] -> exp(-(grid - c)^2 / 2 sigma^2) [n, P, size]
        out = np.subtract(grid, coords.reshape(n, -1, 1))
        np.square(out, out=out)
        np.multiply(out, inv, out=out)
        np.maximum(out, -30.0, out=out)  # exp's underflow path is slow; e^-30 is ink-free anyway
        return np.exp(out, out=out)

    gx = splat(pixels[..., 0])
    gy = splat(pixels[..., 1])
    np.multiply(gy, weight, out=gy)
    ink = np.matmul(gy.transpose(0, 2, 1), gx)  # [n, H, W]
    ink = 1.0 - np.exp(-2.5 * ink)
    return np.round(255.0 * (1.0 - ink / (1.0 - math.exp(-2.5)))).clip(0, 255).astype(np.uint8)


def generate(num_classes: int = 1623, samples_per_class: int = 20, image_size: int = 28,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Glyph images uint8 [num_classes*samples_per_class, S, S, 1] (255 = paper) and int32 labels."""
    for name, value, low in (("num_classes", num_classes, 1), ("samples_per_class", samples_per_class, 1),
                             ("image_size", image_size, 8)):
        if int(value) != value or value < low:
            raise ValueError(f"{name}={value!r}: must be an integer >= {low}")
    rng = np.random.default_rng(seed)
    class_control, class_mask = _class_strokes(rng, num_classes)
    total = num_classes * samples_per_class
    labels = np.repeat(np.arange(num_classes, dtype=np.int32), samples_per_class)
    images = np.empty((total, image_size, image_size, 1), dtype=np.uint8)
    # Lines only once generation has run INTERVAL_S (the FLUID paper set: ~1.4 M images).
    bar = progress.tracker("generating synthetic glyphs", total, "images", first_line=False,
                           quiet_if_quick=True)
    for begin in range(0, total, CHUNK):
        chunk_labels = labels[begin:begin + CHUNK]
        n = chunk_labels.shape[0]
        control = class_control[chunk_labels] + rng.normal(0.0, 0.04, size=(n, MAX_STROKES, 3, 2))
        angle = rng.normal(0.0, 0.12, size=n)
        scale = np.exp(rng.normal(0.0, 0.08, size=(n, 2)))
        shear = rng.normal(0.0, 0.08, size=n)
        shift = rng.normal(0.0, 0.07, size=(n, 2))
        cos, sin = np.cos(angle), np.sin(angle)
        rotation = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
        shear_scale = np.zeros((n, 2, 2))
        shear_scale[:, 0, 0], shear_scale[:, 0, 1], shear_scale[:, 1, 1] = scale[:, 0], shear, scale[:, 1]
        affine = rotation @ shear_scale  # [n, 2, 2]
        control = np.matmul(control, affine.transpose(0, 2, 1)[:, None]) + shift[:, None, None, :]
        width = 1.8 * (image_size / 28.0) * np.exp(rng.normal(0.0, 0.15, size=n))
        images[begin:begin + n, :, :, 0] = _render(control, class_mask[chunk_labels], width, image_size)
        bar.update(begin + n)
    return images, labels


@dataclasses.dataclass(eq=False)
class SyntheticConfig(tfds.core.BuilderConfig):
    num_classes: int = 1623
    samples_per_class: int = 20
    image_size: int = 28
    seed: int = 0


class CfslSynthetic(tfds.core.GeneratorBasedBuilder):
    """The generated glyph set, with Omniglot's class split rule (1623 -> 1200/211/212)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = [SyntheticConfig(name="default", description="1623 classes x 20, 28x28, seed 0")]

    def _info(self) -> tfds.core.DatasetInfo:
        size = self.builder_config.image_size
        return tfds.core.DatasetInfo(builder=self, description=__doc__,
                                     features=example_features((size, size, 1)),
                                     supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        config: SyntheticConfig = self.builder_config
        images, labels = generate(config.num_classes, config.samples_per_class, config.image_size,
                                  config.seed)
        ranges = split_ranges(config.num_classes)
        return {split: self._generate_examples(images, ranges[split], config.samples_per_class)
                for split in SPLITS}

    def _generate_examples(self, images: np.ndarray, classes: range, samples_per_class: int) -> Iterator:
        for label, class_index in enumerate(classes):
            for drawing in range(samples_per_class):
                yield f"{class_index}/{drawing}", {
                    "image": images[class_index * samples_per_class + drawing], "label": label,
                    "drawing": drawing, "class_name": class_name(class_index)}
