"""The local backend: clusters are local process groups replaying a market trace."""
