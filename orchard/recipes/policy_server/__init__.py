"""Serving the policy being trained: an OpenAI-compatible server over the live weights
(``server``), continuous batching of its requests (``batching``), and moving new weights into it
between steps (``weight_sync``)."""
