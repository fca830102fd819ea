"""Optimisers for the inverse problems, and the bounds transforms they move through."""
