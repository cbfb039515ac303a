"""The job file: SkyPilot's task syntax exactly, plus the ``broker:`` section (``job`` is the front)."""
