"""The pieces behind ``broker.spec``: line-tracking YAML, the ``broker:`` section, SkyPilot checks."""
