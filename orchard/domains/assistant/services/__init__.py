"""The assistant's services, run inside the sandbox (standard library only): ``tools.py`` holds
the tools over a world, ``server.py`` serves them as an HTTP API and over MCP."""
