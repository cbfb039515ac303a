"""A token found valid is taken for ``TOKEN_CHECK_S`` without asking the store: revoked or expired by
another process, it is refused within that bound; through the same store, at once; never past its end."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import event

from broker.store import open_store
from broker.tokens import (
    TOKEN_CHECK_S,
    checked_team_of_token,
    create_api_token,
    extend_api_token,
    list_api_tokens,
    revoke_api_token,
)


class Monotonic:
    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


def test_a_token_revoked_by_another_process_is_refused_within_the_bound(db_url: str) -> None:
    serving, other = open_store(db_url), open_store(db_url)  # two engines: what two processes hold
    try:
        issued = create_api_token(serving, "nlp")
        clock = Monotonic()
        assert checked_team_of_token(serving, issued.token, monotonic=clock) == "nlp"
        assert revoke_api_token(other, issued.token_id)
        clock.at += TOKEN_CHECK_S / 2
        assert checked_team_of_token(serving, issued.token, monotonic=clock) == "nlp"  # not asked again yet
        clock.at += TOKEN_CHECK_S / 2
        assert checked_team_of_token(serving, issued.token, monotonic=clock) is None
        clock.at += 3600
        assert checked_team_of_token(serving, issued.token, monotonic=clock) is None
    finally:
        serving.dispose()
        other.dispose()


def test_a_token_revoked_or_expired_through_the_same_store_is_refused_at_once(db_url: str) -> None:
    store = open_store(db_url)
    try:
        clock = Monotonic()
        revoked, expired = create_api_token(store, "nlp"), create_api_token(store, "cv", timedelta(hours=1))
        assert checked_team_of_token(store, revoked.token, monotonic=clock) == "nlp"
        assert checked_team_of_token(store, expired.token, monotonic=clock) == "cv"
        revoke_api_token(store, revoked.token_id)
        extend_api_token(store, expired.token_id, timedelta(seconds=-1))
        assert checked_team_of_token(store, revoked.token, monotonic=clock) is None
        assert checked_team_of_token(store, expired.token, monotonic=clock) is None
    finally:
        store.dispose()


def test_a_token_is_not_taken_past_its_end(db_url: str) -> None:
    store = open_store(db_url)
    try:
        issued = create_api_token(store, "nlp", timedelta(hours=1))
        [row] = list_api_tokens(store)
        assert row.expires_at is not None
        clock = Monotonic()
        ends = row.expires_at
        assert checked_team_of_token(store, issued.token, monotonic=clock,
                                     wall=lambda: ends - timedelta(seconds=TOKEN_CHECK_S / 4)) == "nlp"
        clock.at += TOKEN_CHECK_S / 8
        assert checked_team_of_token(store, issued.token, monotonic=clock, wall=lambda: ends) == "nlp"  # taken
        clock.at += TOKEN_CHECK_S / 4  # past its end, well within TOKEN_CHECK_S of the check
        assert checked_team_of_token(store, issued.token, monotonic=clock, wall=lambda: ends) is None
    finally:
        store.dispose()


def test_an_unknown_token_is_asked_about_every_time(db_url: str) -> None:
    store = open_store(db_url)
    try:
        clock = Monotonic()
        assert checked_team_of_token(store, "bkr_unknown", monotonic=clock) is None
        statements: list[str] = []
        event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        assert checked_team_of_token(store, "bkr_unknown", monotonic=clock) is None
        assert any("api_tokens" in statement for statement in statements)
    finally:
        store.dispose()
