"""Which cloud SDKs are installed: each is an optional extra of the package (``spot-broker[aws]`` ...)."""

from __future__ import annotations

import importlib.util

# cloud -> (extra, the modules its poller imports, the SDK's name for people)
SDKS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "aws": ("aws", ("boto3", "botocore"), "the AWS SDK (boto3)"),
    "gcp": ("gcp", ("google.cloud.compute_v1", "google.auth"), "the Google Cloud SDK (google-cloud-compute)"),
    "azure": ("azure", ("azure.mgmt.compute", "azure.identity"), "the Azure SDK (azure-mgmt-compute, azure-identity)"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def missing_sdk(cloud: str) -> str | None:
    """None when ``cloud``'s SDK is importable; otherwise one line saying which extra installs it."""
    if cloud not in SDKS:
        return None
    extra, modules, name = SDKS[cloud]
    if all(_installed(m) for m in modules):
        return None
    return f"{name} is not installed; install the extra: pip install 'spot-broker[{extra}]' (or [all])"
