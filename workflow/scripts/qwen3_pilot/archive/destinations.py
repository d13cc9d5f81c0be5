"""Where an archive goes: a local folder, or an S3 bucket through Snakemake's storage plugin (s3.py, loaded only
when one is used). Each is a Destination: checked to exist (the archive never creates it), written file by file,
each file whole or absent, and read back as sha256 and size."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..artifacts import MISSING, current_sha256
from .errors import KEY, ArchiveError
from .settings import LOCAL, S3, check_settings, tls_warnings

log = logging.getLogger("qwen3_pilot")

class Destination(Protocol):
    url: str  # where the run's files go (<destination>/<run key>), without credentials

    def check(self) -> None:
        """Raises ArchiveError when the destination is not there (the archive never creates it)."""

    def put(self, source: Path, path: str) -> None:
        """Copies `source` to `path` under the run's folder at the destination."""

    def read_back(self, path: str) -> tuple[str, int | None]:
        """The sha256 and size of `path` as read back from the destination; (MISSING, None) when absent."""


@dataclass
class LocalDestination:
    """A folder on a local or mounted file system. Like a bucket, the folder must exist: the archive creates
    only the run's folder inside it."""

    root: Path
    run_key: str

    @property
    def url(self) -> str:
        return str(self.root / self.run_key)

    def check(self) -> None:
        if not self.root.is_dir():
            raise ArchiveError(f"{KEY}.destination = {str(self.root)!r}: no such folder; the archive never "
                               "creates its destination: create it (or mount it) and rerun")

    def put(self, source: Path, path: str) -> None:
        target = self.root / self.run_key / path
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)  # a file at the destination is whole or absent
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def read_back(self, path: str) -> tuple[str, int | None]:
        target = self.root / self.run_key / path
        digest = current_sha256(target)
        return digest, (target.stat().st_size if digest != MISSING else None)


def destination_kind(destination: str) -> str:
    return S3 if urlsplit(destination).scheme == S3 else LOCAL


def open_destination(settings: dict[str, Any], run_key: str, workflow_dir: Path, scratch: Path) -> Destination:
    """The destination of config `archive` for this run; `scratch` is a local folder for read-back
    downloads. A local destination is relative to the workflow folder unless absolute."""
    check_settings(settings)
    for warning in tls_warnings(settings):
        log.warning(warning)
    if destination_kind(settings["destination"]) == S3:
        try:
            from .s3 import S3Destination
        except ImportError as error:
            raise ArchiveError(f"{KEY}.destination = {settings['destination']!r} needs Snakemake's S3 storage "
                               f"plugin (snakemake-storage-plugin-s3, pinned in workflow/envs/cpu.txt): {error}"
                               ) from None
        return S3Destination(settings, run_key, scratch)
    root = (workflow_dir / settings["destination"]).resolve()
    inside = [name for name in ("results", "logs", "benchmarks", "signoffs")
              if root == (workflow_dir / name).resolve() or (workflow_dir / name).resolve() in root.parents]
    if inside:
        raise ArchiveError(f"{KEY}.destination = {settings['destination']!r} lies inside {inside[0]}/, which the "
                           "archive copies: choose a folder outside results/, logs/, benchmarks/ and signoffs/")
    return LocalDestination(root, run_key)
