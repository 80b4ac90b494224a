"""Training reports (`--report-to`): each backend, real and offline, writes what it is given;
a wrong name or a missing package is a one-line error; the recipes report through it from
their CLIs."""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from orchard.cli import app as cli_app
from orchard.cli.demo import demo_config
from orchard.extras import MissingExtra
from orchard.recipes.demo_view import artifacts
from orchard.recipes.loop import train_loop
from orchard.recipes.reporting import CHOICES, parse_report_to, scalars, section
from tests.conftest import needs_root
from tests.tiny_sft import write_sft_inputs

REPO = Path(__file__).resolve().parents[1]
SFT = [{"loss": 2.0, "lr": 1e-3}, {"loss": 1.5, "lr": 1e-3}, {"loss": 0.5, "lr": 5e-4}]
RL = [{"approx_kl": 0.01, "resolved_rate": 0.25, "first_epoch": {"approx_kl": 0.0}},
      {"approx_kl": 0.02, "resolved_rate": 0.5, "first_epoch": {"approx_kl": 0.0}}]


def offline_env(tmp: Path) -> dict[str, str]:
    """No network and nothing outside ``tmp``: W&B offline, trackio in a folder of its own."""
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
            "WANDB_CONFIG_DIR": str(tmp / "wandb-config"), "WANDB_CACHE_DIR": str(tmp / "cache"),
            "WANDB_DATA_DIR": str(tmp / "wandb-data"), "TRACKIO_DIR": str(tmp / "trackio"),
            "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that reported SFT and RL steps to every backend (`all`). It runs in a process of
    its own: trackio reads TRACKIO_DIR once, on import, and W&B keeps a service process."""
    tmp = tmp_path_factory.mktemp("reported")
    script = textwrap.dedent(f"""
        from pathlib import Path
        from orchard.recipes.reporting import open_reporters, section
        with open_reporters(["all"], Path({str(tmp / "run")!r}), "test-run",
                            {{"lr": 0.001, "model": "tiny"}}) as report:
            for step, record in enumerate({SFT!r}):
                section(report, "sft").log(record, step)
            for step, record in enumerate({RL!r}):
                section(report, "rl").log({{**record, "warnings": ["text is left out"]}}, step)
            print(sorted(report.where))
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=offline_env(tmp))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "['jsonl', 'tensorboard', 'trackio', 'wandb']" in done.stdout, done.stdout
    return tmp


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def wandb_records(path: Path) -> list[Any]:
    """The records of a ``.wandb`` file: W&B's LevelDB-style log (32 KiB blocks of chunks,
    each with a 7-byte header) of protobuf records. wandb 0.2x+ reads it only in Go."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B"
    records, pos, chunks = [], 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # a block's zero padding
            pos += left
            continue
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def test_scalars_keep_the_numbers_a_chart_can_show() -> None:
    record = {"step": 3, "loss": 0.5, "tokens": 12, "done": True, "mode": "balanced",
              "dropped": ["zero spread"], "mean_reward": None,
              "first_epoch": {"approx_kl": 1e-9, "epochs": [1]}}
    assert scalars(record, "rl") == {"rl/step": 3.0, "rl/loss": 0.5, "rl/tokens": 12.0,
                                     "rl/first_epoch/approx_kl": 1e-9}


def test_report_to_parses_like_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_report_to(None) == ["jsonl"]
    assert parse_report_to(["wandb,tensorboard", " TensorBoard "]) == ["tensorboard", "wandb"]
    assert parse_report_to(["none"]) == [] and parse_report_to([]) == []
    assert parse_report_to(["all"]) == ["jsonl", "tensorboard", "wandb", "trackio"]
    with pytest.raises(ValueError, match="none reports nowhere else"):
        parse_report_to(["none", "jsonl"])
    with pytest.raises(ValueError) as error:
        parse_report_to(["tensorbord,jsonl"])
    assert str(error.value) == ("--report-to takes jsonl, tensorboard, wandb, trackio, all, "
                                "none; not tensorbord")
    # A missing package: the error names the extra to install; `all` just leaves it out.
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingExtra) as missing:
        parse_report_to(["jsonl", "wandb"])
    assert missing.value.extra == "wandb" and "pip install 'orchard[wandb]'" in str(missing.value)
    assert parse_report_to(["all"]) == ["jsonl", "tensorboard", "trackio"]


def test_jsonl(reported: Path) -> None:
    lines = [json.loads(line) for line in (reported / "run/metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 0, "sft/loss": 2.0, "sft/lr": 1e-3}
    assert lines[4] == {"step": 1, "rl/approx_kl": 0.02, "rl/resolved_rate": 0.5,
                        "rl/first_epoch/approx_kl": 0.0}
    assert len(lines) == 5


def test_tensorboard(reported: Path) -> None:
    charts = tensorboard_scalars(reported / "run/tensorboard")
    assert charts["sft/loss"] == [(0, 2.0), (1, 1.5), (2, 0.5)]
    assert charts["rl/approx_kl"] == [(0, pytest.approx(0.01)), (1, pytest.approx(0.02))]
    assert set(charts) == {"sft/loss", "sft/lr", "rl/approx_kl", "rl/resolved_rate",
                           "rl/first_epoch/approx_kl"}


def test_wandb_offline(reported: Path) -> None:
    [path] = (reported / "run/wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(path)
    rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
             for item in r.history.item} for r in records if r.WhichOneof("record_type")
            == "history"]
    # Each recipe counts its own steps: W&B charts each section on its own step axis.
    assert [(r["sft/step"], r["sft/loss"]) for r in rows if "sft/loss" in r] == [
        (0, 2.0), (1, 1.5), (2, 0.5)]
    assert [(r["rl/step"], r["rl/resolved_rate"]) for r in rows if "rl/step" in r] == [
        (0, 0.25), (1, 0.5)]
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.display_name == "test-run"
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["lr"] == 0.001 and config["model"] == "tiny"


def test_trackio_local(reported: Path) -> None:
    with sqlite3.connect(reported / "trackio/orchard.db") as db:
        rows = db.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id").fetchall()
        [config] = db.execute("SELECT config FROM configs WHERE run_name = 'test-run'")
    points = [(step, json.loads(metrics)) for name, step, metrics in rows]
    assert {name for name, _, _ in rows} == {"test-run"}
    assert [(s, m["sft/loss"]) for s, m in points if "sft/loss" in m] == [
        (0, 2.0), (1, 1.5), (2, 0.5)]
    assert [(s, m["rl/approx_kl"]) for s, m in points if "rl/approx_kl" in m] == [
        (0, 0.01), (1, 0.02)]
    assert json.loads(config[0])["lr"] == 0.001


class _Server:
    version = 0

    def update(self, model: torch.nn.Module) -> int:
        self.version += 1
        return self.version


def test_train_loop_keeps_its_log_and_reports_each_step(tmp_path: Path) -> None:
    class Collect:
        def __init__(self) -> None:
            self.points: list[tuple[int, dict[str, Any]]] = []

        def log(self, metrics: dict[str, Any], step: int) -> None:
            self.points.append((step, dict(metrics)))

        def close(self) -> None:
            pass

    report = Collect()
    history = train_loop(torch.nn.Linear(1, 1), _Server(), 2,
                         sample=lambda step: ([step + 1], {"groups": 1, "modes": ["x"]}),
                         update=lambda data: {"loss": float(data[0])}, log=tmp_path / "rl.jsonl",
                         report=section(report, "rl"))
    # The log is each record whole, one JSON line each, as before there were reporters.
    assert (tmp_path / "rl.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in history)
    assert [step for step, _ in report.points] == [0, 1]
    assert report.points[1][1]["rl/loss"] == 2.0 and report.points[1][1]["rl/groups"] == 1.0
    assert "rl/modes" not in report.points[1][1] and "rl/step" not in report.points[1][1]


def test_sft_cli_reports_to_tensorboard(tmp_path: Path) -> None:
    """`python -m orchard.recipes.distributed --report-to tensorboard`: SFT of the tiny Llama,
    one process; TensorBoard holds each step's loss, the same as the run's own record."""
    write_sft_inputs(tmp_path, 8)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "orchard.recipes.distributed", "--examples",
         str(tmp_path / "sft.jsonl"), "--model", str(tmp_path / "model"), "--out", str(out),
         "--lr", "3e-3", "--epochs", "3", "--batch-size", "4", "--report-to", "tensorboard"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=offline_env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    history = json.loads((out / "rank-0.json").read_text())["history"]
    charts = tensorboard_scalars(out / "tensorboard")
    assert len(history) == 6
    assert charts["sft/loss"] == [(m["step"], pytest.approx(m["loss"])) for m in history]
    assert {"sft/lr", "sft/grad_norm", "sft/tokens_per_s"} <= set(charts)
    assert not (out / "metrics.jsonl").exists()  # asked for TensorBoard only

    wrong = subprocess.run([sys.executable, "-m", "orchard.recipes.distributed", "--examples",
                            "x", "--model", "x", "--out", "x", "--report-to", "tensorbord"],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert wrong.returncode == 2 and "not tensorbord" in wrong.stderr


def test_demo_cli_checks_report_to_first(tmp_path: Path) -> None:
    assert demo_config("swe", report_to=["tensorboard,wandb"]).report_to == [
        "tensorboard", "wandb"]
    assert demo_config("swe").report_to == ["jsonl"]
    # Before the orchestrator starts or a model loads.
    out = CliRunner().invoke(cli_app, ["demo", "--out", str(tmp_path / "run"),
                                       "--report-to", "jsonl", "--report-to", "mlflow"])
    assert out.exit_code == 2 and "not mlflow" in out.output, out.output
    assert all(choice in out.output for choice in CHOICES)


def test_demo_summary_links_its_artifacts(tmp_path: Path) -> None:
    for run in ("teacher", "eval-base", "eval-sft"):
        (tmp_path / run / "traces").mkdir(parents=True)
        (tmp_path / run / "rollouts.jsonl").write_text("")
    (tmp_path / "learning_curve.png").write_bytes(b"")
    results = {"stages": {"base": {}, "sft": {}},
               "reporting": {"tensorboard": str(tmp_path / "tensorboard")}}
    lines = artifacts(tmp_path, results)
    assert lines == [
        f"results table: {tmp_path}/results.json",
        f"chart: {tmp_path}/learning_curve.png",
        f"tensorboard: {tmp_path}/tensorboard (tensorboard --logdir {tmp_path}/tensorboard)",
        "rollouts in the console (after `orchard serve`):",
        f"  teacher: http://127.0.0.1:8000/ui/runs?path={tmp_path}/teacher",
        f"  eval-base: http://127.0.0.1:8000/ui/runs?path={tmp_path}/eval-base",
        f"  eval-sft: http://127.0.0.1:8000/ui/runs?path={tmp_path}/eval-sft"]


@needs_root
def test_demo_reports_every_stage(orchestrator: str, tmp_path: Path) -> None:
    """The demo, small, with --report-to's TensorBoard: SFT, RL, each held-out evaluation and
    the value model each have their charts."""
    from orchard.domains import run_demo
    from orchard.env.client import SandboxClient
    from orchard.recipes.bar import BARConfig
    from orchard.recipes.demo import DemoConfig
    from orchard.recipes.rl import RLConfig
    from orchard.recipes.sft import SFTConfig

    config = DemoConfig(
        n_train=6, n_test=2, mc_max=1, mc_k=1, eval_n=1, tiny_hidden=64,
        sft=SFTConfig(epochs=1, batch_size=4, warmup=1),
        rl=RLConfig(steps=1, batch_prompts=1, bar=BARConfig(n=2, n_max=2, stride=2)),
        report_to=["jsonl", "tensorboard"])
    with SandboxClient(orchestrator) as client:
        results = run_demo(tmp_path, config, client=client, log=lambda _: None)
    assert results["reporting"] == {"jsonl": str(tmp_path / "metrics.jsonl"),
                                    "tensorboard": str(tmp_path / "tensorboard")}
    charts = tensorboard_scalars(tmp_path / "tensorboard")
    assert [v for _, v in charts["eval/resolved_rate"]] == [
        pytest.approx(results["stages"][s]["resolved_rate"]) for s in ("base", "sft", "sft_rl")]
    sft = [v for _, v in charts["sft/loss"]]
    assert len(sft) == results["sft"]["steps"]
    assert (sft[0], sft[-1]) == (pytest.approx(results["sft"]["first_loss"]),
                                 pytest.approx(results["sft"]["last_loss"]))
    assert charts["rl/resolved_rate"] == [(0, pytest.approx(results["rl"][0]["resolved_rate"]))]
    assert [v for _, v in charts["value/loss"]] == pytest.approx(
        results["rerank"]["train"]["epoch_loss"])
    assert charts["rerank/oracle"] == [(0, pytest.approx(results["rerank"]["oracle"]))]
    # The JSON lines hold the same points.
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["eval/resolved_rate"] for x in lines if "eval/resolved_rate" in x] == [
        v for _, v in charts["eval/resolved_rate"]]
