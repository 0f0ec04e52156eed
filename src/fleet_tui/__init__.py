"""fleet-tui: run many coding-agent CLIs in parallel from one durable queue."""

__version__ = "0.1.0"
