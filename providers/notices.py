"""Node-side preemption-notice readers: what a node's metadata service says about its own fate.

Each reader's ``poll()`` returns the notices present now (empty when none), returns promptly,
and never raises on a bad answer: a garbage response is logged once as a warning and read as
"no notice". ``acknowledge(notice)`` tells the cloud the node is ready to go (Azure's
``StartRequests``); clouds that need no answer ignore it.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from providers.node_notice import NodeNotice, NoticeReader

__all__ = ["NodeNotice", "NoticeReader", "detect_cloud", "reader_for"]


def reader_for(cloud: str, metadata_url: str | None) -> NoticeReader:
    """The reader for a cloud; the local cloud speaks the AWS format."""
    if cloud in ("aws", "local"):
        from providers.aws import AwsImdsReader

        return AwsImdsReader(metadata_url or "http://169.254.169.254")
    if cloud == "gcp":
        from providers.gcp import GcpMetadataReader

        return GcpMetadataReader(metadata_url or "http://metadata.google.internal")
    if cloud == "azure":
        from providers.azure import AzureScheduledEventsReader

        return AzureScheduledEventsReader(metadata_url or "http://169.254.169.254")
    raise ValueError(f"no notice reader for cloud {cloud!r}; expected aws, gcp, azure or local")


def detect_cloud(metadata_url: str | None) -> str:
    """Ask each metadata service in turn, briefly; ``none`` when no cloud answers."""
    probes = [
        ("aws", "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
         metadata_url or "http://169.254.169.254"),
        ("gcp", "GET", "/computeMetadata/v1/instance/id", {"Metadata-Flavor": "Google"},
         metadata_url or "http://metadata.google.internal"),
        ("azure", "GET", "/metadata/instance?api-version=2021-02-01", {"Metadata": "true"},
         metadata_url or "http://169.254.169.254"),
    ]
    for cloud, method, path, headers, base in probes:
        request = urllib.request.Request(base.rstrip("/") + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=0.5) as response:
                # GCE's server also listens on 169.254.169.254: it is known by its Metadata-Flavor answer.
                if response.status == 200 and (cloud != "gcp" or response.headers.get("Metadata-Flavor") == "Google"):
                    return cloud
        except (OSError, urllib.error.URLError):
            continue
    return "none"
