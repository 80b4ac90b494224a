"""The REST API as FastAPI routers, one module per group of routes; ``api.create_app``
assembles them. Routes validate and shape; the service and ``SandboxOps`` do the work."""
