"""Re-check a FLUID workdir (``launch.fluid``): MATCH, UNSEALED or which numbers differ.

    python -m launch.verify --workdir=/tmp/fluid_small                 # re-runs stream 0
    python -m launch.verify --workdir=/tmp/fluid_small --streams=all   # every stream

What ``verify`` checks, in order (``launch.verify`` finds a FLUID workdir by ``is_fluid``):

1. The checksums of ``results.json`` (``experiments.verify.check_files``, as a CFSL run's) and
   the seals of ``streams/<i>.json`` and ``new_class.json`` (``checksums.read_sealed``: a
   changed one is refused in one line). One without its seal (written before seals, or its
   seal removed: the two look alike) is never a MATCH: the verdict is UNSEALED, naming it.
2. Each stream file against ``results.json``'s copy of that stream, and ``results.json``'s
   summary (mean, std, 95 % half-width over the streams) recomputed from its streams.
3. Every stream's statistics (``sequences.describe``) rebuilt from the recorded config and
   seed: the stream itself, as CFSL's task fingerprint.
4. With ``metrics`` (the default), the streams ``indices`` (stream 0 by default: a stream is
   a whole re-run, pretraining and every method; ``--streams=all`` re-runs each) re-run from
   the recorded config, seed and 'new class' thresholds, and every recorded number compared
   with tolerance 0: each method's metrics (rolling accuracy included), schedule, training
   steps and, with ``costs``, MACs. Wall times (``seconds``, ``pretrain_seconds``) are not
   compared. With ``thresholds``, the 'new class' thresholds chosen on validation streams
   are chosen again (the validation streams re-run) and compared too.

A re-run on another backend than the recorded one rounds differently: the differences then
carry a note with the largest relative difference (verify on the recorded backend for the
bit-for-bit check).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile

import jax

from cfsl_jax.experiments.verify import check_files
from cfsl_jax.runtime import checksums, files, json_files, progress
from cfsl_jax.runtime.errors import UserError

NOT_COMPARED = ("seconds", "pretrain_seconds")  # wall times of a method run
MARKERS = ("streams", "new_class.json")  # what only a FLUID workdir holds beside results.json


@dataclasses.dataclass
class Outcome:
    """What ``verify`` found: ``differences`` (lines; empty and no ``unsealed``: MATCH),
    ``unsealed`` (files without their seal), ``notes`` (said whatever the verdict) and
    ``detail`` (what a MATCH covered)."""

    differences: list[str]
    unsealed: list[str]
    notes: list[str]
    detail: str


def is_fluid(workdir: str) -> bool:
    """Whether ``workdir`` is a FLUID workdir (``launch.fluid``'s, not a CFSL run): no
    ``config.json``, and a results.json of streams, a ``streams`` folder, ``new_class.json`` or
    a study's ``update_strategy.json``."""
    if not files.isdir(workdir) or files.exists(files.join(workdir, "config.json")):
        return False
    if any(files.exists(files.join(workdir, name))
           for name in (*MARKERS, "update_strategy.json")):
        return True
    stored = json_files.read_json(files.join(workdir, "results.json"), default={})
    return isinstance(stored, dict) and "streams" in stored


def config_of(saved: dict, **paths: str | None):
    """The ``FluidConfig`` a results.json's ``config`` records (``paths`` given replace its
    ``data_dir`` / ``manual_dir``); UserError when it no longer reads as one."""
    from cfsl_jax.fluid.config import FluidConfig
    from cfsl_jax.fluid.protocol import Schedule
    from cfsl_jax.fluid.sequences import StreamConfig
    fields = {field.name for field in dataclasses.fields(FluidConfig)}
    try:
        given = {k: v for k, v in saved.items() if k in fields}
        given["stream"] = StreamConfig(**saved["stream"])
        given["schedule"] = Schedule(**saved["schedule"]) if saved.get("schedule") else None
        given["methods"] = tuple(saved["methods"])
        given.update({name: files.absolute(value) for name, value in paths.items() if value})
        return FluidConfig(**given)
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"the recorded FLUID config no longer reads as one ({error}): verify it "
                        f"with the code that wrote it") from None


def load(workdir: str, **paths: str | None) -> tuple:
    """(config, recorded results.json) of a FLUID workdir; UserError (one line) for a study's
    workdir or one without a table yet."""
    path = files.join(workdir, "results.json")
    if not files.exists(path):
        if files.exists(files.join(workdir, "update_strategy.json")):
            raise UserError(f"--workdir={workdir} holds a FLUID study (update_strategy.json), "
                            f"which launch.verify does not re-check: run its launch.fluid "
                            f"--study command into a new --workdir and compare the tables")
        raise UserError(f"--workdir={workdir} holds no FLUID table yet (no results.json): run "
                        f"its launch.fluid command again to finish it (stored streams are read)")
    recorded = json_files.read_json(path)
    if not isinstance(recorded, dict) or not {"config", "streams", "summary"} <= set(recorded):
        raise UserError(f"{path} is not a FLUID run's results (no config, streams, summary)")
    return config_of(recorded["config"], **paths), recorded


def stream_indices(text: str, held: int) -> list[int]:
    """``--streams``: 'all' or comma-separated indices of the ``held`` streams."""
    if text.strip() == "all":
        return list(range(held))
    try:
        wanted = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UserError(f"--streams={text!r} is neither 'all' nor stream indices (0,1)") from None
    outside = [i for i in wanted if not 0 <= i < held]
    if not wanted or outside:
        raise UserError(f"--streams={text}: the run holds streams 0 to {held - 1}"
                        if held else f"--streams={text}: the run holds no stream")
    return wanted


def plain(value):
    """``value`` as results.json holds it (tuples as lists, numpy numbers as floats)."""
    return json.loads(json.dumps(value, default=float))


def leaf_differences(recorded, now, where: str) -> list[tuple[str, object, object]]:
    """(path, recorded, now) of each differing leaf (two NaNs are equal; a list of numbers
    is one leaf)."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        out = []
        for key in sorted(set(recorded) | set(now), key=str):
            out += leaf_differences(recorded.get(key), now.get(key), f"{where}.{key}")
        return out
    if isinstance(recorded, list) and isinstance(now, list) and len(recorded) == len(now) and \
            not all(isinstance(v, (int, float)) for v in recorded + now):
        return [d for i, (a, b) in enumerate(zip(recorded, now))
                for d in leaf_differences(a, b, f"{where}[{i}]")]
    return [] if _same(recorded, now) else [(where, recorded, now)]


def _same(a, b) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def relative(a, b) -> float:
    """The largest relative difference of two numbers or lists of numbers (inf otherwise)."""
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return max((relative(x, y) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not math.isnan(a - b):
        return abs(a - b) / max(abs(a), 1e-30) if a != b else 0.0
    return math.inf


def describe(path: str, recorded, now) -> str:
    """One line for a differing leaf (a list of numbers: how many of its values)."""
    if isinstance(recorded, list) and isinstance(now, list) and len(recorded) == len(now):
        differ = sum(not _same(a, b) for a, b in zip(recorded, now))
        return (f"{path}: {differ} of its {len(recorded)} values differ (the largest by "
                f"{relative(recorded, now):.1e} relative)")
    return f"{path}: recorded {recorded!r}, now {now!r}"


def check_sealed(workdir: str, recorded: dict) -> tuple[list[str], list[str], dict, list[str]]:
    """(differences, unsealed files, {index: stream file payload}, the files read): every
    stream file and ``new_class.json`` read with its seal checked (``checksums.Corrupt``: one
    line), each against results.json's record."""
    from cfsl_jax.fluid import experiment, new_class
    differences, unsealed, stored = [], [], {}
    folder = files.join(workdir, "streams")
    names = sorted(files.listdir(folder)) if files.isdir(folder) else []
    paths = [files.join(folder, name) for name in names if name.endswith(".json")]
    thresholds = files.join(workdir, "new_class.json")
    paths += [thresholds] if files.exists(thresholds) else []
    for path in paths:
        advice = (new_class.ADVICE if path == thresholds else
                  "delete it and run the same launch.fluid command again: the stream is run "
                  "again")
        payload = checksums.read_sealed(path, advice)  # Corrupt: changed, or not JSON
        if checksums.SEALED not in json.loads(files.read_bytes(path).decode()):
            unsealed.append(path)
        if path == thresholds:
            chosen = payload.get("thresholds", {})
            used = {n: e for n, e in recorded.get("new_class", {}).items() if n in chosen}
            differences += [describe(*d) for d in leaf_differences(
                plain(used), plain({n: chosen[n] for n in used}),
                "new_class.json thresholds")]
            continue
        index = files.basename(path)[:-len(".json")]
        if not index.isdigit() or path != experiment.stream_file(workdir, int(index)):
            continue
        stored[int(index)] = payload
        held = recorded["streams"]
        if int(index) < len(held):
            mine = {"stream": payload.get("stream"), "methods": payload.get("methods")}
            differences += [describe(*d) for d in leaf_differences(
                plain(held[int(index)]), plain(mine), f"streams/{index}.json vs results.json")]
    return differences, unsealed, stored, [path[len(workdir):].lstrip("/") for path in paths]


def summary_differences(recorded: dict) -> list[str]:
    """results.json's ``summary`` against the one its streams give (``experiment.summarise``)."""
    from cfsl_jax.fluid.experiment import summarise
    if not recorded["streams"]:
        return []
    now = summarise([stream["methods"] for stream in recorded["streams"]])
    return [describe(*d) for d in leaf_differences(plain(recorded["summary"]), plain(now),
                                                   "summary")]


def rerun(config, split, built, index: int, thresholds: dict) -> tuple[dict, dict]:
    """Stream ``index`` run again: (its statistics, per method results), as results.json's."""
    from cfsl_jax.fluid.experiment import run_one_stream
    stats, per_method, _ = run_one_stream(config, split, built, index, thresholds)
    return stats, per_method


def method_differences(recorded: dict, now: dict, where: str, costs: bool) -> list[tuple]:
    """Differing leaves of one stream's methods, but wall times (and MACs without ``costs``)."""
    skip = NOT_COMPARED + (() if costs else ("macs",))

    def kept(methods):
        return {name: {k: v for k, v in entry.items() if k not in skip}
                for name, entry in methods.items()}
    return leaf_differences(plain(kept(recorded)), plain(kept(now)), where)


def verify(workdir: str, metrics: bool = True, data_dir: str | None = None,
           manual_dir: str | None = None, costs: bool = True, streams: str = "0",
           thresholds: bool = True) -> Outcome:
    """Re-check a FLUID workdir (module doc): the differences, the unsealed files and what a
    MATCH covered."""
    check_files(workdir)  # results.json's checksum (checksums.json), as a CFSL run's files
    config, recorded = load(workdir, data_dir=data_dir, manual_dir=manual_dir)
    held = len(recorded["streams"])
    indices = stream_indices(streams, held) if metrics else []
    differences, unsealed, stored, sealed = check_sealed(workdir, recorded)
    differences += summary_differences(recorded)
    from cfsl_jax.fluid import experiment
    from cfsl_jax.fluid.sequences import describe as stream_statistics
    split = experiment.load(config)
    dataset = {"name": split.info.dataset, "split": split.info.split,
               "num_classes": split.info.num_classes, "num_images": split.info.num_images,
               "source": split.info.source}
    differences += [describe(*d) for d in leaf_differences(plain(recorded["dataset"]),
                                                           plain(dataset), "dataset")]
    for index in range(held):  # every stream rebuilt: cheap, and the stream is the test
        stream, classes = experiment.prepare_stream(config, split, index)
        differences += [describe(*d) for d in leaf_differences(
            plain(recorded["streams"][index]["stream"]),
            plain(stream_statistics(stream, classes)), f"stream {index} statistics")]
    numeric: list[tuple] = []
    said: list[str] = []
    chosen_again = False
    if indices and not differences:
        built = experiment.build_methods(config, split)
        used = recorded.get("new_class", {})
        selected = [n for n, entry in used.items() if entry.get("rule") != "given"]
        if thresholds and selected:
            with tempfile.TemporaryDirectory() as scratch:  # chosen again, not read back
                again = experiment.new_class_thresholds(config, scratch, split, built)
            numeric += leaf_differences(plain(used), plain(again), "new_class")
            chosen_again = True
        for index in indices:
            with progress.stage(f"[verify] re-running {config.streams} stream {index} "
                                f"({len(config.methods)} method(s))"):
                own = stored.get(index, {}).get("new_class", used)
                _, per_method = rerun(config, split, built, index,
                                      {n: e["threshold"] for n, e in own.items()})
            numeric += method_differences(recorded["streams"][index]["methods"], per_method,
                                          f"stream {index} methods", costs)
    elif indices:
        said.append(f"no stream re-run: the records differ already (--streams={streams})")
    differences += [describe(*d) for d in numeric] + notes(recorded, numeric)
    if not recorded.get("complete", True):
        said.append(f"results.json holds {held} of the {recorded['config'].get('num_streams')} "
                    f"streams (unfinished: the launch.fluid command again runs the rest)")
    return Outcome(differences, unsealed, said,
                   match_detail(held, indices, metrics, costs, chosen_again, sealed))


def notes(recorded: dict, numeric: list[tuple]) -> list[str]:
    """Why re-run numbers may differ: another backend's kernels, another jax's cost model."""
    if not numeric:
        return []
    versions = recorded.get("versions", {})
    largest = max(relative(a, b) for _, a, b in numeric)
    out = []
    if versions.get("backend") not in (None, jax.default_backend()):
        out.append(f"note: recorded on {versions['backend']}, re-run on "
                   f"{jax.default_backend()}: the largest difference is {largest:.1e} relative, "
                   f"the rounding of another backend's kernels; verify on "
                   f"{versions['backend']} for the bit-for-bit check")
    if versions.get("jax") not in (None, jax.__version__):
        out.append(f"note: recorded with jax {versions['jax']}, re-run with jax "
                   f"{jax.__version__}, whose XLA may round and count MACs otherwise")
    return out


def match_detail(held: int, indices: list[int], metrics: bool, costs: bool,
                 chosen_again: bool, sealed: list[str]) -> str:
    """What a FLUID MATCH covered (``sealed``: the sealed files read)."""
    seals = (f", the seals of {', '.join(sealed)}" if sealed else
             " (no stream file or new_class.json)")
    copies = ", each stream file equal to results.json's copy" if any(
        name.startswith("streams") for name in sealed) else ""
    checked = (f"results.json's checksum{seals}{copies}, the summary over the {held} "
               f"stream(s) recomputed, every stream's statistics rebuilt")
    if not metrics:
        return f"{checked}; no stream re-run (--nometrics)"
    others = [i for i in range(held) if i not in indices]
    rest = (f" (streams {', '.join(map(str, others))} not re-run: --streams=all re-runs "
            f"every one)" if others else "")
    what = "metrics, schedules, training steps" + (", MACs" if costs else
                                                   " (MACs not compared: --nocosts)")
    return (f"{checked}; stream(s) {', '.join(map(str, indices))} of {held} re-run{rest}: "
            f"every method's {what} bit-equal (tolerance 0; wall times not compared)"
            + ("; the 'new class' thresholds chosen again on the validation streams, equal"
               if chosen_again else ""))
