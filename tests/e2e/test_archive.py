"""The archive target: what is selected, the chain of custody before the copy, the read-back that names each
missing or changed file, the bucket and TLS guards around Snakemake's S3 plugin, no credentials in anything
written; end to end, `snakemake archive` to a local folder and to an S3-compatible server on loopback (moto)."""

from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import AHEAD_ENV, output, run_snakemake, set_archive, started_ahead

from qwen3_pilot import archive
from qwen3_pilot.archive import MANIFEST, ArchiveError
from qwen3_pilot.archive import settings as archive_settings
from qwen3_pilot.artifacts import describe_artifact, sha256_file

BUCKET = "pilot-archive"
ACCESS_KEY_ID = "AKIATESTARCHIVE0001"
SECRET_KEY = "archive-test-secret-0123456789abcdef"
STARTED = "2026-12-03T14:01:46.123+00:00"


# --- a small finished run ---------------------------------------------------------------------------------


def write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# Files of a finished run that the archive holds, and files that it leaves out, in the workflow folder.
KEPT = [
    "results/report.html",
    "results/report.json",
    "results/train_hf/summary.json",
    "results/train_hf/recipe.json",
    "results/train_hf/run/metrics.jsonl",
    "results/train_hf/run/structured_logs/training.global_rank_0.jsonl",
    "results/train_hf/run/checkpoint/step-10/model-00001-of-00001.safetensors",  # listed in report.json
    "results/export_reload/hf/config.json",
    "results/export_reload/hf/model-00001-of-00001.safetensors",
    "results/moe_reduced/run/router_load.jsonl",
    "results/benchmark/runs/train_native/eager/metrics.jsonl",
    "results/pin_env/summary.json",
    "results/pin_env/packages/torch.json",
    "results/fetch_weights/checkpoint/model.safetensors",  # listed in report.json
    "logs/train_hf/train_hf.log",
    "logs/moe_reduced/moe_reduced.failed-20261203T185635.119243Z.log",
    "benchmarks/train_hf.tsv",
    "signoffs/signoffs.jsonl",
]
LEFT_OUT = [
    "results/train_hf/run/checkpoint/step-10/sharded/shard-00001-model-00001-of-00001.safetensors",
    "results/train_hf/run/.snakemake_timestamp",
    "results/train_native/run/launcher.pid",
    "results/export_reload/hf/.config.json.abc.tmp",
    "results/benchmark/runs/train_native/compile_cache/cold/torchinductor_cache_dir/2l/c2l.main.so",
    "results/fetch_weights/checkpoint/unlisted.bin",
    "results/fixture_checkpoint/fixture/hub_cache/models--x/blobs/abc",
    "results/preflight/preflight.html",
    "results/failures/moe_reduced.json",
    "results/invocation.json",
    "results/archive/copied.json",
    "logs/archive/copy.log",
]
LISTED = [  # report.json's artifacts: what the custody check holds to their recorded sha256
    "results/train_hf/recipe.json",
    "results/train_hf/run/metrics.jsonl",
    "results/train_hf/run/checkpoint/step-10/model-00001-of-00001.safetensors",
    "results/export_reload/hf/config.json",
    "results/fetch_weights/checkpoint/model.safetensors",
]


def make_run(root: Path, started: str = STARTED) -> Path:
    """A finished run's tree with a report.json listing LISTED (workflow-relative paths, as the stages write
    them); returns report.json."""
    for path in KEPT + LEFT_OUT:
        if path != "results/report.json":
            write(root / path, f"contents of {path}\n")
    report = {
        "status": "pass",
        "failed_run": False,
        "provenance": {"started": started, "ended": started, "commit": "abc123", "dirty": False,
                       "config_digest": "c0ffee"},
        "stages": [{"stage": "train_hf", "status": "pass",
                    "artifacts": [describe_artifact(root / p, root) for p in LISTED]}],
    }
    return write(root / "results" / "report.json", json.dumps(report, indent=2))


@pytest.fixture
def run_dir(tmp_path):
    root = tmp_path / "ws"
    make_run(root)
    return root


def local_settings(destination: Path) -> dict:
    return {"destination": str(destination), "endpoint_url": None, "region": None, "verify_tls": True}


# --- settings ---------------------------------------------------------------------------------------------


def test_no_destination_fails_naming_the_key():
    with pytest.raises(ValueError, match=r"archive\.destination = null: `snakemake archive` needs a destination"):
        archive_settings.report_inputs({"destination": None, "endpoint_url": None, "verify_tls": True})
    assert archive_settings.report_inputs(local_settings(Path("/tmp/x"))) == {
        "html": "results/report.html", "json": "results/report.json"}


@pytest.mark.parametrize("settings, message", [
    ({"destination": f"s3://{ACCESS_KEY_ID}:{SECRET_KEY}@{BUCKET}/runs"}, "holds credentials"),
    ({"destination": f"s3://{BUCKET}", "endpoint_url": f"http://user:{SECRET_KEY}@127.0.0.1:9000"},
     "holds credentials"),
    ({"destination": "gs://bucket/runs"}, "scheme 'gs' is not supported"),
    ({"destination": "s3:///runs"}, "no bucket"),
    ({"destination": "/mnt/archive", "endpoint_url": "http://127.0.0.1:9000"}, "only used with an s3://"),
    ({"destination": f"s3://{BUCKET}", "endpoint_url": "ftp://host"}, "an http(s):// URL"),
])
def test_settings_problems_name_the_key_and_never_echo_credentials(settings, message):
    problems = archive_settings.settings_problems(settings)
    assert problems and message in problems[0] and problems[0].startswith("archive.")
    assert SECRET_KEY not in " ".join(problems)


def test_tls_state_is_verified_unless_config_turns_it_off():
    s3 = {"destination": f"s3://{BUCKET}", "endpoint_url": None, "verify_tls": True}
    assert archive_settings.tls_state(s3) == "verified" and archive_settings.tls_warnings(s3) == []
    off = {**s3, "verify_tls": False}
    assert archive_settings.tls_state(off) == "OFF"
    assert archive_settings.tls_warnings(off) == [archive_settings.TLS_OFF_WARNING]
    plain = {**s3, "endpoint_url": "http://127.0.0.1:9000"}
    assert archive_settings.tls_state(plain) == "none (plain http)"
    assert archive_settings.tls_warnings(plain) == [archive_settings.PLAIN_HTTP_WARNING]
    assert archive_settings.tls_state({**plain, "verify_tls": False}) == "OFF"  # what config asked for comes first
    assert archive_settings.tls_state(local_settings(Path("/tmp"))) == "n/a (local folder)"


def test_the_report_config_leaves_the_archive_settings_out():
    config = {"backend": "cpu", "archive": {"destination": "/tmp/a"}}
    assert archive_settings.pilot_config(config) == {"backend": "cpu"}


def test_archive_failed_alone_tells_the_archive_failure_from_a_pilot_failure(tmp_path):
    results = tmp_path / "results"
    for stage, ended in (("archive", "2026-12-03T15:00:00+00:00"), ("train_hf", "2026-12-03T13:00:00+00:00")):
        write(results / "failures" / f"{stage}.json", json.dumps({"stage": stage, "ended": ended}))
    # train_hf failed in an earlier run
    assert archive_settings.archive_failed_alone(results, "2026-12-03T14:00:00+00:00")
    assert not archive_settings.archive_failed_alone(results, "2026-12-03T12:00:00+00:00")  # both in this one
    assert not archive_settings.archive_failed_alone(results, "2026-12-03T16:00:00+00:00")  # none in this one


# --- what is archived, and custody ------------------------------------------------------------------------


def test_selection_keeps_the_run_and_leaves_out_caches_checkpoint_duplicates_and_other_runs(run_dir):
    report = json.loads((run_dir / "results" / "report.json").read_text())
    assert archive.select_files(run_dir, report) == sorted(KEPT)


def test_run_key_tells_runs_and_reports_apart(tmp_path):
    first = make_run(tmp_path / "a")
    key = archive.run_key(json.loads(first.read_text()), sha256_file(first))
    assert key == f"20261203T140146Z-{sha256_file(first)[:12]}"
    second = make_run(tmp_path / "b", started="2026-12-04T09:00:00+00:00")
    assert archive.run_key(json.loads(second.read_text()), sha256_file(second)).startswith("20261204T090000Z-")


def test_a_changed_artifact_stops_the_archive_before_anything_is_copied(run_dir, tmp_path):
    changed = run_dir / "results" / "export_reload" / "hf" / "config.json"
    recorded = sha256_file(changed)
    changed.write_text("edited after the stage recorded it\n")
    destination = tmp_path / "dest"
    destination.mkdir()
    with pytest.raises(ArchiveError) as error:
        archive.copy_run(local_settings(destination), run_dir / "results" / "report.json", tmp_path / "scratch")
    message = str(error.value)
    assert "nothing copied" in message and "results/export_reload/hf/config.json" in message
    assert recorded in message and sha256_file(changed) in message
    assert list(destination.iterdir()) == []


def test_a_local_destination_must_exist_and_lie_outside_what_is_archived(run_dir, tmp_path):
    report_json = run_dir / "results" / "report.json"
    with pytest.raises(ArchiveError, match=r"archive\.destination = '.*/missing': no such folder; the archive never"):
        archive.copy_run(local_settings(tmp_path / "missing"), report_json, tmp_path / "scratch")
    with pytest.raises(ArchiveError, match="lies inside results/"):
        archive.copy_run(local_settings(run_dir / "results" / "old"), report_json, tmp_path / "scratch")


# --- only the project's own files: nothing from outside it reaches an archive ------------------------------

OUTSIDE_SECRET = "aws_secret_access_key = OUTSIDE-THE-PROJECT-7f3a9c\n"  # found nowhere it was copied to


@pytest.fixture
def hashed(monkeypatch):
    """Every file hashed while the test runs (sha256_file and current_sha256 both read through
    hashlib.file_digest), as real paths: what the archive and `make verify` read."""
    import hashlib

    real_file_digest, read, test_thread = hashlib.file_digest, [], threading.get_ident()

    def spy(handle, digest):
        if threading.get_ident() == test_thread:  # not a test body running in another thread meanwhile
            read.append(Path(handle.name).resolve())
        return real_file_digest(handle, digest)

    monkeypatch.setattr(hashlib, "file_digest", spy)
    return read


def holding(folder: Path, text: str) -> list[Path]:
    """The regular files under `folder` whose bytes contain `text` (links not followed)."""
    return [p for p in folder.rglob("*")
            if p.is_file() and not p.is_symlink() and text.encode() in p.read_bytes()]


@pytest.mark.parametrize("link, target, named", [
    # a link to a file, in a folder the archive takes whole
    ("results/train_hf/run/creds.txt", "outside/credentials",
     "results/train_hf/run/creds.txt -> {outside}/credentials"),
    # a link to a folder: not followed, refused all the same
    ("logs/aws", "outside", "logs/aws -> {outside}"),
    # a link one level up: the selected folder itself leads out, and its files are named
    ("results/train_outside", "outside", "results/train_outside/credentials -> {outside}/credentials"),
], ids=["file", "folder", "folder-above"])
def test_a_link_out_of_the_project_is_refused_and_nothing_is_copied(run_dir, tmp_path, hashed, link, target, named):
    secret = write(tmp_path / "outside" / "credentials", OUTSIDE_SECRET)
    (run_dir / link).symlink_to(tmp_path / target)
    report = json.loads((run_dir / "results" / "report.json").read_text())
    expected = named.format(outside=(tmp_path / "outside").resolve())
    with pytest.raises(ArchiveError) as error:
        archive.select_files(run_dir, report)
    assert f"{expected}: resolves outside the project {run_dir.resolve()}" in str(error.value)

    destination = tmp_path / "dest"
    destination.mkdir()
    with pytest.raises(ArchiveError) as error:
        archive.copy_run(local_settings(destination), run_dir / "results" / "report.json", tmp_path / "scratch")
    assert str(error.value).startswith("nothing copied: 1 path(s) of the archive resolve outside the project")
    assert f"{expected}: resolves outside the project" in str(error.value)
    assert list(destination.iterdir()) == []
    assert holding(tmp_path, OUTSIDE_SECRET) == [secret]  # its only copy is the original
    assert secret.resolve() not in hashed  # not even read


@pytest.mark.parametrize("listed", ["results/../../outside/credentials", "{outside}/credentials"],
                         ids=["dotdot", "absolute"])
def test_an_artifact_path_out_of_the_project_is_refused_unread(run_dir, tmp_path, hashed, listed):
    """A report.json listing a file outside the workflow folder, by `..` or as an absolute path, with its true
    sha256 (the custody check would pass it): refused before the custody check reads it."""
    secret = write(tmp_path / "outside" / "credentials", OUTSIDE_SECRET)
    listed = listed.format(outside=tmp_path / "outside")
    report_json = run_dir / "results" / "report.json"
    report = json.loads(report_json.read_text())
    report["stages"][0]["artifacts"].append({"path": listed, "bytes": secret.stat().st_size,
                                             "sha256": sha256_file(secret)})
    report_json.write_text(json.dumps(report))
    hashed.clear()
    destination = tmp_path / "dest"
    destination.mkdir()
    with pytest.raises(ArchiveError) as error:
        archive.copy_run(local_settings(destination), report_json, tmp_path / "scratch")
    assert (f"{listed} (listed in report.json by train_hf) -> {secret.resolve()}: resolves outside the project "
            f"{run_dir.resolve()}") in str(error.value)
    assert list(destination.iterdir()) == [] and secret.resolve() not in hashed


def test_a_link_that_stays_inside_the_project_is_archived_as_the_file_it_names(run_dir, tmp_path):
    """The rule's other half: a link whose real path is in the workflow folder is taken as a file, its
    content under the link's own path, with that content's sha256 in the manifest."""
    metrics = run_dir / "results" / "train_hf" / "run" / "metrics.jsonl"
    link = run_dir / "results" / "train_hf" / "run" / "latest.jsonl"
    link.symlink_to("metrics.jsonl")
    destination = tmp_path / "dest"
    destination.mkdir()
    record, manifest = archive_locally(run_dir, destination, tmp_path / "scratch")
    (entry,) = [f for f in manifest["files"] if f["path"] == "results/train_hf/run/latest.jsonl"]
    assert entry["sha256_source"] == entry["sha256_read_back"] == sha256_file(metrics)
    copied = destination / record["run_key"] / "results" / "train_hf" / "run" / "latest.jsonl"
    assert not copied.is_symlink() and copied.read_bytes() == metrics.read_bytes()
    assert sorted(f["path"] for f in manifest["files"]) == sorted([*KEPT, "results/train_hf/run/latest.jsonl"])


# --- local folder -----------------------------------------------------------------------------------------


def archive_locally(run_dir: Path, destination: Path, scratch: Path) -> tuple[dict, dict]:
    record = archive.copy_run(local_settings(destination), run_dir / "results" / "report.json", scratch)
    manifest = archive.read_back(record, run_dir / "results" / "archive" / MANIFEST, scratch, run_dir)
    return record, manifest


def test_local_archive_copies_reads_back_and_writes_the_manifest_beside_the_files(run_dir, tmp_path):
    destination = tmp_path / "dest"
    destination.mkdir()
    record, manifest = archive_locally(run_dir, destination, tmp_path / "scratch")
    folder = destination / record["run_key"]
    assert record["url"] == str(folder)
    assert sorted(f["path"] for f in manifest["files"]) == sorted(KEPT)
    for entry in manifest["files"]:
        source = run_dir / entry["path"]
        assert entry["sha256_source"] == entry["sha256_read_back"] == sha256_file(source)
        assert sha256_file(folder / entry["path"]) == sha256_file(source)
        assert entry["bytes"] == entry["bytes_read_back"] == source.stat().st_size
    assert (folder / MANIFEST).read_bytes() == (run_dir / "results" / "archive" / MANIFEST).read_bytes()
    assert manifest["report"]["sha256"] == sha256_file(run_dir / "results" / "report.json")
    assert manifest["tls"] == "n/a (local folder)" and manifest["totals"]["files"] == len(KEPT)


def test_read_back_names_each_missing_or_changed_file_with_both_digests(run_dir, tmp_path):
    destination = tmp_path / "dest"
    destination.mkdir()
    record, _ = archive_locally(run_dir, destination, tmp_path / "scratch")
    folder = destination / record["run_key"]
    corrupted = folder / "results" / "export_reload" / "hf" / "model-00001-of-00001.safetensors"
    corrupted.write_bytes(corrupted.read_bytes()[:-1] + b"!")
    (folder / "logs" / "train_hf" / "train_hf.log").unlink()
    manifest = tmp_path / "again" / MANIFEST
    with pytest.raises(ArchiveError) as error:
        archive.read_back(record, manifest, tmp_path / "scratch", run_dir)
    message = str(error.value)
    assert "2 of" in message and f"its {MANIFEST} says so" in message
    source = sha256_file(run_dir / "results" / "export_reload" / "hf" / "model-00001-of-00001.safetensors")
    assert (f"results/export_reload/hf/model-00001-of-00001.safetensors: sha256 at source {source}, read back from "
            f"{folder} {sha256_file(corrupted)}") in message
    assert f"logs/train_hf/train_hf.log: missing at {folder}" in message
    # The manifest beside the files no longer vouches for them.
    written = json.loads((folder / MANIFEST).read_text())
    assert written["status"] == "fail" and len(written["problems"]) == 2


# --- S3 on loopback (moto) --------------------------------------------------------------------------------


@contextmanager
def moto_server():
    """moto's S3-compatible server on 127.0.0.1, on a free port, for the block: its endpoint URL."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs each request at INFO through whatever handler logging holds at that moment: for the server a
    # background body starts, a finished test's closed capture ("--- Logging error ---" in the session's output).
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        assert host == "127.0.0.1"
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_server():
    with moto_server() as endpoint:
        yield endpoint


def dummy_aws_env(folder: Path) -> dict[str, str]:
    """Dummy credentials in the usual AWS environment variables, and AWS files that do not exist (in `folder`)
    instead of the machine's."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"), "NO_PROXY": "127.0.0.1,localhost"}


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """dummy_aws_env in this process's environment, and no AWS profile."""
    for name, value in dummy_aws_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def s3_client(endpoint: str, **credentials: str):
    """A client of the server at `endpoint`, with `credentials` (aws_access_key_id, ...) or the environment's."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **credentials)


@pytest.fixture
def bucket(s3_server, aws_env):
    """An empty bucket, made by the test: the archive never makes one."""
    client = s3_client(s3_server)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)


def s3_settings(endpoint: str, verify_tls: bool = True, bucket_name: str = BUCKET) -> dict:
    return {"destination": f"s3://{bucket_name}/pilot", "endpoint_url": endpoint, "region": None,
            "verify_tls": verify_tls}


def test_s3_archive_reads_back_through_the_plugin_and_names_a_corrupted_object(run_dir, tmp_path, bucket, s3_server):
    settings = s3_settings(s3_server)
    record = archive.copy_run(settings, run_dir / "results" / "report.json", tmp_path / "scratch")
    assert record["url"] == f"s3://{BUCKET}/pilot/{record['run_key']}"
    manifest = archive.read_back(record, tmp_path / "local" / MANIFEST, tmp_path / "scratch", run_dir)
    assert manifest["status"] == "pass" and not manifest["problems"]
    assert all(f["sha256_source"] == f["sha256_read_back"] for f in manifest["files"])
    prefix = f"pilot/{record['run_key']}/"
    keys = {item["Key"] for item in bucket.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]}
    assert keys == {prefix + path for path in KEPT} | {prefix + MANIFEST}
    remote = bucket.get_object(Bucket=BUCKET, Key=prefix + MANIFEST)["Body"].read()
    assert remote == (tmp_path / "local" / MANIFEST).read_bytes()
    assert manifest["tls"] == "none (plain http)" and archive_settings.PLAIN_HTTP_WARNING in manifest["warnings"]

    bucket.put_object(Bucket=BUCKET, Key=prefix + "results/train_hf/run/metrics.jsonl", Body=b"not the metrics\n")
    bucket.delete_object(Bucket=BUCKET, Key=prefix + "signoffs/signoffs.jsonl")
    with pytest.raises(ArchiveError) as error:
        archive.read_back(record, tmp_path / "again" / MANIFEST, tmp_path / "scratch", run_dir)
    message = str(error.value)
    metrics = "results/train_hf/run/metrics.jsonl"
    assert f"{metrics}: sha256 at source {sha256_file(run_dir / metrics)}, read back from s3://" in message
    assert "signoffs/signoffs.jsonl: missing at s3://" in message
    assert json.loads(bucket.get_object(Bucket=BUCKET, Key=prefix + MANIFEST)["Body"].read())["status"] == "fail"


def test_a_missing_bucket_is_an_error_and_is_never_created(run_dir, tmp_path, s3_server, aws_env):
    settings = s3_settings(s3_server, bucket_name="no-such-archive-bucket")
    with pytest.raises(ArchiveError, match="bucket 'no-such-archive-bucket' .* does not exist: the archive never "
                       "creates buckets"):
        archive.copy_run(settings, run_dir / "results" / "report.json", tmp_path / "scratch")
    names = [b["Name"] for b in s3_client(s3_server).list_buckets()["Buckets"]]
    assert "no-such-archive-bucket" not in names


def test_the_plugins_own_bucket_creation_is_refused(tmp_path, s3_server, aws_env):
    """StorageObject.store_object creates a missing bucket; through the archive's provider it cannot."""
    from snakemake_storage_plugin_s3 import StorageObject

    from qwen3_pilot.archive.s3 import S3Destination

    destination = S3Destination(s3_settings(s3_server, bucket_name="plugin-would-create"), "run", tmp_path / "scratch")
    obj = StorageObject(query="s3://plugin-would-create/run/a.txt", keep_local=False, retrieve=True,
                        provider=destination.provider)
    obj.set_local_path(write(tmp_path / "a.txt"))
    with pytest.raises(ArchiveError, match="refused S3 CreateBucket of bucket 'plugin-would-create'"):
        obj.store_object()
    assert "plugin-would-create" not in [b["Name"] for b in s3_client(s3_server).list_buckets()["Buckets"]]


def test_tls_verification_is_on_by_default_and_off_only_when_config_says_so(tmp_path, s3_server, aws_env):
    from qwen3_pilot.archive.s3 import S3Destination

    verified = S3Destination(s3_settings(s3_server), "run", tmp_path / "a")
    assert verified.client._endpoint.http_session._verify is not False  # boto3's default: verify (a CA bundle or True)
    off = S3Destination(s3_settings(s3_server, verify_tls=False), "run", tmp_path / "b")
    assert off.client._endpoint.http_session._verify is False
    # The rebuilt client keeps the plugin's settings and the guard.
    assert off.client.meta.config.retries == verified.client.meta.config.retries
    with pytest.raises(ArchiveError, match="refused S3 CreateBucket"):
        off.client.create_bucket(Bucket="another-bucket")


def test_tls_off_is_said_loudly_and_no_credential_is_written_anywhere(run_dir, tmp_path, bucket, s3_server,
                                                                     monkeypatch):
    """The stage functions as the rules run them, inside the stage log: with verify_tls false the log, the
    summary and the manifest (local and at the destination) say so; none of them, nor the copy record, holds
    the access key id or the secret."""
    from qwen3_pilot.backends import COMPILER_CACHE_KEYS
    from qwen3_pilot.stage_run import StageRun
    from qwen3_pilot.stages.archive import run_copy, run_read_back

    monkeypatch.chdir(run_dir)  # a job's working directory: the workflow folder
    for key in COMPILER_CACHE_KEYS:  # StageRun points these at the project's caches; restored after the test
        monkeypatch.setenv(key, str(tmp_path / "caches" / key))

    results = run_dir / "results" / "archive"
    logs = [run_dir / "logs" / "archive" / "copy.log", run_dir / "logs" / "archive" / "archive.log"]
    with StageRun("archive", logs[0]):
        run_copy(settings=s3_settings(s3_server, verify_tls=False), report_json=run_dir / "results" / "report.json",
                 record_path=results / "copied.json")
    with StageRun("archive", logs[1]):
        summary = run_read_back(copy_record=results / "copied.json", manifest_path=results / MANIFEST,
                                summary_path=results / "summary.json")
    logging.getLogger().handlers.clear()  # StageRun's handler writes to the closed log file
    assert summary["notes"][0] == archive_settings.TLS_OFF_WARNING and summary["figures"]["tls"] == "OFF"
    manifest = json.loads((results / MANIFEST).read_text())
    assert archive_settings.TLS_OFF_WARNING in manifest["warnings"] and manifest["tls"] == "OFF"
    for log in logs:
        assert archive_settings.TLS_OFF_WARNING in log.read_text()
    record = json.loads((results / "copied.json").read_text())
    remote = bucket.get_object(Bucket=BUCKET, Key=f"pilot/{record['run_key']}/{MANIFEST}")["Body"].read().decode()
    written = [p.read_text() for p in [*logs, results / "copied.json", results / MANIFEST, results / "summary.json"]]
    for text in [*written, remote]:
        assert ACCESS_KEY_ID not in text and SECRET_KEY not in text


# --- end to end: `snakemake archive` ----------------------------------------------------------------------


def test_snakemake_archive_without_destination_stops_before_any_job(workspace):
    ws = workspace({})
    result = run_snakemake(ws, "-n", "--cores", "1", "archive")
    assert result.returncode != 0
    assert "archive.destination = null: `snakemake archive` needs a destination" in output(result)


def archived_run(ws: Path) -> dict:
    return json.loads((ws / "results" / "archive" / "copied.json").read_text())


# The `snakemake archive` runs on a copy of the finished run are started_ahead bodies: each is a few Snakemake
# processes that would otherwise run one after another at the end of the session, on one core.
@started_ahead
def test_snakemake_archive_to_a_local_folder_and_a_corrupted_file_fails_the_read_back(copy_of_run, scratch):
    destination = scratch / "archive"
    destination.mkdir()
    set_archive(copy_of_run, destination=str(destination))
    result = run_snakemake(copy_of_run, "--cores", "1", "archive", env=AHEAD_ENV)
    assert result.returncode == 0, output(result)[-6000:]
    record = archived_run(copy_of_run)
    folder = destination / record["run_key"]
    manifest = json.loads((folder / MANIFEST).read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert {"results/report.html", "results/report.json", "results/pin_env/summary.json"} <= paths
    report = json.loads((copy_of_run / "results" / "report.json").read_text())
    assert {a["path"] for stage in report["stages"] for a in stage["artifacts"]} <= paths
    assert any(p.startswith("results/export_reload/hf/") and p.endswith(".safetensors") for p in paths)
    assert any(p.startswith("results/benchmark/runs/") for p in paths) and any(p.startswith("logs/") for p in paths)
    assert not any("/compile_cache/" in p or "/sharded/" in p for p in paths)
    assert json.loads((copy_of_run / "results" / "archive" / "summary.json").read_text())["status"] == "pass"

    corrupted = "results/export_reload/hf/config.json"
    (folder / corrupted).write_text("{}\n")
    result = run_snakemake(copy_of_run, "--cores", "1", "archive", "--forcerun", "archive", env=AHEAD_ENV)
    assert result.returncode != 0
    source = sha256_file(copy_of_run / corrupted)
    assert f"{corrupted}: sha256 at source {source}, read back from {folder}" in output(result)


@pytest.mark.e2e
def test_snakemake_archive_refuses_a_link_out_of_the_project_and_copies_nothing(copy_of_run, tmp_path):
    secret = write(tmp_path / "outside" / "credentials", OUTSIDE_SECRET)
    (copy_of_run / "results" / "pin_env" / "creds.txt").symlink_to(secret)
    destination = tmp_path / "archive"
    destination.mkdir()
    set_archive(copy_of_run, destination=str(destination))
    result = run_snakemake(copy_of_run, "--cores", "1", "archive")
    assert result.returncode != 0
    assert f"results/pin_env/creds.txt -> {secret.resolve()}: resolves outside the project" in output(result)
    assert OUTSIDE_SECRET.strip() not in output(result)
    assert [p for p in destination.rglob("*") if p.is_file()] == []
    assert holding(destination, OUTSIDE_SECRET) == [] and holding(copy_of_run / "logs", OUTSIDE_SECRET) == []


@started_ahead
def test_snakemake_archive_to_s3_on_loopback_and_a_corrupted_object_fails_the_read_back(copy_of_run, scratch):
    """moto's server and its bucket made here (a body takes no fixtures), the dummy credentials handed to
    Snakemake's environment and to the test's own client rather than set in this process's (aws_env)."""
    env = {**{k: v for k, v in AHEAD_ENV.items() if k != "AWS_PROFILE"}, **dummy_aws_env(scratch)}
    with moto_server() as endpoint:
        bucket = s3_client(endpoint, aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_KEY)
        bucket.create_bucket(Bucket=BUCKET)
        archive_to_s3_and_corrupt_an_object(copy_of_run, endpoint, bucket, env)


def archive_to_s3_and_corrupt_an_object(copy_of_run: Path, endpoint: str, bucket, env: dict[str, str]) -> None:
    set_archive(copy_of_run, destination=f"s3://{BUCKET}/pilot", endpoint_url=endpoint)
    result = run_snakemake(copy_of_run, "--cores", "1", "archive", env=env)
    assert result.returncode == 0, output(result)[-6000:]
    record = archived_run(copy_of_run)
    key = f"pilot/{record['run_key']}/{MANIFEST}"
    manifest = json.loads(bucket.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    assert manifest["files"] and all(f["sha256_source"] == f["sha256_read_back"] for f in manifest["files"])
    summary = json.loads((copy_of_run / "results" / "archive" / "summary.json").read_text())
    assert summary["figures"]["tls"] == "none (plain http)" and archive_settings.PLAIN_HTTP_WARNING in summary["notes"]

    corrupted = "results/report.json"
    bucket.put_object(Bucket=BUCKET, Key=f"pilot/{record['run_key']}/{corrupted}", Body=b"{}")
    result = run_snakemake(copy_of_run, "--cores", "1", "archive", "--forcerun", "archive", env=env)
    assert result.returncode != 0
    assert (f"{corrupted}: sha256 at source {record['report']['sha256']}, read back from "
            f"s3://{BUCKET}/pilot/{record['run_key']}") in output(result)
    for path in (copy_of_run / "logs" / "archive").iterdir():
        assert SECRET_KEY not in path.read_text() and ACCESS_KEY_ID not in path.read_text()


@started_ahead
def test_archiving_neither_reruns_nor_replaces_the_report_it_archives(copy_of_run, scratch):
    destination = scratch / "archive"
    destination.mkdir()
    report = (copy_of_run / "results" / "report.json").read_bytes()
    set_archive(copy_of_run, destination=str(destination))
    result = run_snakemake(copy_of_run, "--cores", "1", "archive", env=AHEAD_ENV)
    assert result.returncode == 0, output(result)[-6000:]
    assert (copy_of_run / "results" / "report.json").read_bytes() == report  # not rerun for a destination
    record = archived_run(copy_of_run)
    (destination / record["run_key"] / "results" / "report.html").write_text("corrupted")
    result = run_snakemake(copy_of_run, "--cores", "1", "archive", "--forcerun", "archive", env=AHEAD_ENV)
    assert result.returncode != 0 and "results/report.html: sha256 at source" in output(result)
    # The archive's failure is not the pilot's: no failed-run report replaces the one that was archived.
    assert (copy_of_run / "results" / "report.json").read_bytes() == report
