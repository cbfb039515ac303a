"""Simulators: replay market and job traces through the same policies the service runs."""
