"""The SkyPilot backend: real clusters on the clouds, through SkyPilot's SDK."""
