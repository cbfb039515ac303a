"""The long-running service: leader election, the scheduler, its recurring tasks and time-based policies."""
