"""Which optional part of orchard needs which extra, and the error for a missing one.

``pip install orchard`` is the SDK and the CLI client. The orchestrator, the rollout layer,
task grading and training each need an extra (pyproject.toml lists them). Each of those parts
calls ``require`` when it is first imported, so a missing dependency is a one-line error that
names the extra to install, not a traceback ending in some library's ``import``.
"""

from __future__ import annotations

import importlib.util

# The modules each extra installs, as imported. Only presence is checked (find_spec), so a
# part pays nothing for the check but a few path lookups.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "server": ("orchard serve and SandboxClient.local()",
               ("fastapi", "uvicorn", "prometheus_client", "platformdirs", "pyseccomp", "yaml",
                "redis", "kubernetes_asyncio", "dns")),
    "rollout": ("the recording proxy and the harness adapters",
                ("fastapi", "uvicorn", "yaml", "transformers", "tokenizers", "minisweagent")),
    "tasks": ("task sets and their grading", ("yaml", "datasets", "pyarrow", "swebench")),
    "train": ("the training recipes and charts",
              ("transformers", "datasets", "torch", "matplotlib")),
    "openenv": ("task sets served as OpenEnv environments",
                ("openenv", "fastapi", "uvicorn")),
    # Training reports (orchard.recipes.reporting, --report-to): one extra a backend.
    "tensorboard": ("reports to TensorBoard", ("tensorboard",)),
    "wandb": ("reports to Weights & Biases", ("wandb",)),
    "trackio": ("reports to trackio", ("trackio",)),
    "harbor": ("Harbor's CLI and its Orchard provider (Python >= 3.12: `make harbor`)",
               ("harbor",)),
}


class MissingExtra(ImportError):
    """A dependency of an optional part is not installed; the message names the extra."""

    def __init__(self, extra: str, module: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(f"{EXTRAS[extra][0]} need the Python package {module!r}, which comes "
                         f"with orchard's [{extra}] extra: pip install 'orchard[{extra}]'",
                         name=module)


def require(*extras: str) -> None:
    """Raises MissingExtra for the first module of ``extras`` that is not installed."""
    for extra in extras:
        if extra not in EXTRAS:
            raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
        for module in EXTRAS[extra][1]:
            require_module(module, extra)


def require_module(module: str, extra: str) -> None:
    """Raises MissingExtra if ``module`` (one that ``extra`` installs) is not installed."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(extra, module)
