"""bench/image_turns.py without a model or a server: the two turns' requests, each
server's stream read right (kvserve's usage, llama-server's timings), the report adds up
from given timings, and bench/compare.py's `start` hands the projector to both servers."""

from __future__ import annotations

import base64
import io
import json
import math
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import compare, image_turns
from bench.image_turns import (
    TurnTiming,
    read_stream,
    summarize,
    table,
    turn1_messages,
    turn2_messages,
)


def sse(*events: dict[str, Any]) -> list[str]:
    return [f"data: {json.dumps(e)}" for e in events] + ["data: [DONE]"]


def chunk(content: str = "", **delta: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content, **delta}}]}


def test_turn_2_carries_the_same_picture_then_the_reply_and_a_follow_up() -> None:
    first, second = turn1_messages(3), turn2_messages(3, "A red square.")
    assert second[0] == first[0] and second[1] == {"role": "assistant", "content": "A red square."}
    assert second[2]["role"] == "user" and len(second) == 3
    url = first[0]["content"][0]["image_url"]["url"]
    assert "Point 20:" in first[0]["content"][1]["text"]  # the question after the image
    assert "Point 3:" not in turn1_messages(3, points=2)[0]["content"][1]["text"]
    assert base64.b64decode(url.split(",", 1)[1]).startswith(b"\x89PNG")
    assert turn1_messages(4) != first  # another picture each round


def test_a_kvserve_stream_gives_ttft_text_and_cached_tokens_from_usage() -> None:
    lines = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},  # no token yet
        chunk("It"),
        chunk(" is red."),
        {"choices": [], "usage": {"prompt_tokens": 60,
                                  "prompt_tokens_details": {"cached_tokens": 48}}},
    )  # fmt: skip
    times = [10.5, 10.8, 10.9, 11.0, 11.0]
    got = read_stream(lines, 10.0, times)
    assert got.ttft_s == pytest.approx(0.8)  # the first token, not the role chunk
    assert (got.text, got.prompt_tokens, got.cached_tokens) == ("It is red.", 60, 48)


def test_a_llama_server_stream_gives_cached_tokens_from_timings() -> None:
    lines = sse(
        chunk("", reasoning_content="hm"),  # a thinking token counts as the first
        chunk("Blue."),
        {"choices": [], "usage": {"prompt_tokens": 61}, "timings": {"cache_n": 45}},
    )
    got = read_stream(lines, 0.0, [0.25, 0.5, 0.6, 0.6])
    assert got.ttft_s == pytest.approx(0.25)
    assert (got.text, got.prompt_tokens, got.cached_tokens) == ("Blue.", 61, 45)
    silent = read_stream(sse({"choices": [], "usage": {"prompt_tokens": 5}}), 0.0, [1.0, 1.0])
    assert math.isnan(silent.ttft_s) and silent.cached_tokens == -1


def test_the_report_takes_medians_of_the_answered_rounds() -> None:
    rounds = [
        (TurnTiming(1.0, 40, 0), TurnTiming(0.2, 60, 40)),
        (TurnTiming(3.0, 40, 0), TurnTiming(0.4, 60, 44)),
        (TurnTiming(2.0, 40, 0), TurnTiming(0.3, 60, 48)),
        (TurnTiming(9.0, 40, 0), TurnTiming(math.nan, 0, -1, error="500: boom")),  # left out
    ]
    row = summarize("kvserve", rounds)
    assert row["rounds"] == 3 and row["errors"] == 1 and row["first_error"] == "500: boom"
    assert row["ttft_turn1_s"] == 2.0 and row["ttft_turn2_s"] == 0.3
    assert row["ratio"] == pytest.approx(0.15)
    assert (row["cached_turn2"], row["prompt_turn2"]) == (44, 60)
    peer = summarize("llama-server", [(TurnTiming(1.0, 40, 0), TurnTiming(0.5, 60, -1))])
    assert peer["cached_turn2"] is None  # the server did not say
    lines = table([row, peer])
    assert lines[2] == "| kvserve | 3 | 2.000 s | 0.300 s | 0.15x | 44 / 60 | 1 |"
    assert lines[3] == "| llama-server | 1 | 1.000 s | 0.500 s | 0.50x | n/a / 60 | 0 |"
    empty = summarize("x", [])
    assert table([empty])[2] == "| x | 0 | n/a | n/a | n/a | n/a / n/a | 0 |"


class Started(Exception):
    pass


@pytest.mark.parametrize("name", ["kvserve", "llama-server"])
def test_start_hands_the_projector_to_both_servers(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    def popen(cmd: list[str], **kw: Any) -> Any:
        seen["cmd"], seen["env"] = cmd, kw["env"]
        raise Started

    monkeypatch.setattr(subprocess, "Popen", popen)
    # start() logs to /tmp/bench-NAME.log: never truncate a running benchmark's log
    monkeypatch.setattr(compare, "open", lambda *a, **k: io.StringIO(), raising=False)
    monkeypatch.setattr(compare, "bench_model", lambda: ("/m/model.gguf", "model"))
    peer = SimpleNamespace(path=tmp_path / "llama-server", description="test peer")
    monkeypatch.setattr(compare.llama_build, "peer_server", lambda: peer)
    with pytest.raises(Started):
        compare.start(name, 2, 1, mmproj="/p/mmproj.gguf")
    if name == "kvserve":
        assert seen["env"]["KVSERVE_MODEL_MMPROJ"] == "/p/mmproj.gguf"
    else:
        i = seen["cmd"].index("--mmproj")
        assert seen["cmd"][i + 1] == "/p/mmproj.gguf"
    with pytest.raises(ValueError, match="mmproj"):
        compare.start("llama_cpp.server", 2, 1, mmproj="/p/mmproj.gguf")


def test_main_runs_each_server_with_the_test_projector(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[str, str | None]] = []

    class Proc:
        def terminate(self) -> None:
            pass

        def wait(self, timeout: float) -> int:
            return 0

    def start(name: str, threads: int, parallel: int, **kw: Any) -> Any:
        started.append((name, kw.get("mmproj")))
        return Proc(), "http://x/v1", "model"

    def measure(label: str, *_: Any) -> dict[str, Any]:
        return summarize(label, [(TurnTiming(1.0, 40, 0), TurnTiming(0.1, 60, 40))])

    monkeypatch.setattr(image_turns, "start", start)
    monkeypatch.setattr(image_turns, "measure", measure)
    monkeypatch.setattr(image_turns, "projector_path", lambda: Path("/p/mmproj-test.gguf"))
    monkeypatch.setattr("sys.argv", ["image_turns", "--rounds", "1"])
    image_turns.main()
    assert started == [("kvserve", "/p/mmproj-test.gguf"), ("llama-server", "/p/mmproj-test.gguf")]
