"""Config `archive`: its checks (each problem naming the key, the value and what is allowed), the TLS state of an
S3 destination, and what of the config the pilot's own report records. Read at parse time (workflow/rules/): it
imports nothing heavy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .errors import KEY

LOCAL, S3 = "local", "s3"
TLS_OFF_WARNING = ("TLS VERIFICATION IS OFF (archive.verify_tls: false): the S3 endpoint's certificate is not "
                   "checked, so anyone on the path can read or alter what is archived")
PLAIN_HTTP_WARNING = "the S3 endpoint is plain http: no TLS at all (only for a test server on loopback)"
# Which settings a read-back needs; credentials are never among them.
CONNECTION_KEYS = ("destination", "endpoint_url", "region", "verify_tls")


def _has_userinfo(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.username or parts.password or "@" in parts.netloc)


def settings_problems(settings: dict[str, Any]) -> list[str]:
    """What is wrong with config `archive` for `snakemake archive`, each naming the key, the value and what is
    allowed (empty when it is usable)."""
    destination = settings.get("destination")
    if not destination:
        return [(f"{KEY}.destination = {json.dumps(destination)}: `snakemake archive` needs a destination: a "
                 "local folder that exists, or s3://<bucket>[/<prefix>] of a bucket that exists (config/README.md)")]
    problems = []
    scheme = urlsplit(destination).scheme
    if scheme == S3:
        parts = urlsplit(destination)
        if _has_userinfo(destination):
            problems.append(f"{KEY}.destination holds credentials: give them through the AWS environment "
                            "variables or ~/.aws, never in the workflow config")
        elif not parts.netloc:
            problems.append(f"{KEY}.destination = {destination!r}: no bucket; allowed: s3://<bucket>[/<prefix>]")
        elif parts.query or parts.fragment:
            problems.append(f"{KEY}.destination = {destination!r}: no query or fragment allowed; "
                            "allowed: s3://<bucket>[/<prefix>]")
    elif "://" in destination:
        problems.append(f"{KEY}.destination = {destination!r}: scheme {scheme!r} is not supported; allowed: a "
                        "local folder or s3://<bucket>[/<prefix>]")
    endpoint = settings.get("endpoint_url")
    if endpoint:
        if scheme != S3:
            problems.append(f"{KEY}.endpoint_url = {endpoint!r}: only used with an s3:// destination")
        if _has_userinfo(endpoint):
            problems.append(f"{KEY}.endpoint_url holds credentials: give them through the AWS environment "
                            "variables or ~/.aws, never in the workflow config")
        elif urlsplit(endpoint).scheme not in ("http", "https"):
            problems.append(f"{KEY}.endpoint_url = {endpoint!r}: allowed: an http(s):// URL, or null for AWS S3")
    return problems


def check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """config `archive`, or ValueError listing its problems."""
    problems = settings_problems(settings)
    if problems:
        raise ValueError("config: " + "; ".join(problems))
    return settings


def report_inputs(settings: dict[str, Any]) -> dict[str, str]:
    """The archive's inputs, the finished report, once config `archive` is checked (rule archive_copy's input
    function: `snakemake archive` without a destination stops before any job, naming archive.destination)."""
    check_settings(settings)
    return {"html": "results/report.html", "json": "results/report.json"}


def tls_state(settings: dict[str, Any]) -> str:
    """What the connection to the destination checks: "verified", "OFF" (config turned verification off) or
    "none (plain http)" (an http endpoint); "n/a (local folder)" for a local destination."""
    if urlsplit(settings["destination"]).scheme != S3:
        return "n/a (local folder)"
    if not settings.get("verify_tls", True):
        return "OFF"
    if settings.get("endpoint_url") and urlsplit(settings["endpoint_url"]).scheme == "http":
        return "none (plain http)"
    return "verified"


def tls_warnings(settings: dict[str, Any]) -> list[str]:
    """The loud lines for the log, the summary and the manifest when the connection is not TLS-verified."""
    warnings = []
    if urlsplit(settings["destination"]).scheme == S3 and not settings.get("verify_tls", True):
        warnings.append(TLS_OFF_WARNING)
    if tls_state(settings) == "none (plain http)":
        warnings.append(PLAIN_HTTP_WARNING)
    return warnings


def pilot_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config without `archive`: what the report records and digests. Where a finished run is copied is
    not part of the run, so `snakemake archive --config archive=...` must not rerun (and re-date) the report
    it archives (workflow/rules/report.smk's params and the failed-run report use this)."""
    return {key: value for key, value in config.items() if key != KEY}


def archive_failed_alone(results: Path, run_started: str) -> bool:
    """Whether the archive is the only stage that failed in the invocation that began at `run_started` (its
    failure record is results/failures/archive.json): the pilot's report then stays as it was, instead of
    being replaced by a failed-run report (workflow/rules/common.smk, write_failed_report)."""
    records = [json.loads(p.read_text()) for p in (Path(results) / "failures").glob("*.json")]
    failed = {record["stage"] for record in records if record["ended"] >= run_started}
    return failed == {KEY}
