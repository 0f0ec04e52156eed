"""Agent CLI adapters, one module per CLI; discovered through the fleet_tui.coders entry points."""
