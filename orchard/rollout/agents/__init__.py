"""The tool-calling loop the domains' agents share (``tool_loop``); each domain's own agent loop
lives with it, in ``orchard.domains.<name>``."""
