"""The node agent: wraps a job's command, hears preemption notices, checkpoints, reports."""
