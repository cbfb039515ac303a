"""Job commands: launch, status, cancel, logs."""
