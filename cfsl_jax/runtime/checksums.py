"""SHA-256 checksums of a run's files, checked on every read: a damaged file is never used.

    checksums.write_text(files.join(workdir, "results.json"), text)  # data, then its checksum
    checksums.check_text(path, text)          # Corrupt (one line naming the file) on a mismatch
    checksums.seal(step_folder)               # after orbax wrote a checkpoint
    checksums.check_folder(step_folder)       # Corrupt naming the first damaged file

Two kinds of manifest:

- ``<folder>/checksums.json`` for a run's JSON files (``CHECKED``: config.json,
  val_history.json, results.json, sessions.json (the wall time of its sessions, which
  results.json's wall_seconds adds up), and packs.json for a run a pack trained):
  ``{name: [sha256, ...]}``. A write records the new checksum next to the current one,
  replaces the file atomically, then keeps only the new one: a kill at any instant leaves a
  file whose checksum is recorded (never a false alarm).
- ``<checkpoint folder>/cfsl_checksums.json``: ``{relative path: sha256}`` of every file orbax
  wrote, written atomically once the checkpoint is complete.

A workdir written before checksums existed has no ``checksums.json``: its files are read
unchecked and a note says so once (``legacy``); its new writes add their checksums (and are
checked from then on). Likewise a file with no entry in the manifest (a sessions.json
written before it was checked) is read unchecked until it is written again. In a workdir
written with checksums from its start (``from_the_start``), a checkpoint without its manifest
(its write was cut short) counts as damaged. A results.json written with checksums says so
(``"checksummed": true``, ``CLAIM``): without its folder's manifest it is refused as damaged,
never read unchecked (a hand edit behind a deleted manifest would be reported as a result).

Self-checking ("sealed") files, for a file several processes write into one folder at once (a
FLUID workdir's ``streams/<i>.json`` and ``new_class.json``: SLURM jobs), where the folder's
manifest (a read-modify-write) is not safe: ``seal_json(payload)`` is the payload's JSON with
one more key, ``sealed_sha256``, the SHA-256 of the canonical JSON of the rest (``canonical``);
``read_sealed(path, advice)`` checks it on every read (``Corrupt``: one line naming the file and
``advice``). A file written before seals (no ``sealed_sha256``) is read unchecked, with a note
once per folder.

Append-only files (``metrics.jsonl``: a run's records, appended as it trains): the manifest
holds ``{name: [[length, sha256], ...]}``, the SHA-256 of the file's first ``length`` bytes,
recorded at every checkpoint and when the run ends (``seal_appended``: every complete line so
far; its writer keeps a ``RunningDigest`` of what it appended, so a seal costs what was
appended since the last, not the file). ``read_appended`` checks that part on every read
(``Corrupt``: one line naming the file); the lines after it (a kill's, before the next
checkpoint) are read as they are, a line cut short skipped. A resume that drops records
(``replace_appended``) records the new seal beside the old one, replaces the file, then keeps
the new one. A file with no seal recorded (written before seals) is read unchecked.
"""

from __future__ import annotations

import hashlib
import json
import os

from cfsl_jax.runtime import files, progress
from cfsl_jax.runtime.errors import UserError

MANIFEST = "checksums.json"
SEAL = "cfsl_checksums.json"
SEALED = "sealed_sha256"  # the key of a sealed file's own checksum
CHECKED = ("config.json", "val_history.json", "results.json", "sessions.json", "packs.json")
_noted: set = set()  # legacy folders (and unsealed files' folders) noted in this process


class Corrupt(UserError):
    """A file does not match its recorded checksum (or cannot be read): the message names it."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with files.path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def has_manifest(folder: str) -> bool:
    return files.exists(files.join(folder, MANIFEST))


def recorded(folder: str) -> list[str]:
    """The names in ``folder`` whose checksums are recorded."""
    return sorted((_manifest(folder) or {}).keys())


def recorded_sha256(path: str) -> list[str]:
    """The SHA-256s recorded for ``path`` in its folder's manifest (also after the file was
    deleted); [] where none is."""
    return list((_manifest(files.dirname(path)) or {}).get(files.basename(path), []))


def from_the_start(workdir: str) -> bool:
    """Whether ``workdir`` was written with checksums from its start (its ``config.json``'s
    is recorded): then every checkpoint in it must have its manifest. A workdir written before
    checksums and resumed since has a manifest without it."""
    return "config.json" in recorded(workdir)


def _manifest(folder: str) -> dict | None:
    path = files.join(folder, MANIFEST)
    if not files.exists(path):
        return None
    try:
        manifest = json.loads(files.read_text(path))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Corrupt(f"{path} is not valid JSON (damaged); delete it to read the folder's "
                      f"files unchecked, as a folder written before checksums", path) from None
    return manifest if isinstance(manifest, dict) else {}


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically; for the ``CHECKED`` names, with its checksum."""
    folder, name = files.dirname(path), files.basename(path)
    if name not in CHECKED:
        files.write_atomic(path, text)
        return
    manifest = _manifest(folder) or {}
    new = sha256(text)
    known = manifest.get(name, [])
    # the file there now: after an earlier replacement cut short (its manifest then lists the
    # file and the one that never landed), the one on disk, not the last one listed
    there = sha256(files.read_bytes(path)) if known and files.exists(path) else None
    current = [h for h in ([there] if there in known else known[-1:]) if h != new]
    manifest[name] = current + [new]  # the file there now, or the new one, while replacing it
    _write_manifest(folder, manifest)
    files.write_atomic(path, text)
    manifest[name] = [new]
    _write_manifest(folder, manifest)


def _write_manifest(folder: str, manifest: dict) -> None:
    files.write_atomic(files.join(folder, MANIFEST), json.dumps(manifest, indent=1,
                                                                sort_keys=True) + "\n")


def legacy(folder: str) -> None:
    """Say once per process that ``folder`` was written before checksums."""
    if folder not in _noted:
        _noted.add(folder)
        progress.say(f"note: {folder} was written before checksums (no {MANIFEST}): its files "
                     f"are read unchecked")


def check_text(path: str, text: str | bytes) -> None:
    """``Corrupt`` when ``path`` (read as ``text``) is a ``CHECKED`` file whose checksum is
    recorded and differs."""
    folder, name = files.dirname(path), files.basename(path)
    if name not in CHECKED:
        return
    manifest = _manifest(folder)
    if manifest is None:
        if name == "results.json" and _claims_checksums(text):
            raise Corrupt(f"{path} was written with its folder's checksums, but {folder} has no "
                          f"{MANIFEST} (deleted or lost): its numbers cannot be checked; restore "
                          f"{MANIFEST}, or delete {name} and run the same training command "
                          f"again: the run is tested again from its checkpoints", path)
        legacy(folder)
        return
    recorded = manifest.get(name)
    if not recorded and name == "results.json" and _claims_checksums(text):
        raise Corrupt(f"{path} was written with its folder's checksums, but {folder}/{MANIFEST} "
                      f"records none for it (removed by hand or lost): its numbers cannot be "
                      f"checked; delete {name} and run the same training command again: the "
                      f"run is tested again from its checkpoints", path)
    if recorded and sha256(text) not in recorded:
        raise Corrupt(f"{path} fails its checksum (SHA-256 {sha256(text)[:12]}, recorded "
                      f"{recorded[-1][:12]} in {MANIFEST}): it was changed or damaged after it "
                      f"was written; {_ADVICE.get(name, 'restore it or give another folder')}",
                      path)


CLAIM = "checksummed"  # results.json's key saying its folder's manifest records it


def _claims_checksums(text: str | bytes) -> bool:
    """Whether a results.json says that it was written with checksums (a folder written before
    them is read unchecked; one written with them and without its manifest now is damaged)."""
    try:
        return json.loads(text).get(CLAIM) is True
    except (ValueError, AttributeError):  # not JSON (its reader says so), or not an object
        return False


_ADVICE = {
    "config.json": "if the run's flags are unchanged, delete it and run the same command again "
                   "(it is written again from the flags)",
    "val_history.json": "delete it and the folder checkpoints/latest, then run the same "
                        "command again: training restarts from step 0 and gives the same numbers",
    "results.json": "delete it and run the same command again: the run is tested again from "
                    "its checkpoints",
    "sessions.json": "restore it, or delete it and run the same command again (the run's "
                     "wall_seconds then count only the sessions from then on)",
}


def read_checked(path: str) -> str:
    """The text of ``path``, checked (``check_text``)."""
    raw = files.read_bytes(path)
    check_text(path, raw)
    return raw.decode()


# -- checkpoint folders --------------------------------------------------------------------
def digests(folder: str) -> dict[str, str]:
    """{path relative to ``folder``: sha256} of every file under it but the manifest."""
    out = {}
    for root, _, names in files.walk(folder):
        for name in names:
            path = files.join(root, name)
            relative = path[len(folder):].lstrip("/")
            if relative != SEAL:
                out[relative] = file_sha256(path)
    return out


def seal(folder: str) -> None:
    """Write ``folder``'s manifest (after the checkpoint in it is complete)."""
    files.write_atomic(files.join(folder, SEAL), json.dumps(digests(folder), indent=1,
                                                            sort_keys=True) + "\n")


def check_folder(folder: str, required: bool = True) -> bool:
    """Whether ``folder``'s files match its manifest: True; False when it has none and
    ``required`` is False (a legacy workdir); ``Corrupt`` naming the first file that differs
    or is missing (or the missing manifest, when ``required``)."""
    path = files.join(folder, SEAL)
    if not files.exists(path):
        if required:
            raise Corrupt(f"{folder} has no checksums ({SEAL}; its write was cut short)", folder)
        return False
    try:
        recorded = json.loads(files.read_text(path))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Corrupt(f"{path} is damaged (not valid JSON)", path) from None
    for relative, expected in sorted(recorded.items()):
        name = files.join(folder, relative)
        if not files.isfile(name):
            raise Corrupt(f"{name} is missing (its checkpoint's checksums list it)", name)
        if file_sha256(name) != expected:
            raise Corrupt(f"{name} fails its checksum (the checkpoint was damaged after it "
                          f"was written)", name)
    return True


# -- sealed files ----------------------------------------------------------------------------
def canonical(payload) -> str:
    """The JSON text a seal is the SHA-256 of: keys sorted, no spaces (inf and NaN as JSON's
    extension writes them, as the file holds them)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def seal_json(payload: dict) -> str:
    """``payload``'s JSON text with ``SEALED``: the SHA-256 of its canonical JSON, as read back."""
    if not isinstance(payload, dict) or SEALED in payload:
        raise ValueError(f"seal_json takes a dict without {SEALED!r}")
    payload = json.loads(json.dumps(payload))  # as a reader parses it (tuples, int keys)
    return json.dumps({**payload, SEALED: sha256(canonical(payload))}, indent=2,
                      sort_keys=True) + "\n"


def read_sealed(path: str, advice: str) -> dict:
    """The payload of the sealed file ``path`` (without ``SEALED``), its seal checked;
    ``Corrupt`` (naming ``path``, then ``advice``) when it is not a JSON object or fails its seal.
    A file written before seals is read unchecked (a note once per folder)."""
    try:
        payload = json.loads(files.read_bytes(path).decode())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Corrupt(f"{path} is not valid JSON (truncated or damaged); {advice}", path) from None
    if not isinstance(payload, dict):
        raise Corrupt(f"{path} is not a JSON object (damaged); {advice}", path)
    if SEALED not in payload:
        folder = files.dirname(path)
        if ("sealed", folder) not in _noted:
            _noted.add(("sealed", folder))
            progress.say(f"note: {path} was written before sealed files (no {SEALED}): it and "
                         f"the others in {folder} without one are read unchecked")
        return payload
    recorded = payload.pop(SEALED)
    actual = sha256(canonical(payload))
    if actual != recorded:
        raise Corrupt(f"{path} fails its checksum (SHA-256 {actual[:12]}, sealed "
                      f"{str(recorded)[:12]}): it was changed or damaged after it was written; "
                      f"{advice}", path)
    return payload


# -- append-only files -----------------------------------------------------------------------
class RunningDigest:
    """The length and SHA-256 of an append-only file's complete lines, kept up to date by its
    one writer as it appends (``update``), so that a seal need not read the file again."""

    def __init__(self, data: bytes = b""):
        self.length, self._hash = len(data), hashlib.sha256(data)

    def update(self, data: bytes) -> None:
        self.length += len(data)
        self._hash.update(data)

    def seal(self) -> list:
        return [self.length, self._hash.hexdigest()]


def seal_appended(path: str, digest: RunningDigest | None = None) -> RunningDigest | None:
    """Record in the folder's manifest the length and SHA-256 of ``path``'s complete lines
    (up to its last newline), flushed to the disk first: readers check that part from then on
    (``read_appended``). ``digest``: those lines' running digest, kept by the file's writer
    (the file is not read again); None: the file is read. Returns the digest for the next
    seal to extend; None when the file does not exist (nothing is sealed) or ends in a line
    cut short (its complete lines are sealed; how the cut line ends, the writer cannot know)."""
    if not files.isfile(path):
        return None
    if digest is not None and (files.is_url(path) or os.path.getsize(path) != digest.length):
        digest = None  # changed by another hand since (or remote, rewritten whole): read it
    extendable = digest is not None
    if digest is None:
        data = files.read_bytes(path)
        complete = data[:data.rfind(b"\n") + 1]
        digest, extendable = RunningDigest(complete), len(complete) == len(data)
    if not files.is_url(path):  # never a seal of bytes a power loss takes back
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
    _record_seals(path, [digest.seal()])
    return digest if extendable else None


def _seals(path: str) -> list[list]:
    """The ``[length, sha256]`` seals recorded for the append-only file ``path`` ([]: none)."""
    seals = (_manifest(files.dirname(path)) or {}).get(files.basename(path))
    return [s for s in seals if isinstance(s, list) and len(s) == 2] if isinstance(
        seals, list) else []


def _record_seals(path: str, seals: list[list]) -> None:
    folder, name = files.dirname(path), files.basename(path)
    manifest = _manifest(folder) or {}
    if seals:
        manifest[name] = seals
    elif manifest.pop(name, None) is None:
        return
    _write_manifest(folder, manifest)


def forget_appended(path: str) -> None:
    """Drop the seal of ``path`` (the file was deleted: what is appended next starts again)."""
    if _seals(path):
        _record_seals(path, [])


def read_appended(path: str, advice: str) -> tuple[bytes, int]:
    """(the bytes of the append-only file ``path``, the length of its sealed part: 0 where no
    seal is recorded, a file written before seals); ``Corrupt`` (one line naming ``path``, then
    ``advice``) when its start matches none of the recorded seals."""
    seals = _seals(path)  # the manifest first: the file only grows after a seal
    data = files.read_bytes(path)
    if _matched(seals, data) is None and seals and _seals(path) != seals:
        seals, data = _seals(path), files.read_bytes(path)  # a resume rewound it meanwhile
    if not seals:
        return data, 0
    length = _matched(seals, data)
    if length is not None:
        return data, length
    length, digest = seals[-1]
    what = (f"is shorter ({len(data)} bytes) than its part sealed at the last checkpoint "
            f"({length} bytes)" if len(data) < length else
            f"fails its checksum (SHA-256 of its first {length} bytes "
            f"{sha256(data[:length])[:12]}, recorded {str(digest)[:12]} in {MANIFEST})")
    raise Corrupt(f"{path} {what}: it was changed or damaged after it was written; {advice}",
                  path)


def _matched(seals: list[list], data: bytes) -> int | None:
    """The length of the first seal that ``data``'s start matches, or None."""
    for length, digest in seals:
        if isinstance(length, int) and len(data) >= length and sha256(data[:length]) == digest:
            return length
    return None


def replace_appended(path: str, data: bytes, sealed: int) -> None:
    """Replace the append-only file ``path`` by ``data``, whose first ``sealed`` bytes are
    what it keeps of its checked sealed part (a resume dropping records): the new seal is
    recorded beside the current one, the file replaced atomically, then the new seal kept
    alone, so a kill at any instant leaves a file that a recorded seal matches."""
    seals = _seals(path)
    new = [sealed, sha256(data[:sealed])]
    if seals and new not in seals:
        _record_seals(path, seals + [new])
    files.write_atomic(path, data)
    if seals and seals != [new]:
        _record_seals(path, [new])
