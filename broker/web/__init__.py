"""The web dashboard: server-rendered pages over the store, signed in with a team's API token."""
