"""Training samples from a session's recorded calls, token for token.

A harness's turn k+1 prompt should be its turn k prompt, plus the completion the model gave,
plus what came back from the environment. When that holds, the whole session is ONE sample:
assistant (completion) tokens get mask 1 and their log-probs, everything else mask 0. When a
harness re-renders the history differently (re-tokenisation drift), the turns cannot be
joined without training on tokens the model never produced: the sample ends there, a new one
starts, and the break is reported. Turns are never merged across a break.

Format (one dict per sample, JSON-serialisable; equal-length lists):
    {"session", "calls": [call indices], "input_ids": [...], "loss_mask": [0|1 ...],
     "logprobs": [float|None ...] (None where mask is 0 or the upstream gave none)}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchard.rollout.proxy.recorder import ModelCall


@dataclass
class Sample:
    session: str
    calls: list[int] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)

    def extend(self, ids: list[int], mask: int, logprobs: list[float | None] | None) -> None:
        self.input_ids += ids
        self.loss_mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [None] * len(ids)


@dataclass
class Drift:
    """Call `call` did not continue call `previous` token for token: where they first differ."""
    call: int
    previous: int
    position: int


def build_samples(session: str, calls: list[ModelCall]) -> tuple[list[Sample], list[Drift]]:
    """Samples from a session's calls (as the proxy records them); calls without token ids
    (the upstream did not return them) or that failed are skipped."""
    samples: list[Sample] = []
    drifts: list[Drift] = []
    current: Sample | None = None
    for call in calls:
        tokens = call.get("tokens")
        if not tokens or call.get("error"):
            continue
        prompt, completion = tokens["prompt_ids"], tokens["completion_ids"]
        logprobs = tokens.get("completion_logprobs")
        if current is not None and prompt[:len(current.input_ids)] == current.input_ids:
            current.extend(prompt[len(current.input_ids):], 0, None)
        else:
            if current is not None:
                drifts.append(Drift(call["index"], current.calls[-1],
                                    _first_difference(current.input_ids, prompt)))
            current = Sample(session)
            samples.append(current)
            current.extend(prompt, 0, None)
        current.calls.append(call["index"])
        current.extend(completion, 1, logprobs)
    return samples, drifts


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def samples_json(session: str, calls: list[ModelCall]) -> dict[str, Any]:
    samples, drifts = build_samples(session, calls)
    return {"session": session, "samples": [asdict(s) for s in samples],
            "drift": [asdict(d) for d in drifts]}
