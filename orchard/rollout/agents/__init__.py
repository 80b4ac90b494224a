"""Agent loops: what drives a model against a sandbox, one loop per kind of agent."""
