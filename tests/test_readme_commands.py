"""The README is executable truth: every command README.md and docs/*.md show runs as written.

Each ``python -m launch.NAME ...`` / ``python -m cfsl_jax.launch.NAME ...`` / ``cfsl-NAME --...``
command is extracted (backslash continuations joined), its placeholders (``W``, ``S``, ``L``,
``D``, ``FILE.json``, ``/tmp/...`` folders) replaced by real paths under a temporary folder, and
run through the command's own ``run()`` with ``--validate_only``: its flags are parsed and
every check a run makes before working (configs, paths, specs, datasets' folders) is made, in
this process, without compiling or writing anything. A flag list in brackets
(``[--nss --nc ...]``) must name flags the command has. Commands are grouped by module: a
module is imported with its flags and removed again (its flags deleted) before the next, as
the commands' flags overlap (``--dataset`` of train and show_task): ``launch_inprocess``.
"""

import glob
import json
import os
import re
import shlex

import pytest
from absl import flags

from launch_inprocess import command_module, run_in_process
from test_cli import write_tiny_workdir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs",
                                                                            "*.md")))]
COMMANDS = ("train", "evaluate", "verify", "show_task", "fluid", "sweep", "report")
_START = re.compile(r"(?:python -m (?:cfsl_jax\.)?launch\.(\w+)|\bcfsl-([a-z][a-z-]*))")
_END = re.compile(r"[`|#\"\n]")
PLACEHOLDERS = {"learner": {"L": "protonets"}, "dataset": {"D": "synthetic"},
                "shard": {"$k/N": "1/2", "K/N": "1/2"}}
OUTPUTS = ("workdir", "sweep_dir", "out_dir", "out", "paper_results", "manual_dir", "data_dir")


def extract(text: str) -> list[tuple[str, list[str], list[str]]]:
    """[(command, argv, flag names listed in brackets)] of every command shown in ``text``."""
    text = re.sub(r"\\\n\s*", " ", text)
    found = []
    for match in _START.finditer(text):
        name = match.group(1) or match.group(2).replace("-", "_")
        rest = text[match.end():]
        rest = rest[:_END.search(rest).start()] if _END.search(rest) else rest
        optional = " ".join(re.findall(r"\[([^\]]*)\]", rest)).split()
        listed = [re.match(r"--(\w+)", token).group(1) for token in optional
                  if re.match(r"--\w+", token)]
        argv = [token for token in _words(re.sub(r"\[[^\]]*\]", " ", rest))
                if token != "..."] + [token for token in optional if _shown_value(token)]
        if name not in COMMANDS or not (argv or listed):
            continue  # `python -m launch.NAME`, `cfsl-train`: a mention, not a command
        found.append((name, argv, listed))
    return found


def _words(command: str) -> list[str]:
    """The command's words as a shell splits them (quotes kept together), up to the first
    redirection or control operator (``> log 2>&1 &``)."""
    words = []
    try:
        split = shlex.split(command)
    except ValueError:  # an unbalanced quote in prose around the command
        split = command.split()
    for word in split:
        if word in (">", ">>", "2>&1", "&", "&&", "|", ";") or word.startswith(">"):
            break
        words.append(word)
    return words


def _shown_value(token: str) -> bool:
    """Whether an optional ``--flag=value`` shows a real value (run it), not a pattern such as
    ``--learner_option=K=V``, ``--budget=default/quick/paper`` or ``--method=a,b,...``."""
    flag, sep, value = token[2:].partition("=")
    return bool(token.startswith("--") and sep and "..." not in value
                and not re.fullmatch(r"([A-Z]:)?[A-Z]=[A-Z]", value)
                and ("/" not in value or flag in OUTPUTS))


def shown_commands() -> list[tuple[str, str, list[str], list[str]]]:
    commands = []
    for path in DOCUMENTS:
        with open(path) as f:
            for name, argv, listed in extract(f.read()):
                commands.append((os.path.relpath(path, REPO), name, argv, listed))
    return commands


def test_the_extraction_finds_every_kind_of_command():
    text = ("run `python -m launch.train --learner=L --workdir=W [--nss --nc --budget=a/b "
            "--seed=1 --learner_option=K=V]` | x\n"
            "```\npython -m launch.sweep --workdir=W --cells=B3 \\\n    --seeds=0,1\n```\n"
            "`cfsl-train`, `python -m launch.NAME`, `cfsl-show-task --task=b3` and "
            "`python -m launch.train ... --workdir=W`")
    assert extract(text) == [
        ("train", ["--learner=L", "--workdir=W", "--seed=1"],
         ["nss", "nc", "budget", "seed", "learner_option"]),
        ("sweep", ["--workdir=W", "--cells=B3", "--seeds=0,1"], []),
        ("show_task", ["--task=b3"], []),
        ("train", ["--workdir=W"], [])]
    by_command = {name for _, name, _, _ in shown_commands()}
    assert by_command == set(COMMANDS)  # the docs show every command at least once
    assert len(shown_commands()) >= 20


def materialise(name: str, argv: list[str], folder: str) -> list[str]:
    """``argv`` with its placeholders and output paths under ``folder`` (inputs made real)."""
    os.makedirs(folder)
    # evaluate with train flags (--learner) tests a learner that needs no training into a new
    # workdir; without them it re-tests the finished run in --workdir
    fresh = any(token.startswith("--learner=") for token in argv)
    result = []
    for token in argv:
        flag, sep, value = token[2:].partition("=")
        if not token.startswith("--") or not sep:
            result.append(token)
            continue
        value = PLACEHOLDERS.get(flag, {}).get(value, value)
        if flag == "out":
            value = os.path.join(folder, os.path.basename(value))
        elif flag in OUTPUTS:
            value = _path_for(flag, value, folder)
        if flag == "workdir" and (name == "verify" or name == "evaluate" and not fresh):
            write_tiny_workdir(value)  # a finished run to re-test or verify
            with open(os.path.join(value, "results.json"), "w") as f:
                json.dump({}, f)
        elif flag == "sweep_dir":
            run_dir = os.path.join(value, "synthetic", "protonets", "B3", "seed0")
            os.makedirs(run_dir)
            with open(os.path.join(run_dir, "results.json"), "w") as f:
                json.dump({}, f)
        elif flag == "paper_results":
            with open(value, "w") as f:
                json.dump({"source": "test", "values": {}}, f)
        elif flag == "flagfile":  # a run's flags.txt
            value = os.path.join(folder, "flags.txt")
            with open(value, "w") as f:
                f.write(f"--learner=protonets\n--task=b3\n--workdir={folder}/w\n")
        elif flag == "manual_dir" and not os.path.exists(value):
            os.makedirs(value)
        result.append(f"--{flag}={value}")
    return result


def _path_for(flag: str, value: str, folder: str) -> str:
    """A path flag's value for the test: a folder that exists relative to the repository (e.g.
    ``../shared/data/omniglot``) made absolute; anything else (a placeholder such as ``W`` or
    ``FOLDER_WITH_THE_TWO_OFFICIAL_ZIPS``, an absolute path, a URL) under ``folder``, so that
    nothing is ever created outside it."""
    in_repo = os.path.normpath(os.path.join(REPO, value))
    if "://" not in value and not os.path.isabs(value) and os.path.exists(in_repo):
        return in_repo
    return os.path.join(folder, flag + (".json" if value.endswith(".json") else ""))


def test_materialising_the_shown_commands_creates_nothing_outside_its_folder(tmp_path,
                                                                             monkeypatch):
    cwd, folder = tmp_path / "cwd", tmp_path / "commands"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    in_repo = sorted(os.listdir(REPO))
    for i, (_, name, argv, _) in enumerate(shown_commands()):
        materialise(name, argv, str(folder / str(i)))
    assert os.listdir(cwd) == [] and sorted(os.listdir(REPO)) == in_repo
    assert sorted(os.listdir(tmp_path)) == ["commands", "cwd"]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_shown_in_the_docs_is_valid_as_written(name, tmp_path, monkeypatch):
    # The docs' SLURM examples name a cluster's partitions (gpu): this machine's SLURM, if any,
    # is not asked; every other check of --launcher=slurm is made.
    monkeypatch.setattr("cfsl_jax.experiments.slurm.check_cluster", lambda options, **_: None)
    shown = [(doc, argv, listed) for doc, command, argv, listed in shown_commands()
             if command == name]
    failures = []
    with command_module(name) as module:
        defined = set(flags.FLAGS)
        for i, (doc, argv, listed) in enumerate(shown):
            unknown = [flag for flag in listed if flag not in defined]
            if unknown:
                failures.append(f"{doc}: {name} {' '.join(argv)}: lists unknown flags {unknown}")
            real = materialise(name, argv, str(tmp_path / str(i)))
            code, stdout, stderr = run_in_process(module, name, [*real, "--validate_only"])
            if code != 0 or "valid: nothing was run" not in stdout:
                failures.append(f"{doc}: {name} {' '.join(argv)}: exit {code}: {stderr.strip()}")
    assert not failures, "\n".join(failures)


def test_the_constraints_pin_the_versions_the_readme_names():
    with open(os.path.join(REPO, "README.md")) as f:
        named = re.search(r"Tested with jax (\S+) \(jaxlib (\S+)\), flax (\S+), optax (\S+) and "
                          r"orbax\s+(\S+) on CPU", f.read()).groups()
    with open(os.path.join(REPO, "constraints.txt")) as f:
        pins = dict(line.strip().split("==") for line in f if "==" in line)
    assert [pins[p] for p in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")] == list(
        named)
    with open(os.path.join(REPO, ".ci", "run")) as f:
        assert 'pip install --quiet -c constraints.txt -e ".[dev]"' in f.read()


def test_the_readme_lists_every_flag_of_launch_train():
    with command_module("train"):
        defined = {flag for flag in flags.FLAGS
                   if any(module.endswith(("launch.train", "launch.options", "launch.cli"))
                          for module in [flags.FLAGS.find_module_defining_flag(flag) or ""])}
        deprecated = {flag for flag in defined
                      if (flags.FLAGS[flag].help or "").startswith("Deprecated:")}
    row = next(listed + [t[2:].partition("=")[0] for t in argv]
               for doc, name, argv, listed in shown_commands()
               if name == "train" and listed and doc == "README.md")
    assert sorted(defined - deprecated - set(row)) == []
