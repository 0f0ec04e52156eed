"""Decisions as values: admission gates, headroom, outcomes, verification, prompts, loop checks."""
