"""Starts the agent: imports this directory as the top-level package ``orchard_agent``.

Run as a script inside the sandbox (``bundle.agent_command``) and loaded by file path in the
zygote. Never through ``orchard``: the sandbox has no such package, and on the host importing
it would pull the SDK and its dependencies into every agent. So this file imports only the
standard library and uses no relative imports.
"""

import importlib
import importlib.util
import os
import sys

PACKAGE = "orchard_agent"


def load():
    """Import the agent package (once) and return its entry module, ``orchard_agent.main``."""
    if PACKAGE not in sys.modules:
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(
            PACKAGE, os.path.join(here, "__init__.py"), submodule_search_locations=[here]
        )
        package = importlib.util.module_from_spec(spec)
        # Registered before it runs, so that its relative imports find it.
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}.main")


if __name__ == "__main__":
    load().main(sys.argv[1:])
