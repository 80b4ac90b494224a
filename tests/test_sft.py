"""Credit-assignment SFT: which turns are trained, the token mask under the real chat template,
the dataset filters and files, and the trainer (it learns, and only from masked-in targets)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from orchard.recipes.models import tiny_llama
from orchard.recipes.sft import (
    ChatTemplateError,
    SFTConfig,
    SFTExample,
    build_sft_dataset,
    collate,
    load_examples,
    save_examples,
    select_turns,
    sft_loss,
    sft_train,
    to_dataset,
    tokenize_conversation,
)
from orchard.recipes.trajectories import Trajectory
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer


def tool(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"The {name} tool",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


TOOLS = [tool("bash"), tool("submit")]


def call(name: str, arguments: str, n: int) -> dict:
    return {"id": f"call_{n}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def conversation(observation: str = "def add(a, b):\n    return a - b\n") -> list[dict]:
    return [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "Fix the bug in calc.py."},
        {"role": "assistant", "content": "Let me look at the file.",
         "tool_calls": [call("bash", '{"command": "cat calc.py"}', 0)]},
        {"role": "tool", "tool_call_id": "call_0", "content": observation},
        {"role": "assistant", "content": "The sign is wrong.",
         "tool_calls": [call("bash", '{"command": "sed -i s/-/+/ calc.py"}', 1)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "(no output)"},
        {"role": "assistant", "content": None, "tool_calls": [call("submit", "{}", 2)]},
    ]


# What the ChatML/Hermes template renders after each turn's "<|im_start|>assistant\n" header,
# written out by hand: the text the mask must cover, end-of-turn token included.
BODIES = [
    'Let me look at the file.\n<tool_call>\n{"name": "bash", "arguments": '
    '{"command": "cat calc.py"}}\n</tool_call><|im_end|>',
    'The sign is wrong.\n<tool_call>\n{"name": "bash", "arguments": '
    '{"command": "sed -i s/-/+/ calc.py"}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>',
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # These models are tiny: a second thread costs more in synchronisation than it gives,
    # and far more when other processes share the CPUs.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TEST_TOKENIZER)


def trajectory(rollout_id: str, *, resolved: bool, messages: list[dict] | None = None,
               tools: list[dict] | None = None) -> Trajectory:
    return Trajectory(rollout_id=rollout_id, instance_id=f"task-{rollout_id}",
                      messages=messages or conversation(), tools=tools or TOOLS,
                      resolved=resolved, reward=1.0 if resolved else -1.0)


# --- the mask ------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [[], [0], [1], [2], [0, 2], [0, 1, 2]])
def test_mask_covers_exactly_the_chosen_assistant_turns(tok, steps: list[int]) -> None:
    messages = conversation()
    ids, mask, spans = tokenize_conversation(tok, messages, TOOLS, steps)

    rendered = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert ids == tok.apply_chat_template(messages, tools=TOOLS, tokenize=True,
                                          return_dict=False)
    assert tok.decode(ids) == rendered
    assert len(mask) == len(ids) and set(mask) <= {0, 1}

    assert [tok.decode(ids[a:b]) for a, b in spans] == [BODIES[s] for s in steps]
    in_span = {k for a, b in spans for k in range(a, b)}
    assert [k for k, m in enumerate(mask) if m] == sorted(in_span)
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "".join(
        BODIES[s] for s in steps)
    for a, b in spans:  # the header before is context, the newline after is not trained
        assert tok.decode(ids[:a]).endswith("<|im_start|>assistant\n")
        assert ids[b - 1] == tok.eos_token_id and mask[b] == 0


def test_a_template_that_is_not_prefix_stable_is_refused(tok) -> None:
    # As Qwen3 with thinking off: the generation prompt opens an empty think block that the
    # rendered history does not hold, so the prompt the model saw is not a prefix.
    thinking = load_tokenizer(TEST_TOKENIZER)
    header = "{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
    assert thinking.chat_template.endswith(header)
    thinking.chat_template = thinking.chat_template.replace(
        header, "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{%- endif %}\n")
    with pytest.raises(ChatTemplateError, match=r"not prefix-stable at assistant turn 0 "
                                                r"\(message 2\)"):
        tokenize_conversation(thinking, conversation(), TOOLS, [1])


def test_a_token_across_the_turn_boundary_is_refused(tok) -> None:
    messages = conversation()
    messages[4]["content"] = "\n\nThe sign is wrong."  # merges with the header's newline
    with pytest.raises(ChatTemplateError, match="assistant turn 1: a token crosses"):
        tokenize_conversation(tok, messages, TOOLS, [1])
    # Turns that keep their own tokens are still fine.
    _, mask, _ = tokenize_conversation(tok, messages, TOOLS, [0, 2])
    assert sum(mask) > 0


def test_trained_steps_outside_the_conversation_are_refused(tok) -> None:
    with pytest.raises(ValueError, match="outside the conversation's 3 assistant turns"):
        tokenize_conversation(tok, conversation(), TOOLS, [3])


# --- which turns ---------------------------------------------------------------------------


def test_select_turns() -> None:
    assert select_turns(trajectory("a", resolved=True), None) == [0, 1, 2]
    assert select_turns(trajectory("a", resolved=True), [(1, 2)]) == [0, 1, 2]
    unresolved = trajectory("b", resolved=False)
    assert select_turns(unresolved, None) == []
    assert select_turns(unresolved, []) == []
    assert select_turns(unresolved, [(1, 2)]) == [1]
    assert select_turns(unresolved, [(0, 2), (1, 3)]) == [0, 1, 2]
    assert select_turns(unresolved, [(2, 3), (0, 1)]) == [0, 2]
    with pytest.raises(ValueError, match=r"segment \(2, 4\) is not a step range"):
        select_turns(unresolved, [(2, 4)])


# --- the dataset ---------------------------------------------------------------------------


def test_filters_drop_with_reasons(tok) -> None:
    bad_json = conversation()
    bad_json[4]["tool_calls"][0]["function"]["arguments"] = '{"command": "ls"'
    not_object = conversation()
    not_object[6]["tool_calls"][0]["function"]["arguments"] = '["x"]'
    unknown = conversation()
    unknown[6]["tool_calls"][0]["function"]["name"] = "python"
    boundary = conversation()
    boundary[2]["content"] = "\n\nLet me look."
    trajectories = [
        trajectory("ok", resolved=True),
        trajectory("rise", resolved=False),
        trajectory("flat", resolved=False),
        trajectory("long", resolved=True, messages=conversation("x = 1\n" * 400)),
        trajectory("json", resolved=True, messages=bad_json),
        trajectory("list", resolved=True, messages=not_object),
        trajectory("tool", resolved=True, messages=unknown),
        trajectory("edge", resolved=True, messages=boundary),
    ]
    segments = {"rise": [(1, 2)], "flat": [], "json": [(0, 1)]}
    examples, dropped = build_sft_dataset(trajectories, segments, tok, max_tokens=600)

    assert [e.rollout_id for e in examples] == ["ok", "rise"]
    ok, rise = examples
    assert ok.trained_steps == [0, 1, 2] and ok.resolved and ok.instance_id == "task-ok"
    assert rise.trained_steps == [1] and not rise.resolved
    assert rise.input_ids == ok.input_ids and 0 < sum(rise.loss_mask) < sum(ok.loss_mask)
    assert set(dropped) == {"flat", "long", "json", "list", "tool", "edge"}
    assert dropped["flat"].startswith("nothing to train")
    assert dropped["long"].startswith("over-long:") and "> max_tokens=600" in dropped["long"]
    assert dropped["json"].startswith("unparsable action: step 1 arguments are not JSON")
    assert dropped["list"] == "unparsable action: step 2 arguments are not a JSON object"
    assert dropped["tool"] == "unknown tool: step 2 calls 'python', not one of ['bash', 'submit']"
    assert dropped["edge"].startswith("template: assistant turn 0: a token crosses")


def test_jsonl_round_trip_and_datasets(tok, tmp_path: Path) -> None:
    examples, _ = build_sft_dataset(
        [trajectory("ok", resolved=True), trajectory("rise", resolved=False)],
        {"rise": [(0, 1)]}, tok)
    path = tmp_path / "out" / "sft.jsonl"
    save_examples(examples, path)
    assert len(path.read_text().splitlines()) == 2
    assert load_examples(path) == examples

    dataset = to_dataset(examples)
    assert len(dataset) == 2
    assert dataset.column_names == ["rollout_id", "instance_id", "input_ids", "loss_mask",
                                    "trained_steps", "resolved"]
    assert [SFTExample(**row) for row in dataset] == examples
    assert len(to_dataset([])) == 0 and to_dataset([]).column_names == dataset.column_names

    with path.open("a") as f:
        f.write(json.dumps({"rollout_id": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"sft.jsonl:3 is not an SFT example"):
        load_examples(path)


def test_an_example_needs_a_mask_entry_per_token() -> None:
    with pytest.raises(ValueError, match="3 input_ids but 2 loss_mask entries"):
        SFTExample("r", "i", [1, 2, 3], [0, 1], [0], True)


# --- training ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def examples(tok) -> list[SFTExample]:
    trajectories = [trajectory("a", resolved=True),
                    trajectory("b", resolved=False, messages=conversation("1 passed\n")),
                    trajectory("c", resolved=True, messages=conversation("FAILED test_add\n"))]
    examples, dropped = build_sft_dataset(trajectories, {"b": [(0, 2)]}, tok)
    assert not dropped
    return examples


def full_loss(model: torch.nn.Module, examples: list[SFTExample]) -> float:
    with torch.no_grad():
        return sft_loss(model, **collate(examples, model.config.pad_token_id)).item()


@pytest.fixture(scope="module")
def trained(tok, examples: list[SFTExample]) -> SimpleNamespace:
    model = tiny_llama(tok, hidden_size=64, layers=2, heads=4)
    before = full_loss(model, examples)
    seen: list[dict] = []
    config = SFTConfig(lr=1e-2, epochs=12, batch_size=2, warmup=5, log_every=100)
    history = sft_train(model, examples, config, on_step=seen.append)
    return SimpleNamespace(model=model.eval(), before=before, config=config, history=history,
                           seen=seen)


def test_training_lowers_the_masked_loss(trained: SimpleNamespace,
                                         examples: list[SFTExample]) -> None:
    history, config = trained.history, trained.config
    assert len(history) == 24 and trained.seen == history
    assert [m["step"] for m in history] == list(range(24))
    assert history[0]["lr"] == pytest.approx(config.lr / 5)
    assert max(m["lr"] for m in history) == pytest.approx(config.lr)
    assert history[-1]["lr"] == pytest.approx(config.lr * config.min_lr_ratio)
    assert all(0 < m["trained_tokens"] < m["tokens"] for m in history)
    after = full_loss(trained.model, examples)
    assert after < trained.before / 2, (trained.before, after)


def test_max_steps_stops_early(tok, examples: list[SFTExample]) -> None:
    model = tiny_llama(tok, hidden_size=32, layers=1, heads=2)
    history = sft_train(model, examples, SFTConfig(epochs=10, batch_size=1, max_steps=4))
    assert [m["step"] for m in history] == [0, 1, 2, 3]
    assert [m["epoch"] for m in history] == [0, 0, 0, 1]


def test_padding_does_not_change_the_loss(tok, examples: list[SFTExample]) -> None:
    cut = examples[0].loss_mask.index(1) + 10  # into the first trained turn
    short = SFTExample("s", "s", examples[0].input_ids[:cut], examples[0].loss_mask[:cut],
                       [0], True)
    assert len(short.input_ids) < len(examples[1].input_ids)
    pair = [short, examples[1]]
    model = tiny_llama(tok, hidden_size=64, layers=2, heads=4).eval()
    counts = [sum(e.loss_mask[1:]) for e in pair]
    alone = [full_loss(model, [e]) * n for e, n in zip(pair, counts, strict=True)]
    assert full_loss(model, pair) == pytest.approx(sum(alone) / sum(counts), rel=1e-5)


def test_only_masked_in_targets_carry_gradient() -> None:
    # A "model" whose logits are a free parameter: the gradient on the logits at position i
    # must be nonzero exactly when target i + 1 is masked in.
    torch.manual_seed(0)
    logits = torch.nn.Parameter(torch.randn(1, 6, 11))
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 1]])

    def model(**_: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=logits)

    sft_loss(model, ids, torch.ones_like(ids), loss_mask).backward()
    has_gradient = logits.grad[0].abs().sum(-1) > 0
    assert has_gradient.tolist() == [False, True, True, False, True, False]


def test_an_observation_target_does_not_move_the_loss(tok, trained: SimpleNamespace,
                                                      examples: list[SFTExample]) -> None:
    # The trained model: a random one predicts nearly uniformly, so no target moves it much.
    model = trained.model
    example = examples[0]
    ids = torch.tensor([example.input_ids])
    mask = torch.tensor([example.loss_mask])
    attention = torch.ones_like(ids)
    # The conversation ends "<|im_end|>\n": the newline is a target the mask leaves out, the
    # end-of-turn token one it trains; neither is an input to any later trained prediction.
    assert mask[0, -1] == 0 and mask[0, -2] == 1 and ids[0, -2] == tok.eos_token_id

    def loss_with_last_tokens(*replaced: int) -> torch.Tensor:
        changed = ids.clone()
        changed[0, -len(replaced):] = torch.tensor(replaced)
        with torch.no_grad():
            return sft_loss(model, changed, attention, mask)

    other = tok.convert_tokens_to_ids("def")
    base = loss_with_last_tokens(ids[0, -1].item())
    changed_observation = loss_with_last_tokens(other)
    changed_action = loss_with_last_tokens(other, ids[0, -1].item())
    assert torch.equal(changed_observation, base)
    assert abs(changed_action.item() - base.item()) > 1e-3


def test_lora_trains_the_adapters_only_and_is_served_merged(tok,
                                                           examples: list[SFTExample]) -> None:
    from orchard.recipes.models import served_weights, with_lora
    from orchard.recipes.policy_server.server import PolicyServer

    base = tiny_llama(tok, hidden_size=64, layers=2, heads=4)
    frozen = {k: v.clone() for k, v in base.state_dict().items()}
    served = tiny_llama(tok, hidden_size=64, layers=2, heads=4).eval()
    model = with_lora(base, 8)
    before = full_loss(model, examples)
    # The adapters start as a no-op (B = 0): served weights are the base's.
    assert all(torch.equal(served_weights(model)[k], v) for k, v in frozen.items())
    sft_train(model, examples, SFTConfig(lr=1e-2, epochs=12, batch_size=2, warmup=5))
    model.eval()
    # Embeddings and the head stay frozen, so a random-init model learns less than in full.
    assert full_loss(model, examples) < before * 0.95
    weights = served_weights(model)
    assert weights.keys() == frozen.keys()
    # The base is untouched; the served weights carry the adapters' deltas.
    trained_base = {k.replace(".base_layer.", "."): v
                    for k, v in model.get_base_model().state_dict().items() if "lora_" not in k}
    assert all(torch.equal(trained_base[k], v) for k, v in frozen.items())
    assert any(not torch.equal(weights[k], v) for k, v in frozen.items())
    # The server takes the LoRA model itself and then computes what it computes.
    with PolicyServer(served, tok) as server:
        assert server.update(model) == 1
        ids = torch.tensor([examples[0].input_ids[:40]])
        with torch.no_grad():
            assert torch.allclose(server.engine.model(ids).logits, model(ids).logits,
                                  atol=1e-5)
