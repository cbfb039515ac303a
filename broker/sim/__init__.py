"""The simulator: replay a market trace and account for what selection policies do with a job."""
