"""Preemption notices: the one writer of the notice table, and the SQS/EventBridge listener."""
