"""Report emails: plain text and HTML alternatives, the chart inline by Content-ID, sent over SMTP."""

from __future__ import annotations

import contextlib
import smtplib
import ssl
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import TYPE_CHECKING

from broker.reports.retry import DeliveryError

if TYPE_CHECKING:
    from broker.config.settings import Settings

DEFAULT_PORTS = {"starttls": 587, "ssl": 465, "none": 25}


@dataclass(frozen=True, slots=True)
class SmtpConfig:
    host: str
    port: int
    tls: str  # starttls | ssl | none
    sender: str
    user: str | None = None
    password: str | None = None
    ca_file: Path | None = None
    timeout_s: float = 30.0

    def __repr__(self) -> str:  # never print the password
        return f"SmtpConfig(host={self.host!r}, port={self.port}, tls={self.tls!r}, user={self.user!r})"

    @classmethod
    def from_settings(cls, settings: Settings) -> SmtpConfig:
        from broker.config.settings import ConfigError

        if not settings.smtp_host:
            raise ConfigError("email needs an SMTP server: set BROKER_SMTP_HOST (or smtp_host in the config file)")
        if not settings.smtp_from:
            raise ConfigError("email needs a sender: set BROKER_SMTP_FROM (or smtp_from in the config file)")
        if settings.smtp_password and not settings.smtp_user:
            raise ConfigError("BROKER_SMTP_PASSWORD is set but BROKER_SMTP_USER is not")
        return cls(
            host=settings.smtp_host,
            port=settings.smtp_port or DEFAULT_PORTS[settings.smtp_tls],
            tls=settings.smtp_tls,
            sender=settings.smtp_from,
            user=settings.smtp_user,
            password=settings.smtp_password.get_secret_value() if settings.smtp_password else None,
            ca_file=settings.smtp_ca_file,
        )


def build_message(*, subject: str, sender: str, recipients: list[str], text: str, html: str,
                  chart_png: bytes | None, chart_cid: str | None) -> EmailMessage:
    """``chart_cid`` is what the HTML references as ``cid:...``, without angle brackets."""
    message = EmailMessage()
    message["Subject"] = subject
    message["From"] = sender
    message["To"] = ", ".join(recipients)
    message["Date"] = formatdate(localtime=False)
    message["Message-ID"] = make_msgid(domain="spot-broker")
    message.set_content(text)
    message.add_alternative(html, subtype="html")
    if chart_png is not None and chart_cid is not None:
        html_part = message.get_body(preferencelist=("html",))
        if html_part is None:
            raise AssertionError("the HTML alternative was just added")
        html_part.add_related(chart_png, maintype="image", subtype="png", cid=f"<{chart_cid}>",
                              filename="daily-spend.png", disposition="inline")
    return message


def new_cid() -> str:
    return make_msgid(idstring="chart", domain="spot-broker").strip("<>")


def send_message(message: EmailMessage, config: SmtpConfig) -> None:
    """One attempt; raises ``DeliveryError`` saying whether another attempt could succeed."""
    context = ssl.create_default_context(cafile=str(config.ca_file) if config.ca_file else None)
    try:
        smtp: smtplib.SMTP
        if config.tls == "ssl":
            smtp = smtplib.SMTP_SSL(config.host, config.port, timeout=config.timeout_s, context=context)
        else:
            smtp = smtplib.SMTP(config.host, config.port, timeout=config.timeout_s)
        # Not ``with smtp``: its QUIT on a connection whose TLS handshake failed waits out the timeout.
        try:
            if config.tls == "starttls":
                smtp.starttls(context=context)
            if config.user:
                smtp.login(config.user, config.password or "")
            smtp.send_message(message)
            with contextlib.suppress(smtplib.SMTPException, OSError):
                smtp.quit()
        finally:
            smtp.close()
    except ssl.SSLCertVerificationError as exc:
        raise DeliveryError(f"SMTP {config.host}:{config.port}: certificate not trusted: {exc.verify_message}",
                            transient=False) from exc
    except smtplib.SMTPAuthenticationError as exc:
        raise DeliveryError(f"SMTP {config.host}:{config.port}: login as {config.user!r} refused: "
                            f"{exc.smtp_code} {_text(exc.smtp_error)}", transient=False) from exc
    except smtplib.SMTPNotSupportedError as exc:
        raise DeliveryError(f"SMTP {config.host}:{config.port}: {exc}", transient=False) from exc
    except smtplib.SMTPRecipientsRefused as exc:
        refused = ", ".join(f"{who} ({code} {_text(msg)})" for who, (code, msg) in exc.recipients.items())
        raise DeliveryError(f"SMTP {config.host}:{config.port}: recipients refused: {refused}",
                            transient=False) from exc
    except smtplib.SMTPResponseException as exc:
        raise DeliveryError(f"SMTP {config.host}:{config.port}: {exc.smtp_code} {_text(exc.smtp_error)}",
                            transient=400 <= exc.smtp_code < 500) from exc
    except (smtplib.SMTPException, OSError) as exc:
        raise DeliveryError(f"SMTP {config.host}:{config.port}: {exc or type(exc).__name__}") from exc


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
