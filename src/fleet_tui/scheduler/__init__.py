"""The engine: pure async scheduling, no UI imports (a test enforces it)."""
