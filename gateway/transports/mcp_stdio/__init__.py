"""`dharma stdio`: the governing stdio MCP proxy (`proxy`)."""
