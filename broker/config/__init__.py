"""The broker's settings: the settings model, its environment variables and the settings file."""
