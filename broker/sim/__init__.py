"""Simulators: replay traces through the same policies the service runs."""
