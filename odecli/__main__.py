"""``python -m odecli`` runs the command line."""

from odecli.cli import app

app(prog_name="odecli")
