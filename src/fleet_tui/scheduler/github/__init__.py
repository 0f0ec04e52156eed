"""GitHub: its REST API, pull requests for verified tasks, and importing issues as tasks."""
