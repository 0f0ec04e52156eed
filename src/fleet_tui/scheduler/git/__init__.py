"""Git: per-task worktrees, their owner markers, and merging a branch without touching a checkout."""
