"""``python -m odecli`` runs the command line."""

from odecli.cli import run

run()
