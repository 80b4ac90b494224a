"""The wire contract of the sandbox's browser: one action in, the page after it out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BrowserVerb = Literal["observe", "goto", "click", "type", "select", "scroll", "press", "back",
                      "tab", "dblclick", "hover", "focus", "forward"]


class BrowserAction(BaseModel):
    """One action in the sandbox's headless Chromium; every action answers with an
    observation. Element ids come from the last observation (each one renumbers them)."""

    model_config = ConfigDict(extra="forbid")

    action: BrowserVerb = "observe"
    url: str | None = Field(None, max_length=8192, description="goto; tab op=new.")
    id: int | None = Field(None, ge=1, description="click, dblclick, hover, focus, type, select, "
                           "scroll: an element.")
    x: float | None = Field(None, ge=0, description="click at a point instead of an element.")
    y: float | None = Field(None, ge=0)
    text: str | None = Field(None, max_length=100_000, description="type: what to type.")
    clear: bool = Field(True, description="type: empty the field first.")
    submit: bool = Field(False, description="type: press Enter after it.")
    value: str | None = Field(None, description="select: an option's value or label.")
    direction: Literal["up", "down"] = "down"
    amount: int | None = Field(None, ge=1, le=100_000, description="scroll: pixels.")
    key: str | None = Field(None, max_length=32, description="press: Enter, Tab, Escape, "
                            "Backspace, ArrowDown, ... or one character, after modifiers "
                            "joined by '+' (Control+a, Shift+Tab).")
    op: Literal["new", "switch", "close"] = "new"
    index: int | None = Field(None, description="tab switch/close: which tab.")
    screenshot: bool = Field(False, description="Add a PNG of the viewport.")
    marks: bool = Field(True, description="With screenshot: draw each element's id on it.")
    timeout: float = Field(30.0, gt=0, le=600, description="Seconds to wait for the page.")

    def agent_request(self) -> dict[str, object]:
        """What the agent takes: the fields that were given or matter to this action."""
        return self.model_dump(exclude_none=True)


class BrowserTab(BaseModel):
    index: int
    url: str
    title: str
    active: bool


class BrowserObservation(BaseModel):
    url: str
    title: str
    tabs: list[BrowserTab]
    tree: str = Field(description="The accessibility tree, a line per element: "
                      "'[id] role \"name\"', indented by depth; quoted lines are text.")
    truncated: bool = Field(description="The tree was cut to fit.")
    elements: int = Field(description="How many ids the tree hands out.")
    error: str | None = Field(None, description="Why the action did not happen (an id that is "
                              "not on the page any more, a page still loading, ...): for the "
                              "model to read, not a failed request.")
    screenshot_png_b64: str | None = None
