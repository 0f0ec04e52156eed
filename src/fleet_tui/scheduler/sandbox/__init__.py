"""The bubblewrap sandbox: its policy, its command and its small runtime programs."""
