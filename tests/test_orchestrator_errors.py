"""Every exception the orchestrator side of orchard.env defines has one root."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import orchard.env
from orchard.env import errors
from orchard.env.client import errors as sdk_errors

# The SDK is the client side (its own tree, for users), and the Dockerfile builder runs over it
# (its errors are the SDK's OrchardError); the agent runs inside sandboxes on the stdlib alone
# and answers in HTTP statuses, never with our classes.
NOT_SERVER_SIDE = ("orchard.env.client", "orchard.env.build", "orchard.env.agent.server")


def _server_side_exceptions() -> list[type[BaseException]]:
    found = []
    for module in pkgutil.walk_packages(orchard.env.__path__, "orchard.env."):
        if module.name.startswith(NOT_SERVER_SIDE):
            continue
        loaded = importlib.import_module(module.name)
        found += [
            cls for _, cls in inspect.getmembers(loaded, inspect.isclass)
            if issubclass(cls, BaseException) and cls.__module__ == module.name
        ]
    return found


EXCEPTIONS = _server_side_exceptions()


def test_the_walk_finds_the_known_roots_of_each_part() -> None:
    names = {cls.__name__ for cls in EXCEPTIONS}
    # The service's, the agent client's, the backends' and the state stores' (one each).
    assert {"ServiceError", "AgentError", "BackendError", "SpecRejected", "LockTimeout"} <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_every_server_side_exception_derives_from_the_root(cls: type[BaseException]) -> None:
    assert issubclass(cls, errors.OrchestratorError)


@pytest.mark.parametrize(("name", "builtin"), [
    ("orchard.env.backends.base.BackendError", RuntimeError),
    ("orchard.env.backends.base.SpecRejected", ValueError),
    ("orchard.env.state.base.LockTimeout", TimeoutError),
    ("orchard.env.state.base.StoreUnavailable", RuntimeError),
    ("orchard.env.datadir.DataDirInUse", RuntimeError),
])
def test_each_keeps_the_builtin_base_it_had(name: str, builtin: type[Exception]) -> None:
    # Code that catches RuntimeError or ValueError around these still does.
    module, _, cls = name.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), cls), builtin)


def test_the_root_is_exported_at_the_package_top() -> None:
    assert orchard.env.OrchestratorError is errors.OrchestratorError


def test_the_sdk_keeps_its_own_tree() -> None:
    assert not issubclass(sdk_errors.OrchardError, errors.OrchestratorError)
    assert sdk_errors.OrchardError.__mro__[1] is Exception
