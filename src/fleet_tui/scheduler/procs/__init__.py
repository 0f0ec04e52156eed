"""Processes: the shim that hosts an agent, its runner, keepers for helper commands, ownership."""
