"""BrowserGym's action and observation space for the browser agent: the parser and the renderer
on their own (many bad answers), then real sandboxes with a real Chromium: the same shop task
solved through our action set and through BrowserGym's ends in the same site state, and each
BrowserGym action does what it says on a page. The only double is the scripted model server,
which speaks OpenAI's protocol over a loopback socket."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchard.cli import app as cli_app
from orchard.domains import make_harness
from orchard.domains.web import grade_web, load_web_tasks, start_sites
from orchard.domains.web.browser_agent import run_browser_agent
from orchard.domains.web.browsergym import (
    ACTIONS,
    ActionError,
    describe,
    parse_action,
    plan,
    render_axtree,
    render_turn,
)
from orchard.domains.web.environment import site_state
from orchard.domains.web.model import WebTask
from orchard.domains.web.teacher import web_teacher
from orchard.env.browser_schema import BrowserObservation, BrowserTab
from orchard.env.client import OrchardError, Sandbox, SandboxClient
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.testing.policies import FunctionPolicy, Messages, Tools
from orchard.testing.teacher import TeacherServer
from tests.conftest import needs_browser, needs_root

TASKS = {t.instance_id: t for t in load_web_tasks()}
# The shop's product page as our tree shows it (docs/guides/browser.md), a checkbox added.
TREE = """[1] navigation
  [2] link "Home"
  [5] form
    [6] textbox "Search products"
    "Price: $25.50"
[8] main
  [11] spinbutton "Quantity" value="1"
  [12] button "Add to cart"
  [13] checkbox "Gift wrap \\"deluxe\\"" checked disabled
  "café"
  [14] combobox "Shipping" value="Standard" expanded"""


def a_page(tree: str = TREE, tabs: int = 2, active: int = 1, error: str | None = None
           ) -> BrowserObservation:
    return BrowserObservation(
        url="http://127.0.0.1:8101/product?sku=ms-202", title="Wireless Mouse",
        tabs=[BrowserTab(index=i, url=f"http://127.0.0.1:8101/{i}", title=f"T{i}",
                         active=i == active) for i in range(tabs)],
        tree=tree, truncated=False, elements=14, error=error)


# --- the parser ------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "name", "args"), [
    ("click('12')", "click", {"bid": "12", "button": "left", "modifiers": ()}),
    ('click("12")', "click", {"bid": "12", "button": "left", "modifiers": ()}),
    # BrowserGym's demo agent: reasoning, then the action in fences.
    ("I now need to click on the Submit button. I will use the click action on the button, "
     "which has bid 12.\n```click(\"12\")```", "click", {"bid": "12"}),
    ("```python\nfill('6', 'flask')\n```", "fill", {"bid": "6", "value": "flask"}),
    # AgentLab's <action> tags win over code quoted elsewhere in the answer.
    ("<think>maybe click('3')?</think>\n<action>\nselect_option('14', ['Express'])\n</action>",
     "select_option", {"bid": "14", "options": ["Express"]}),
    ("Let me type it: fill('6', 'a (b) \\'c\\')') and see.", "fill",
     {"bid": "6", "value": "a (b) 'c')"}),
    ("# the search box\nfill(bid='6', value='multi-line\\nexample', enable_autocomplete_menu=True)",
     "fill", {"bid": "6", "value": "multi-line\nexample", "enable_autocomplete_menu": True}),
    ("press('6', 'ControlOrMeta+a')", "press", {"bid": "6", "key_comb": "ControlOrMeta+a"}),
    ("scroll(0, -200.5)", "scroll", {"delta_x": 0, "delta_y": -200.5}),
    ("noop()", "noop", {"wait_ms": 1000}),
    ("send_msg_to_user(\"The price for a 15\\\" laptop is 1499 USD.\")", "send_msg_to_user",
     {"text": 'The price for a 15" laptop is 1499 USD.'}),
    ("tab_focus(0)", "tab_focus", {"index": 0}),
])
def test_answers_browsergym_prompts_produce_parse(answer: str, name: str,
                                                 args: dict[str, Any]) -> None:
    call = parse_action(answer)
    assert call.name == name
    assert {k: call.args[k] for k in args} == args


@pytest.mark.parametrize(("answer", "message"), [
    ("", "empty action"),
    ("   \n", "empty action"),
    (None, "empty action"),
    ("I am done.", "No action found"),
    ("click", "No action found"),
    ("```\n```", "empty action|No action found"),
    ("foo('1')", "Unknown action 'foo'"),
    ("os.system('rm -rf /')", "os.system\\(...\\) is not an action"),
    ("page.click('12')", "page.click\\(...\\) is not an action"),
    ("click(__import__('os').system('id'))", "bid must be a literal"),
    ("fill('6', open('/etc/passwd').read())", "value must be a literal"),
    ("click('1'); click('2')", "Received 2 actions"),
    ("click('1')\nfill('2', 'x')", "Received 2 actions"),
    ("First fill('6', 'x') then click('7').", "Received 2 actions"),
    ("click(*['1'])", "without \\* or \\*\\*"),
    ("click(**{'bid': '1'})", "without \\* or \\*\\*"),
    ("click('1', 'left', [], 'extra')", "click takes 3 arguments"),
    ("click(bid='1', colour='red')", "no argument 'colour'"),
    ("fill('1', 'a', value='b')", "got 'value' twice"),
    ("fill('1')", "fill needs 'value'"),
    ("goto()", "goto needs 'url'"),
    ("drag_and_drop('1', '2')", "drag_and_drop is not supported"),
    ("mouse_click(10, 20)", "mouse_click is not supported"),
    ("click('12'", "No action found"),  # never closed
    ("click(" + "[" * 200 + "]" * 200 + ")", "."),  # deep nesting: an error, not a crash
])
def test_bad_answers_are_errors_for_the_model(answer: str | None, message: str) -> None:
    with pytest.raises(ActionError, match=message):
        parse_action(answer)


# --- the plan: what each action does in our browser ------------------------------------------


@pytest.mark.parametrize(("answer", "actions"), [
    ("click('12')", [{"action": "click", "id": 12}]),
    ("click(12)", [{"action": "click", "id": 12}]),
    ("dblclick('12')", [{"action": "dblclick", "id": 12}]),
    ("hover('2')", [{"action": "hover", "id": 2}]),
    ("focus('6')", [{"action": "focus", "id": 6}]),
    ("fill('6', 'flask')", [{"action": "type", "id": 6, "text": "flask", "clear": True}]),
    ("clear('6')", [{"action": "type", "id": 6, "text": "", "clear": True}]),
    ("select_option('14', 'express')", [{"action": "select", "id": 14, "value": "express"}]),
    ("select_option('14', ['express'])", [{"action": "select", "id": 14, "value": "express"}]),
    ("press('6', 'Enter')", [{"action": "focus", "id": 6}, {"action": "press", "key": "Enter"}]),
    ("scroll(0, 200)", [{"action": "scroll", "direction": "down", "amount": 200}]),
    ("scroll(0.0, -100.5)", [{"action": "scroll", "direction": "up", "amount": 100}]),
    ("scroll(0, 0)", [{"action": "observe"}]),
    ("goto('http://127.0.0.1:8102/')", [{"action": "goto", "url": "http://127.0.0.1:8102/"}]),
    ("go_back()", [{"action": "back"}]),
    ("go_forward()", [{"action": "forward"}]),
    ("new_tab()", [{"action": "tab", "op": "new"}]),
    ("tab_focus(0)", [{"action": "tab", "op": "switch", "index": 0}]),
    ("tab_close()", [{"action": "tab", "op": "close", "index": 1}]),  # the active tab
    ("noop(0)", [{"action": "observe"}]),
])
def test_each_action_becomes_browser_actions(answer: str, actions: list[dict[str, Any]]) -> None:
    todo = plan(parse_action(answer), a_page())
    assert todo.actions == actions and not todo.finish


def test_the_episode_ends_with_a_message_or_infeasible() -> None:
    said = plan(parse_action("send_msg_to_user('8,849 metres')"), a_page())
    assert said.finish and said.answer == "8,849 metres" and not said.actions
    given_up = plan(parse_action("report_infeasible('there is no such product')"), a_page())
    assert given_up.finish and given_up.answer is None
    assert plan(parse_action("noop(500)"), a_page()).wait_s == 0.5
    assert plan(parse_action("noop(1e9)"), a_page()).wait_s == 10.0  # capped


@pytest.mark.parametrize(("answer", "message"), [
    ("click('a51')", "'a51' is not a bid on this page"),
    ("click('0')", "is not a bid"),
    ("click(True)", "is not a bid"),
    ("click('')", "is not a bid"),
    ("click('12', button='right')", "only the left button"),
    ("click('12', modifiers=['Shift'])", "only the left button"),
    ("dblclick('12', button='side')", "button is 'left', 'middle' or 'right'"),
    ("fill('6', 42)", "value must be a string"),
    ("select_option('14', ['red', 'green'])", "one option at a time"),
    ("select_option('14', 3)", "one option"),
    ("scroll(50, 0)", "vertically only"),
    ("scroll('down', 100)", "delta_x must be a number"),
    ("tab_focus('1')", "index is a tab's number"),
    ("goto(None)", "url must be a string"),
    ("press('6', '')", "key_comb is a key"),
    ("noop('soon')", "wait_ms must be a number"),
])
def test_wrong_arguments_are_errors_for_the_model(answer: str, message: str) -> None:
    with pytest.raises(ActionError, match=message):
        plan(parse_action(answer), a_page())


# --- what the model reads --------------------------------------------------------------------


def test_the_tree_reads_as_browsergyms_axtree() -> None:
    assert render_axtree(a_page()) == "\n".join([
        "RootWebArea 'Wireless Mouse', focused",
        "\t[1] navigation ''",
        "\t\t[2] link 'Home'",
        "\t\t[5] form ''",
        "\t\t\t[6] textbox 'Search products'",
        "\t\t\tStaticText 'Price: $25.50'",
        "\t[8] main ''",
        "\t\t[11] spinbutton 'Quantity' value='1'",
        "\t\t[12] button 'Add to cart'",
        "\t\t[13] checkbox 'Gift wrap \"deluxe\"', checked='true', disabled=True",
        "\t\tStaticText 'café'",
        "\t\t[14] combobox 'Shipping' value='Standard', expanded=True"])


def test_the_prompt_describes_the_action_set_as_browsergym_does() -> None:
    text = describe()
    assert text.startswith(f"\n{len(ACTIONS)} different types of actions are available.\n\n")
    assert "\nclick(bid: str, button: Literal['left', 'middle', 'right'] = 'left', modifiers: " \
           "list[typing.Literal['Alt', 'Control', 'ControlOrMeta', 'Meta', 'Shift']] = [])\n" \
           "    Examples:\n        click('a51')\n\n" in text
    assert "fill(bid: str, value: str, enable_autocomplete_menu: bool = False)" in text
    assert text.endswith("Only a single action can be provided at once. Example:\n"
                         "fill('b534', 'Montre', True)\n")
    assert "Description: Hover over an element." in describe(with_long_description=True)
    # Every example it shows parses, and plans on a page whose bids are numbers.
    for spec in ACTIONS.values():
        for example in spec.examples:
            assert parse_action(example).name == spec.name
    # Each turn: the tabs, the tree, the last action's error, the question.
    turn = render_turn(a_page(error="there is no element 99 in the last observation"),
                       None, goal="Buy a mouse.")["content"]
    assert turn.startswith("# Goal\nBuy a mouse.\n\n# Currently open tabs\nTab 0\n")
    # The active tab as the page says (the tab list can lag a same-page navigation).
    assert "Tab 0\n  Title: T0\n  URL: http://127.0.0.1:8101/0\nTab 1 (active tab)\n  Title: " \
           "Wireless Mouse\n  URL: http://127.0.0.1:8101/product?sku=ms-202\n" in turn
    assert "# Current page Accessibility Tree\nRootWebArea 'Wireless Mouse'" in turn
    assert "# Error message from last action" not in turn  # the error given, not the page's
    turn = render_turn(a_page(), "Unknown action 'foo'")["content"]
    assert "# Error message from last action\nUnknown action 'foo'\n" in turn
    assert "# Goal" not in turn and turn.endswith("before deciding on your next action.\n")


def test_the_harness_and_the_cli_take_the_action_set(tmp_path: Path) -> None:
    tasks = [TASKS["shop-buy-mouse"]]
    harness = make_harness("browser-agent", tasks, model_url="http://127.0.0.1:9/v1",
                           model="m", browser_action_set="browsergym")
    assert harness.action_set == "browsergym"
    assert make_harness("browser-agent", tasks, model_url="u", model="m").action_set == "orchard"
    with pytest.raises(ValueError, match="unknown action set 'gym'; one of orchard, browsergym"):
        make_harness("browser-agent", tasks, model_url="u", model="m", browser_action_set="gym")
    # The CLI checks it before it needs an orchestrator.
    out = CliRunner().invoke(cli_app, [
        "eval", "--tasks", "web", "--task", "shop-buy-mouse", "--harness", "browser-agent",
        "--model-url", "http://127.0.0.1:9", "--model", "m", "--action-set", "gym",
        "--out", str(tmp_path / "run")])
    assert out.exit_code == 2 and "unknown action set 'gym'" in out.output, out.output


# --- real sandboxes, a real Chromium ---------------------------------------------------------


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


def _latest_tree(messages: Messages) -> str:
    text = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return text.split("# Current page Accessibility Tree\n", 1)[1]


def bid(messages: Messages, target: str) -> str:
    """The bid of the first element shown as ``target`` (``role "name"``, how gold steps and
    our tree name elements) in the latest page, as BrowserGym writes it."""
    role, _, name = target.partition(" ")
    line = f"] {role} {name.strip(chr(34))!r}"
    found = re.search(r"\[(\d+)" + re.escape(line), _latest_tree(messages))
    if not found:
        raise NotOnPage(f"{target} is not on the page:\n{_latest_tree(messages)}")
    return found.group(1)


class NotOnPage(AssertionError):
    pass


Step = str | Callable[[Messages], str]
# What the scripted model says when the page is not yet what it expects (a redirect still on
# its way on a busy machine): wait and look again, as the web teacher does.
LOOK_AGAIN = "The page is still changing; I will wait.\n```noop(500)```"


def answers(messages: Messages) -> list[int]:
    """Where the script's answers are in the conversation (not its looks again)."""
    return [i for i, m in enumerate(messages)
            if m["role"] == "assistant" and m["content"] != LOOK_AGAIN]


def scripted(steps: list[Step]) -> FunctionPolicy:
    """A model that gives the n-th answer on its n-th turn: text, or made from the page."""
    def policy(messages: Messages, tools: Tools) -> str:
        assert not tools  # BrowserGym's agent answers in text
        step = steps[len(answers(messages))]
        try:
            return step if isinstance(step, str) else step(messages)
        except NotOnPage:
            said = [m["content"] for m in messages if m["role"] == "assistant"]
            if said[-2:] == [LOOK_AGAIN] * 2:
                raise  # it looked twice already
            return LOOK_AGAIN
    return FunctionPolicy(policy)


def in_browsergym(task: WebTask) -> list[Step]:
    """The task's gold run as BrowserGym answers, with the reasoning a model writes."""
    steps: list[Step] = []
    for g in task.gold:
        target = g.target or ""
        if g.action == "click":
            steps.append(lambda m, t=target: f"I will click {t}.\n```click('{bid(m, t)}')```")
        elif g.action == "type":
            steps.append(lambda m, t=target, v=g.text: f"```fill('{bid(m, t)}', {v!r})```")
            if g.submit:
                steps.append(lambda m, t=target: f"```press('{bid(m, t)}', 'Enter')```")
        elif g.action == "select":
            steps.append(lambda m, t=target, v=g.value:
                         f"<action>select_option('{bid(m, t)}', {v!r})</action>")
        else:
            raise AssertionError(f"no BrowserGym form for gold step {g.action}")
    return steps


@needs_root
@needs_browser
def test_the_same_task_through_both_action_sets_ends_the_same(client: SandboxClient) -> None:
    task = TASKS["shop-search-flask"]  # search + Enter, fill, select, click
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    ends = {}
    with TeacherServer(FunctionPolicy(web_teacher([task])), tokenizer) as teacher, \
            client.create_sandbox(memory="2Gi") as sb:
        start_sites(sb, task)
        ours = run_browser_agent(sb, task.goal, task.start_url, f"{teacher.url}/v1",
                                 "teacher", max_steps=task.budget.steps)
        ends["orchard"] = grade_web(sb, task, ours.answer), site_state(sb, task)
    # Mistakes first: each is an error the model reads next turn, and nothing happens.
    mistakes: list[Step] = ["I think I should look around first.",
                            "```click('9999')```", "```frobnicate('3')```",
                            "```scroll(0, 300)```"]
    steps = [*mistakes, *in_browsergym(task), "send_msg_to_user('Ordered three flasks.')"]
    with TeacherServer(scripted(steps), tokenizer) as teacher, \
            client.create_sandbox(memory="2Gi") as sb:
        start_sites(sb, task)
        gym = run_browser_agent(sb, task.goal, task.start_url, f"{teacher.url}/v1", "teacher",
                                max_steps=2 * len(steps), action_set="browsergym")
        ends["browsergym"] = grade_web(sb, task, gym.answer), site_state(sb, task)
    assert ours.exit_status == gym.exit_status == "Submitted"
    assert gym.answer == "Ordered three flasks." and len(answers(gym.messages)) == len(steps)
    (grade_ours, state_ours), (grade_gym, state_gym) = ends["orchard"], ends["browsergym"]
    assert grade_ours.resolved and grade_gym.resolved, (grade_ours, grade_gym)
    assert grade_ours.reward == grade_gym.reward == 1.0
    assert state_gym == state_ours and state_gym["shop"]["orders"]
    # The model saw BrowserGym's text: no tools, the tree with bids, the errors it made.
    turns = [gym.messages[1]["content"], *(gym.messages[i + 1]["content"]
                                           for i in answers(gym.messages)[:-1])]
    assert "\t\t[" in turns[0] and "# Action Space" in gym.messages[0]["content"]
    assert "No action found in the answer" in turns[1]
    assert "there is no element 9999 in the last observation" in turns[2]
    assert "Unknown action 'frobnicate'" in turns[3]
    assert "# Error message from last action" not in turns[4]  # the scroll worked
    assert all("tool_calls" not in m for m in gym.messages)


WIDGETS = """<title>widgets</title>
<button ondblclick="this.textContent='double'">once</button>
<button onmouseover="this.textContent='hovered'">hover me</button>
<input aria-label="name" value="abc" onfocus="document.title='focused'">
<a href="#two" onclick="document.title='clicked'">next</a><div style="height:3000px"></div>"""
HOVER = 'button "hover me"'


def serve(sb: Sandbox, html: str, port: int = 8199) -> str:
    """``html`` served by a static HTTP server in the sandbox; its URL there."""
    sb.upload_content(html.encode(), "/workspace/widgets/index.html")
    sb.start_process(f"python3 -m http.server {port} --bind 127.0.0.1 "
                     "--directory /workspace/widgets")
    deadline = time.monotonic() + 30
    while True:
        try:
            if sb.http(port, "/").status == 200:
                return f"http://127.0.0.1:{port}/"
        except OrchardError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


@needs_root
@needs_browser
def test_each_browsergym_action_does_what_it_says(client: SandboxClient) -> None:

    def value(m: Messages) -> str:
        return re.findall(r"textbox 'name'(?: value='([^']*)')?", _latest_tree(m))[-1]

    checks: list[tuple[Step, Callable[[Messages], bool]]] = [
        (lambda m: f"dblclick('{bid(m, 'button once')}')", lambda m: "'double'" in
         _latest_tree(m)),
        (lambda m: f"hover('{bid(m, HOVER)}')", lambda m: "'hovered'" in
         _latest_tree(m)),
        (lambda m: f"focus('{bid(m, 'textbox name')}')",
         lambda m: _latest_tree(m).startswith("RootWebArea 'focused'")),
        (lambda m: f"press('{bid(m, 'textbox name')}', 'Control+a')", lambda m: True),
        (lambda m: f"press('{bid(m, 'textbox name')}', 'Delete')", lambda m: value(m) == ""),
        (lambda m: f"fill('{bid(m, 'textbox name')}', 'xyz')", lambda m: value(m) == "xyz"),
        (lambda m: f"clear('{bid(m, 'textbox name')}')", lambda m: value(m) == ""),
        (lambda m: f"press('{bid(m, 'textbox name')}', 'Hyper+a')",
         lambda m: "'Hyper' in key 'Hyper+a' is not a modifier" in m[-1]["content"]),
        ("scroll(0, 500)", lambda m: "Error message" not in m[-1]["content"]),
        (lambda m: f"click('{bid(m, 'link next')}')", lambda m: _latest_tree(m).startswith(
            "RootWebArea 'clicked'") and "URL: http://127.0.0.1:8199/#two\n" in m[-1]["content"]),
        ("goto('http://127.0.0.1:8101/')", lambda m: "URL: http://127.0.0.1:8101/\n" in
         m[-1]["content"]),
        (lambda m: f"click('{bid(m, 'link Wireless Mouse')}')", lambda m:
         "URL: http://127.0.0.1:8101/product?sku=ms-202\n" in m[-1]["content"]),
        ("go_back()", lambda m: "URL: http://127.0.0.1:8101/\n" in m[-1]["content"]),
        ("go_forward()", lambda m: "URL: http://127.0.0.1:8101/product?sku=ms-202\n" in
         m[-1]["content"]),
        ("new_tab()", lambda m: re.search(r"Tab 1 \(active tab\)\n.*\n  URL: about:blank\n",
                                          m[-1]["content"]) is not None),
        ("tab_focus(0)", lambda m: "Tab 0 (active tab)" in m[-1]["content"]),
        ("tab_close()", lambda m: "Tab 1" not in m[-1]["content"] and re.search(
            r"Tab 0 \(active tab\)\n.*\n  URL: about:blank\n", m[-1]["content"]) is not None),
        ("tab_focus(5)", lambda m: "there is no tab 5; there are 1" in m[-1]["content"]),
        ("noop(0)", lambda m: "Error message" not in m[-1]["content"]),
    ]
    steps: list[Step] = [s for s, _ in checks] + ["report_infeasible('nothing left to do')"]
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    with TeacherServer(scripted(steps), tokenizer) as teacher, \
            client.create_sandbox(memory="2Gi") as sb:
        start_sites(sb, TASKS["shop-buy-mouse"])
        url = serve(sb, WIDGETS)
        result = run_browser_agent(sb, "Try every action.", url, f"{teacher.url}/v1", "teacher",
                                   max_steps=2 * len(steps), action_set="browsergym")
    assert result.exit_status == "Submitted" and result.answer is None
    messages = result.messages
    assert len(answers(messages)) == len(steps)
    for i, ((_, check), at) in enumerate(zip(checks, answers(messages), strict=False)):
        after = messages[:at + 2]  # up to the page after the answer
        assert check(after), (i, messages[at]["content"], after[-1]["content"][-1500:])
