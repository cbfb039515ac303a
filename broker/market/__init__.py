"""The market: the Market protocol, the price book, polling the clouds, SkyPilot's catalog."""
