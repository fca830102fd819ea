"""The application layer: a validated spec becomes a run and a file (solve, solve over ranks, fit)."""
