"""Weights pushed to an engine in another process as model folders: the orchard policy server's
/v1/load_weights and SGLang's /update_weights_from_disk (a stand-in speaking SGLang's protocol
over a real socket, since no GPU engine runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi import FastAPI, Header, HTTPException

from orchard.recipes.models import served_weights, tiny_llama, with_lora
from orchard.recipes.policy_server.server import PolicyServer, RequestError
from orchard.recipes.policy_server.weight_sync import FolderSync, WeightSyncError
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.serving import ThreadedServer

TOK = load_tokenizer(TEST_TOKENIZER)


def same_weights(server: PolicyServer, model: torch.nn.Module) -> bool:
    state = served_weights(model)
    return all(torch.equal(v, state[k]) for k, v in server.engine.model.state_dict().items())


def test_an_orchard_policy_server_loads_each_pushed_folder(tmp_path: Path,
                                                           tmp_path_factory: pytest.TempPathFactory
                                                           ) -> None:
    with PolicyServer(tiny_llama(TOK, seed=0), TOK) as server:
        keyless = FolderSync(server.url or "", tmp_path_factory.mktemp("keyless"), kind="orchard")
        with pytest.raises(WeightSyncError, match=r"HTTP 401.*admin key"):
            keyless.update(tiny_llama(TOK, seed=1))
        assert server.engine.weights_version == 0
        sync = FolderSync(server.url or "", tmp_path, kind="orchard",
                          tokenizer_dir=TEST_TOKENIZER, key=server.admin_key)
        for seed in (1, 2, 3):
            model = tiny_llama(TOK, seed=seed)
            assert sync.update(model) == seed
            assert same_weights(server, model)
        assert server.engine.weights_version == 3
        assert server.engine.loaded_from == str(tmp_path / "weights-00003")
    # The engine may still read the last folders; older ones go.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights-00002", "weights-00003"]
    assert (tmp_path / "weights-00003" / "tokenizer.json").is_file()


def sglang_stand_in(server: PolicyServer) -> FastAPI:
    """SGLang's weight-update endpoint: 200 with success true or false, as SGLang answers, and
    401 without its --api-key as a bearer token."""
    app = FastAPI()

    @app.post("/update_weights_from_disk")
    def update(body: dict, authorization: str = Header("")) -> dict:
        if authorization != "Bearer sglang-key":
            raise HTTPException(401, "Unauthorized")
        try:
            server.engine.load(body["model_path"])
        except RequestError as e:
            return {"success": False, "message": str(e)}
        return {"success": True, "message": "Succeeded to update model weights."}

    return app


def test_an_sglang_engine_gets_the_merged_lora_weights(tmp_path: Path) -> None:
    with PolicyServer(tiny_llama(TOK, seed=0), TOK) as server:
        sglang = ThreadedServer(sglang_stand_in(server), name="sglang")
        sglang.start()
        try:
            push_to_sglang(server, sglang.url or "", tmp_path)
        finally:
            sglang.stop()


def push_to_sglang(server: PolicyServer, url: str, tmp_path: Path) -> None:
    model = with_lora(tiny_llama(TOK, seed=0), 4)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)
    sync = FolderSync(url, tmp_path, kind="sglang", key="sglang-key")
    assert sync.update(model) == 1
    assert same_weights(server, model)
    # Weights the engine cannot take: SGLang answers 200 with success false, and the
    # error says what it answered; the served weights stay as they were.
    with pytest.raises(WeightSyncError, match="did not load.*do not fit"):
        sync.update(tiny_llama(TOK, hidden_size=32, layers=1, heads=2))
    assert same_weights(server, model)


def test_an_unreachable_engine_is_a_clear_error(tmp_path: Path) -> None:
    sync = FolderSync("http://127.0.0.1:9", tmp_path, kind="orchard")
    with pytest.raises(WeightSyncError, match="could not be reached"):
        sync.update(tiny_llama(TOK, hidden_size=32, layers=1, heads=2))
