"""Node-side preemption-notice readers: what a node's metadata service says about its own fate.

Each reader's ``poll()`` returns the notices present now (empty when none), returns promptly,
and never raises on a bad answer: a garbage response is logged once as a warning and read as
"no notice". ``acknowledge(notice)`` tells the cloud the node is ready to go (Azure's
``StartRequests``); clouds that need no answer ignore it.
"""

from __future__ import annotations

from providers.node_notice import NodeNotice, NoticeReader

__all__ = ["NodeNotice", "NoticeReader", "reader_for"]


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
