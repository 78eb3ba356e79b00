"""MCP tools that run inside the server: configured MCP servers (settings), their
connections (connection, manager), what a request may use (toolset), and the agentic
loop that calls them on the request's warm KV (loop)."""
