"""Cost reports: built from the ledger, rendered as table/JSON/CSV/HTML, sent by email and Slack.

Kept import-light: ``broker.config.settings`` imports the settings models from ``broker.reports.settings``.
"""
