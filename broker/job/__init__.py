"""The job-side helper for the broker's checkpoint contract: importable in every job the broker runs.

The node agent puts this package on the job's ``PYTHONPATH``; it needs only the standard library.
The framework integrations import their framework when they are imported themselves:
``broker.job.pytorch``, ``broker.job.lightning`` and ``broker.job.huggingface``.
"""

from broker.job.contract import MARKER, Checkpointer, read_marker, step_of

__all__ = ["MARKER", "Checkpointer", "read_marker", "step_of"]
