"""Models that are not loaded, as Ollama's routes see them: /api/ps says when a model
goes (its keep_alive included), /api/show loads nothing (a never-loaded model's facts
come from its GGUF header), a route's model dependency loads nothing for a body the
route refuses, and /api/tags reads each file once however many ask at once."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from engine.client import EngineNotReadyError, EngineState, ModelInfo
from server.api.ollama import models as ollama_models
from server.app import create_app
from server.config.tree import ModelSection, Settings, default_model_path
from server.models.gguf_header import GgufError, read_header
from tests.fakes import FakeEngine

MODEL = "fake-model"
THINKING = "{% for m in messages %}<think>{{ m.content }}</think>{% endfor %}"


class NeverLoaded(FakeEngine):
    """A real engine's facts: none until its first load; loads are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.state = EngineState.UNLOADED
        self.num_starts = 0
        self.loaded_once = False

    @property
    def info(self) -> ModelInfo:
        if not self.loaded_once:
            raise EngineNotReadyError("the model is not loaded")
        return self._info

    def start(self) -> None:
        self.num_starts += 1
        self.loaded_once = True
        super().start()


def write_gguf(path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("general.file_type", 7)  # Q8_0
    writer.add_string("general.license", "mit")
    writer.add_context_length(2048)
    writer.add_embedding_length(64)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("general.flag", True)
    writer.add_chat_template(THINKING)
    writer.add_token_list(["<s>", "a", "b"])  # an array of strings: stepped over
    writer.add_array("general.tags", [1, 2, 3])
    for part, token in (("pre", 1), ("suf", 2), ("mid", 0)):
        writer.add_uint32(f"tokenizer.ggml.fim_{part}_token_id", token)
    writer.add_tensor("a.weight", np.zeros((3, 4), dtype=np.float32))
    writer.add_tensor("b.weight", np.zeros((5,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, NeverLoaded, Any]]:
    path = write_gguf(tmp_path / "tiny.Q8_0.gguf")
    engine = NeverLoaded()
    settings = Settings(models=(ModelSection(id=MODEL, path=str(path), load="on_demand"),))
    app = create_app(settings, engines={MODEL: engine})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c, engine, app
    engine.close()


# -- the GGUF header ---------------------------------------------------------------------


def test_the_header_of_the_bundled_model_says_what_llama_cpp_does() -> None:
    header = read_header(default_model_path())
    meta = header.metadata
    # What the loaded model reports (tests/e2e/test_ollama_api.py::test_show).
    assert header.n_params == 134_515_008
    assert meta["general.architecture"] == "llama" and meta["general.file_type"] == "3"
    assert meta["llama.context_length"] == "8192"
    assert "<|im_start|>" in meta["tokenizer.chat_template"]
    assert "tokenizer.ggml.tokens" not in meta  # arrays are stepped over


def test_the_header_values_and_bad_files(tmp_path: Path) -> None:
    header = read_header(str(write_gguf(tmp_path / "t.gguf")))
    assert header.n_params == 3 * 4 + 5
    meta = header.metadata
    assert meta["general.file_type"] == "7" and meta["general.flag"] == "true"
    assert float(meta["llama.rope.freq_base"]) == 10000.0
    assert "general.tags" not in meta and meta["tokenizer.chat_template"] == THINKING
    for name, data in [("magic", b"GGML" + bytes(40)), ("short", b"GGUF\x03\x00\x00\x00\x01"),
                       ("v1", b"GGUF\x01\x00\x00\x00" + bytes(16))]:  # fmt: skip
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(data)
        with pytest.raises(GgufError):
            read_header(str(bad))
    whole = (tmp_path / "t.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:200])
    with pytest.raises(GgufError):
        read_header(str(tmp_path / "cut.gguf"))
    with pytest.raises(GgufError):
        read_header(str(tmp_path / "missing.gguf"))


# -- the routes --------------------------------------------------------------------------


async def test_show_reads_the_file_of_a_model_never_loaded(setup: Any) -> None:
    client, engine, _ = setup
    r = await client.post("/api/show", json={"model": MODEL})
    assert r.status_code == 200, r.text
    body = r.json()
    assert engine.num_starts == 0 and engine.state is EngineState.UNLOADED
    assert body["details"]["family"] == "llama" and body["details"]["quantization_level"] == "Q8_0"
    assert body["details"]["parameter_size"] == "17"
    assert body["model_info"]["llama.context_length"] == 2048
    assert body["model_info"]["general.parameter_count"] == 17
    assert not any(k.startswith("tokenizer.") for k in body["model_info"])
    assert body["template"] == THINKING and body["license"] == "mit"
    assert body["capabilities"] == ["completion", "tools", "thinking", "insert"]
    assert body["parameters"] == ""  # the context it will serve is the engine's, once loaded


async def test_show_of_an_unloaded_model_keeps_it_unloaded(setup: Any) -> None:
    client, engine, app = setup
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    assert (await client.post("/api/chat", json=chat)).status_code == 200  # loads it
    assert (await client.post(f"/v1/models/{MODEL}/unload")).status_code == 200
    r = await client.post("/api/show", json={"model": f"{MODEL}:latest"})
    assert r.status_code == 200, r.text
    assert engine.num_starts == 1 and engine.state is EngineState.UNLOADED
    # What it said when loaded: the context it serves.
    assert r.json()["parameters"].split() == ["num_ctx", "512"]


async def test_ps_expires_at_follows_keep_alive(setup: Any) -> None:
    client, _, app = setup
    body = {"model": MODEL, "keep_alive": "5m", "prompt": ""}
    assert (await client.post("/api/generate", json=body)).status_code == 200
    (model,) = (await client.get("/api/ps")).json()["models"]
    expires = dt.datetime.fromisoformat(model["expires_at"])
    left = (expires - dt.datetime.now(dt.UTC)).total_seconds()
    assert 290 < left <= 300, model["expires_at"]  # not Ollama's "forever"
    app.state.models.default.last_used = time.monotonic() - 60  # idle for a minute
    (model,) = (await client.get("/api/ps")).json()["models"]
    left = dt.datetime.fromisoformat(model["expires_at"]) - dt.datetime.now(dt.UTC)
    assert 230 < left.total_seconds() <= 240


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "temperature": "hot"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/completions", {"prompt": "x", "n": 0}),
        ("/v1/embeddings", {}),
        ("/api/chat", {"messages": [], "images": ["x"]}),
        ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}),
        ("/api/embed", {"input": 3}),
        ("/v1/cache/warm", {}),
    ],
)  # fmt: skip
async def test_nothing_loads_for_a_body_the_route_refuses(
    setup: Any, path: str, body: dict[str, Any]
) -> None:
    client, engine, _ = setup
    r = await client.post(path, json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert engine.num_starts == 0 and engine.state is EngineState.UNLOADED


async def test_tags_reads_a_file_once_for_concurrent_first_asks(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, _ = setup
    reads: list[str] = []
    real_sha256 = ollama_models._sha256
    lock = threading.Lock()

    def slow_sha256(path: str) -> str:
        with lock:
            reads.append(path)
        time.sleep(0.2)  # a multi-GB GGUF takes seconds
        return real_sha256(path)

    monkeypatch.setattr(ollama_models, "_sha256", slow_sha256)
    answers = await asyncio.gather(*(client.get("/api/tags") for _ in range(4)))
    digests = {r.json()["models"][0]["digest"] for r in answers}
    assert len(reads) == 1 and len(digests) == 1 and len(digests.pop()) == 64
    await client.get("/api/tags")
    assert len(reads) == 1  # remembered
