"""The archive's S3 destination, through Snakemake's S3 storage plugin (snakemake-storage-plugin-s3): the
plugin's StorageProvider holds the boto3 client, and its StorageObject stores and retrieves each file.

The plugin does things an archive must not do; this module guards against them:
- StorageObject.store_object creates a missing bucket, remove() deletes a bucket it emptied, and
  bucket_exists() takes any error (no credentials, a TLS failure, throttling) to mean "no bucket". The
  destination checks the bucket itself before anything is copied and names the real cause, and the
  provider's client refuses CreateBucket and DeleteBucket outright, so nothing that goes through the plugin
  can create or delete a bucket.
- TLS: the plugin has no setting for certificate verification (0.3.6 passes none to boto3, whose default
  verifies). `archive.verify_tls: false` is the only way to turn it off; the provider then rebuilds the
  plugin's client with verify=False, and the log, the summary and the manifest say so (archive.tls_warnings).
Credentials are boto3's usual ones (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE,
~/.aws): the plugin's access_key/secret_key settings are left unset, and nothing here logs or records them.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
from snakemake_storage_plugin_s3 import StorageObject, StorageProvider, StorageProviderSettings

from ..artifacts import MISSING, sha256_file
from .errors import KEY, ArchiveError

log = logging.getLogger("qwen3_pilot")

# S3 calls the archive's client refuses, whoever makes them (the plugin's store_object and remove included).
REFUSED_CALLS = ("CreateBucket", "DeleteBucket")


@dataclass
class ArchiveS3Settings(StorageProviderSettings):
    """The plugin's settings, plus whether the endpoint's TLS certificate is verified (the plugin has no such
    setting)."""

    verify_tls: bool = True


def refuse_bucket_changes(client: Any) -> None:
    """Makes `client` raise before it sends CreateBucket or DeleteBucket: the archive never creates or deletes
    a bucket, whatever the code calling it would do."""

    def refuse(model: Any, params: dict[str, Any], **_: Any) -> None:
        raise ArchiveError(f"refused S3 {model.name} of bucket {params.get('Bucket')!r}: the archive never "
                           "creates or deletes buckets")

    for call in REFUSED_CALLS:
        client.meta.events.register(f"before-parameter-build.s3.{call}", refuse,
                                    unique_id=f"qwen3-pilot-archive-{call}")


class ArchiveStorageProvider(StorageProvider):
    """The plugin's StorageProvider with the archive's two guards: no bucket creation or deletion, and TLS
    verification off only when ArchiveS3Settings.verify_tls says so."""

    def __post_init__(self) -> None:
        super().__post_init__()  # the plugin's client: boto3's default, which verifies TLS
        if not self.settings.verify_tls:
            # The plugin's own client arguments, with verify=False added.
            self.s3c = boto3.resource(
                "s3",
                endpoint_url=self.settings.endpoint_url,
                region_name=self.settings.region,
                aws_access_key_id=self.settings.access_key,
                aws_secret_access_key=self.settings.secret_key,
                aws_session_token=self.settings.token,
                config=self.s3c.meta.client.meta.config,
                verify=False,
            )
        refuse_bucket_changes(self.s3c.meta.client)


class S3Destination:
    """s3://<bucket>[/<prefix>]/<run key>/... through the plugin's StorageObject, one per file."""

    def __init__(self, settings: dict[str, Any], run_key: str, scratch: Path):
        parts = urlsplit(settings["destination"])
        self.bucket = parts.netloc
        self.prefix = "/".join(p for p in (parts.path.strip("/"), run_key) if p)
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self.endpoint = settings.get("endpoint_url") or "AWS S3"
        self.scratch = Path(scratch)
        self.provider = ArchiveStorageProvider(
            local_prefix=self.scratch / "storage",
            logger=log,
            settings=ArchiveS3Settings(
                endpoint_url=settings.get("endpoint_url"),
                region=settings.get("region"),
                verify_tls=settings.get("verify_tls", True),
            ),
        )

    @property
    def client(self) -> Any:
        return self.provider.s3c.meta.client

    def check(self) -> None:
        """The bucket must exist and be readable with the credentials in use; each failure names its cause."""
        where = f"bucket {self.bucket!r} ({KEY}.destination, at {self.endpoint})"
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as error:
            code = str(error.response.get("Error", {}).get("Code"))
            if code in ("404", "NoSuchBucket"):
                raise ArchiveError(f"{where} does not exist: the archive never creates buckets; create it with "
                                   "the versioning, retention and encryption your site requires, then rerun") from None
            if code in ("403", "AccessDenied"):
                raise ArchiveError(f"{where}: access denied to the AWS credentials in use (environment "
                                   "variables, AWS_PROFILE or ~/.aws)") from None
            raise ArchiveError(f"{where}: {code}: {error}") from None
        except botocore.exceptions.SSLError as error:
            raise ArchiveError(f"{where}: TLS verification failed ({error}); give the endpoint's CA bundle through "
                               f"AWS_CA_BUNDLE (for a test server only: {KEY}.verify_tls: false)") from None
        except botocore.exceptions.NoCredentialsError:
            raise ArchiveError(f"{where}: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                               "AWS_PROFILE / ~/.aws (never the workflow config)") from None
        except botocore.exceptions.BotoCoreError as error:
            raise ArchiveError(f"{where}: {error}") from None

    def _object(self, path: str) -> StorageObject:
        query = f"{self.url}/{path}"
        obj = StorageObject(query=query, keep_local=False, retrieve=True, provider=self.provider)
        # The plugin parses the query as a URL and normalises its path: a name it would read differently
        # ('#', '?', '..') would be archived under another key.
        if (obj.bucket, obj.key) != (self.bucket, f"{self.prefix}/{path}"):
            raise ArchiveError(f"{path}: the S3 plugin reads {query!r} as key {obj.key!r} of bucket {obj.bucket!r}; "
                               "the archive cannot store this name")
        return obj

    def put(self, source: Path, path: str) -> None:
        obj = self._object(path)
        obj.set_local_path(Path(source))
        obj.store_object()

    def read_back(self, path: str) -> tuple[str, int | None]:
        obj = self._object(path)
        if not obj.exists():
            return MISSING, None
        local = self.scratch / "read_back" / uuid.uuid4().hex
        local.parent.mkdir(parents=True, exist_ok=True)
        obj.set_local_path(local)
        try:
            obj.retrieve_object()
            return sha256_file(local), local.stat().st_size
        finally:
            local.unlink(missing_ok=True)
