"""Backends: each brings a gang up whole or not at all, runs a job on it and tears it down."""
