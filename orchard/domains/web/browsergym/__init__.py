"""BrowserGym's action and observation space for the browser agent (``action_set="browsergym"``):
its high-level actions (``click('12')``, ``fill``, ``select_option``, ``send_msg_to_user``, ...)
parsed from the model's text, and its accessibility-tree text with bids. See
docs/guides/browser.md."""

from orchard.domains.web.browsergym.actions import (
    ACTIONS,
    ActionError,
    Call,
    Plan,
    describe,
    parse_action,
    plan,
)
from orchard.domains.web.browsergym.agent import (
    render_axtree,
    render_turn,
    run_browsergym_agent,
    system_prompt,
)

__all__ = ["ACTIONS", "ActionError", "Call", "Plan", "describe", "parse_action", "plan",
           "render_axtree", "render_turn", "run_browsergym_agent", "system_prompt"]
