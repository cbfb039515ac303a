"""What the broker tells about its jobs: summaries, their readers (ORM and read-only SQL), job logs."""
