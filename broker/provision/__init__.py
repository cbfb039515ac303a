"""Provisioners: bring a gang up whole or not at all, run a job on it, tear it down."""
