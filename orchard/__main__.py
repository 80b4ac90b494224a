"""`python -m orchard`: the `orchard` command, for when the console script is not on PATH."""

from orchard.cli import app

app(prog_name="orchard")
