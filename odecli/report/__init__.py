"""Reports of a run file: statistics tables and JSON, plots, the progress bar."""
