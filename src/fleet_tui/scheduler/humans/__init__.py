"""People in the loop: the question inbox, the ask_human MCP server, follow-ups, takeover, settling."""
