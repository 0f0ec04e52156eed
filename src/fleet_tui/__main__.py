"""`python -m fleet_tui` runs the command line."""

from fleet_tui.cli import entry

entry()
