"""``broker token``: the token printed once, only its hash stored, bad teams refused."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from broker.cli import main
from broker.config.settings import load_settings
from broker.store import open_store
from broker.store.tables import ApiTokenRow
from broker.tokens import team_of_token, token_digest


def test_token_create_prints_a_working_token_once_and_stores_its_hash(capsys: pytest.CaptureFixture[str]) -> None:
    main(["token", "create", "--team", "nlp"])
    captured = capsys.readouterr()
    token = captured.out.strip()
    assert token.startswith("bkr_") and len(token) > 40
    assert token not in captured.err and "nlp" in captured.err
    store = open_store(load_settings().database_url)
    try:
        assert team_of_token(store, token) == "nlp"
        with store.transaction() as s:
            [row] = s.scalars(select(ApiTokenRow))
        assert row.token_hash == token_digest(token) and token not in row.token_hash
        main(["token", "list", "--json"])
        listed = capsys.readouterr().out
        assert token not in listed and token_digest(token) not in listed
        assert json.loads(listed) == [{"token_id": row.id, "team": "nlp", "created_at": row.created_at.isoformat(),
                                       "revoked_at": None, "expires_at": None}]
        main(["token", "revoke", row.id])
        assert team_of_token(store, token) is None
    finally:
        store.dispose()


@pytest.mark.parametrize("team", ["", "a b", "x" * 101, "nlp;drop"])
def test_token_create_refuses_a_bad_team(team: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["token", "create", "--team", team])
    assert exit_info.value.code == 2
    assert "--team" in capsys.readouterr().err


def test_revoking_an_unknown_token_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["token", "revoke", "tok-nothere"])
    assert exit_info.value.code == 2
    assert "tok-nothere" in capsys.readouterr().err


def test_a_token_may_expire(capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import UTC, datetime, timedelta

    main(["token", "create", "--team", "nlp", "--expires-in", "12h"])
    token = capsys.readouterr().out.strip()
    store = open_store(load_settings().database_url)
    try:
        with store.transaction() as s:
            [row] = s.scalars(select(ApiTokenRow))
        assert row.expires_at is not None
        assert abs(row.expires_at - (datetime.now(UTC) + timedelta(hours=12))) < timedelta(minutes=5)
        assert team_of_token(store, token) == "nlp"
        main(["token", "list", "--json"])
        assert json.loads(capsys.readouterr().out)[0]["expires_at"] == row.expires_at.isoformat()
    finally:
        store.dispose()


@pytest.mark.parametrize("lifetime", ["0s", "-1h", "nan", "inf", "1e400d", "9" * 400 + "d", "12x", "3661d", "",
                                      "1\x00h", "\ud800"])
def test_token_create_refuses_a_lifetime_that_is_not_one(lifetime: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["token", "create", "--team", "nlp", "--expires-in", lifetime])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--expires-in" in err and "Traceback" not in err
    store = open_store(load_settings().database_url)
    try:
        with store.transaction() as s:
            assert list(s.scalars(select(ApiTokenRow))) == []
    finally:
        store.dispose()
