"""The broker's HTTP API (FastAPI), versioned under ``/v1``."""
