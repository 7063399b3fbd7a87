"""Public streams for the accuracy benchmarks, read where they are published (never copied into
the repository)."""
