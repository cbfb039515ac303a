"""The broker's error base: every exception class of ``broker/`` derives from one of these two.

``UserError`` is what the person (or the client) got wrong and can fix: a bad job file, a bad
setting, an unknown job, a store that cannot be opened at the URL they gave. The CLI prints its
message as one line and exits 2; the API answers ``http_status`` (a 4xx unless a subclass says
otherwise) with the message. Anything else is a ``BrokerError`` (or a plain bug) and is not the
user's to fix.

``providers/`` and ``policies/`` may not import ``broker``, so they keep their own small bases;
``user_errors()`` names the ones that count as user errors here, in this one place.
"""

from __future__ import annotations

from providers.base import ProviderInputError


class BrokerError(Exception):
    """An error raised by the broker's own code."""


class UserError(BrokerError):
    """Input the user can fix: one line in the CLI (exit 2), a 4xx from the API."""

    http_status = 422


def user_errors() -> tuple[type[Exception], ...]:
    """What the CLI prints as one line with exit 2, and the API answers with a client error."""
    # Imported here: the node agent's wheel carries broker/ and providers/ but not policies/.
    from policies.errors import PolicyInputError

    return (UserError, ProviderInputError, PolicyInputError)


def is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, user_errors())
