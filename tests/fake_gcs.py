"""A fake Google Cloud Storage for tests: ``gs://BUCKET/PATH`` is the local folder
``ROOT/BUCKET/PATH``, reached only through the paths' own machinery, no network.

    with fake_gcs(tmp_path / "gcs") as root:   # gs://bucket/run -> root/bucket/run
        train_and_evaluate(config, "gs://bucket/run")

- ``etils.epath`` reads and writes gs:// through fsspec's "gs"/"gcs" filesystem (without
  TensorFlow, as this project installs it); the fake registers ``FakeGCS`` under those names in
  place of gcsfs. Listing returns bucket-relative names, as gcsfs does.
- orbax writes checkpoint arrays with tensorstore, whose own GCS driver would go to the
  network: orbax's ``get_kvstore_for_gcs`` gives tensorstore the same local folder instead,
  and the bucket is a flat one (orbax asks google-cloud-storage whether it has a hierarchical
  namespace).
  Everything else of orbax's gs:// handling (its GCS atomicity: a commit file, not a rename)
  runs as on GCS. With an orbax that lacks those functions (``orbax_checkpoints_fakeable()``),
  only the fsspec side is faked: tests that checkpoint skip, naming the version.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Iterator

from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import stringify_path


class FakeGCS(LocalFileSystem):
    """fsspec's local filesystem, with gs://BUCKET/PATH mapped into ``root``."""

    protocol = ("gs", "gcs")
    root = ""  # set by fake_gcs

    @classmethod
    def _strip_protocol(cls, path):
        path = stringify_path(path)
        for prefix in ("gs://", "gcs://"):
            if path.startswith(prefix):
                path = path[len(prefix):]
        if path.startswith(cls.root):
            return path.rstrip("/") or "/"
        return f"{cls.root}/{path}".rstrip("/")

    def glob(self, path, **kwargs):  # bucket-relative names, as gcsfs returns them
        return [os.path.relpath(p, self.root) for p in super().glob(path, **kwargs)]


ORBAX_HOOKS = ("get_kvstore_for_gcs", "is_hierarchical_namespace_enabled")


def orbax_checkpoints_fakeable() -> bool:
    """Whether this orbax has the two functions the fake replaces (orbax-checkpoint 0.12.8,
    this project's tested version, has; others may build tensorstore's GCS spec elsewhere, and
    a checkpoint written under the fake would then go to the network)."""
    from orbax.checkpoint._src.path import gcs_utils
    return all(hasattr(gcs_utils, name) for name in ORBAX_HOOKS)


@contextlib.contextmanager
def fake_gcs(root: str | os.PathLike) -> Iterator[str]:
    """Inside: gs://BUCKET/PATH is ``root``/BUCKET/PATH (``root`` created); yields ``root``."""
    from etils.epath import backend
    from orbax.checkpoint._src.path import gcs_utils

    root = os.path.realpath(os.fspath(root))
    os.makedirs(root, exist_ok=True)
    registry = importlib.import_module("fsspec.registry")._registry
    saved = {name: registry.get(name) for name in FakeGCS.protocol}
    originals = {name: getattr(gcs_utils, name) for name in ORBAX_HOOKS
                 if hasattr(gcs_utils, name)}

    def local_kvstore(path: str) -> dict:
        bucket, inside = gcs_utils.parse_gcs_path(path, add_trailing_slash=False)
        return {"driver": "file", "path": os.path.join(root, bucket, inside)}

    FakeGCS.root = root
    for name in FakeGCS.protocol:
        registry[name] = FakeGCS
    FakeGCS.clear_instance_cache()
    backend.fsspec_backend._get_filesystem.cache_clear()
    if orbax_checkpoints_fakeable():
        gcs_utils.get_kvstore_for_gcs = local_kvstore
        gcs_utils.is_hierarchical_namespace_enabled = lambda path: False  # a flat bucket
    try:
        yield root
    finally:
        for name, function in originals.items():
            setattr(gcs_utils, name, function)
        for name, cls in saved.items():
            if cls is None:
                registry.pop(name, None)
            else:
                registry[name] = cls
        FakeGCS.clear_instance_cache()
        backend.fsspec_backend._get_filesystem.cache_clear()
