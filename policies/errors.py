"""The error base of ``policies/`` (which may not import ``broker``; ``broker.errors`` maps these)."""

from __future__ import annotations


class PolicyError(Exception):
    """An error raised by a policy or the policy registry."""


class PolicyInputError(PolicyError):
    """Input the user can fix (e.g. a policy name that is not registered): exit 2 in the CLI."""
