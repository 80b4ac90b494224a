"""The policy server: the policy being trained, served over OpenAI-compatible
``/v1/completions`` with token ids and log-probs (``server``), its requests decoded together in
batches (``batching``) on the cached keys and values of the sequences their prompts extend
(``prefix_cache``), and new weights moved into it, or into an engine in another process,
between training steps (``weight_sync``).

Not to be confused with ``orchard.serving``, the bottom layer's threaded ASGI server that this
server (and the recording proxy) run on.

    with PolicyServer(model, tokenizer) as server:      # in-process, on a free port
        train_rl(model, tasks, client, server, out, config, harness=harness)
"""

from orchard.recipes.policy_server.batching import Batcher
from orchard.recipes.policy_server.prefix_cache import PrefixCache
from orchard.recipes.policy_server.server import PolicyEngine, PolicyServer, create_policy_app
from orchard.recipes.policy_server.weight_sync import (
    FolderSync,
    RemotePolicy,
    ServedPolicy,
    ServesWeights,
    WeightSyncError,
)

__all__ = ["Batcher", "FolderSync", "PolicyEngine", "PolicyServer", "PrefixCache",
           "RemotePolicy", "ServedPolicy", "ServesWeights", "WeightSyncError",
           "create_policy_app"]
