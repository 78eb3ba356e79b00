"""MCP tools that run inside the server, shared by the APIs that offer them: configured
MCP servers (config), their connections (connection, manager), a request's MCP tool
entries (refs), what a request may use (toolset), the agentic loop that calls them on the
request's warm KV (loop), and what every API's MCP turn shares (turn). Each API's own MCP
variant is in its package (`server/api/<api>/mcp.py`)."""
