"""What a build gives back (``BuiltImage``, one ``StepReport`` per step that writes files) and
the error of a failed RUN: shared by the async builder and its generated blocking twin."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchard.env.build.dockerfile import BuildError, Instruction
from orchard.env.image_schema import ImageConfig


class StepFailed(BuildError):
    """A RUN exited non-zero (or timed out): ``exit_code`` and the tail of its ``output``."""

    def __init__(self, step: Instruction, exit_code: int | None, output: str,
                 timed_out: bool = False) -> None:
        self.step, self.exit_code, self.output = step, exit_code, output
        how = "timed out" if timed_out else f"exited with code {exit_code}"
        super().__init__(f"Dockerfile {step.where()} {how}; its output ended with:\n"
                         f"{output.rstrip() or '(no output)'}")


@dataclass
class StepReport:
    line: int
    instruction: str
    cached: bool
    seconds: float
    snapshot_id: str


@dataclass
class BuiltImage:
    """A finished build: ``name`` is what a sandbox's ``image`` takes."""

    name: str
    snapshot_id: str
    config: ImageConfig
    steps: list[StepReport] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def cached_steps(self) -> int:
        return sum(s.cached for s in self.steps)

    @property
    def run_steps(self) -> int:
        return sum(not s.cached for s in self.steps)
