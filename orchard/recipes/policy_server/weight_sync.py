"""Getting a trainer's new weights to the engine that samples the next rollouts.

In-process, ``PolicyServer.update(model)`` swaps them between batches. An external engine
(SGLang, or an orchard policy server in another process or on another machine) takes a model
folder instead: ``FolderSync`` saves the weights the server should hold (LoRA merged) as a
folder under ``root`` and asks the engine to load it, then keeps only the last ``keep``
folders. Anything with ``update(model) -> version`` can stand where RL and distillation take
a server (``train_rl(..., server=FolderSync(...), harness=...)``).

    sync = FolderSync("http://sglang:30000", "/shared/weights", kind="sglang", key=KEY)
    train_rl(model, tasks, client, sync, out, config, harness=harness)

``key`` is the engine's admin key, sent as ``Authorization: Bearer``: an orchard policy server
refuses to load weights without its own (``--admin-key``), and SGLang checks its ``--api-key``.

vLLM has no stable endpoint that loads new weights from a folder into a running server: run
it behind the proxy for sampling and restart it on the saved folder, or use its weight-update
RPC from your own code.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal, Protocol

import httpx
import torch

from orchard.recipes.models import served_weights


class ServesWeights(Protocol):
    def update(self, weights: torch.nn.Module) -> int:
        """Make ``weights`` the ones sampled from; returns the new weights version."""
        ...


class ServedPolicy(ServesWeights, Protocol):
    """What a recipe needs of whatever serves its policy: the base URL its harness calls (the
    OpenAI one is ``url + "/v1"``), the model name served there, and new weights in."""

    @property
    def url(self) -> str | None: ...

    @property
    def model_name(self) -> str: ...


class WeightSyncError(RuntimeError):
    """The engine did not take the new weights; the message says what it answered."""


class FolderSync:
    """Weights pushed to an external engine as a model folder (see the module's docstring)."""

    def __init__(self, url: str, root: str | Path, *, kind: Literal["orchard", "sglang"],
                 tokenizer_dir: str | Path | None = None, keep: int = 2,
                 timeout: float = 600.0, key: str | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep at least one folder (the engine may still read it), not "
                             f"{keep}")
        self.url, self.root, self.kind = url.rstrip("/"), Path(root), kind
        self.tokenizer_dir, self.keep, self.timeout = tokenizer_dir, keep, timeout
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.version = 0

    def update(self, weights: torch.nn.Module) -> int:
        self.version += 1
        folder = self.root / f"weights-{self.version:05d}"
        self._save(weights, folder)
        path, body = {"orchard": ("/v1/load_weights", {"path": str(folder)}),
                      "sglang": ("/update_weights_from_disk",
                                 {"model_path": str(folder)})}[self.kind]
        try:
            reply = httpx.post(f"{self.url}{path}", json=body, headers=self.headers,
                               timeout=self.timeout)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"the {self.kind} engine at {self.url} could not be reached "
                                  f"to load {folder}: {e}") from None
        answer = reply.json() if reply.headers.get("content-type", "").startswith(
            "application/json") else {}
        # SGLang answers 200 with success false when the load failed.
        if reply.status_code != 200 or answer.get("success") is False:
            raise WeightSyncError(f"the {self.kind} engine at {self.url} did not load {folder}"
                                  f" (HTTP {reply.status_code}): {reply.text[:300]}")
        self._prune()
        return self.version

    def _save(self, model: torch.nn.Module, folder: Path) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        folder.mkdir(parents=True, exist_ok=True)
        base.save_pretrained(str(folder), state_dict=served_weights(model))
        if self.tokenizer_dir is not None:
            for f in Path(self.tokenizer_dir).iterdir():
                if f.is_file() and ("token" in f.name or f.suffix == ".jinja"):
                    shutil.copy2(f, folder / f.name)

    def _prune(self) -> None:
        folders = sorted(self.root.glob("weights-*"))
        for old in folders[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)


class RemotePolicy:
    """A policy served by an engine in another process (SGLang on a GPU, or an orchard policy
    server): the harness calls ``url``, and ``sync`` pushes each new set of weights to it."""

    def __init__(self, url: str, model_name: str, sync: FolderSync) -> None:
        self.url, self.model_name, self.sync = url.rstrip("/"), model_name, sync

    def update(self, weights: torch.nn.Module) -> int:
        return self.sync.update(weights)


__all__ = ["FolderSync", "RemotePolicy", "ServedPolicy", "ServesWeights", "WeightSyncError"]
