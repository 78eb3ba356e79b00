"""Drives random grammars through the real engine: tool grammars (lazy and forced) of
random templates and tool sets, JSON schemas, raw GBNF (plain and lazy), at random
sampling settings and seeds. Run as a program (`python -m tests.integration.grammar_fuzz
SEED CASES`) so that a process killed by llama.cpp fails the calling test instead of
killing pytest; prints `SURVIVED <cases>` at the end.

Templates: llama.cpp's models/templates/ from an extracted llama-cpp-python sdist when
KVSERVE_TEMPLATES_DIR names one, else the copies in tests/chat/templates/.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from chat import ChatOptions, ChatTemplate, ToolChoice, plan_chat
from chat.tools import Tool
from engine.engine import Engine
from engine.types import FinishReason, GenerateRequest, InvalidRequestError, SamplingParams
from server.serving.prepare import grammar_fields
from tests.integration.test_engine import start

TEMPLATE_NAMES = (
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "google-gemma-2-2b-it.jinja",
    None,  # the model's own template
)
TOOLS = (
    Tool("get_weather", "Weather of a city", {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    Tool("add", "", {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
    Tool("search", "Search the web", {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 40},
        "limit": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["query"]}),
    Tool("now", "The time", {}),
    Tool("pick", "Pick", {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}}),
)  # fmt: skip
QUESTIONS = (
    "What is the weather in Paris and in Oslo?",
    "Add 2 and 40, then search for cats.",
    "Hello! Who are you?",
    "What time is it? Answer in JSON.",
    "Write a haiku about the sea.",
)
SCHEMAS = (
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "number"}}},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "string", "pattern": "^[a-z]{2,6}$"},
)
RAW = (
    'root ::= "yes" | "no"',
    'root ::= ""',
    "root ::= [a-z]+",
    'root ::= "a"{0,3}',
    'root ::= "é" | "日本" | "🙂"',
    'root ::= [^\\n]{1,20} "\\n"',
    'root ::= "{" ws "}"\nws ::= [ \\n]*',
    'root ::= ("x" | "y")* "."',
)


def templates_dir() -> Path:
    sdist = os.environ.get("KVSERVE_TEMPLATES_DIR")
    if sdist and Path(sdist).is_dir():
        return Path(sdist)
    return Path(__file__).parent.parent / "chat" / "templates"


def sampling(rng: random.Random, **grammar: Any) -> SamplingParams:
    kw: dict[str, Any] = {"seed": rng.randrange(2**32)}
    kind = rng.random()
    if kind < 0.2:
        kw["temperature"] = 0.0
    elif kind < 0.8:
        kw["temperature"] = rng.choice((0.7, 1.0, 1.0, 1.5, 2.5))
        kw["top_k"] = rng.choice((0, 1, 40, 1000))
        kw["top_p"] = rng.choice((1.0, 0.9, 0.3))
        kw["min_p"] = rng.choice((0.0, 0.05, 0.5))
    else:
        kw["mirostat"] = rng.choice((1, 2))
    kw["ignore_eos"] = rng.random() < 0.15  # the grammar completes, EOG is banned
    if rng.random() < 0.1:
        kw["repeat_penalty"] = 1.5
    return SamplingParams(**kw, **grammar)


def chat_case(engine: Engine, rng: random.Random, root: Path) -> GenerateRequest:
    name = rng.choice(TEMPLATE_NAMES)
    source = (root / name).read_text() if name else engine.info.chat_template
    template = ChatTemplate(source, bos_token="", eos_token="", add_bos=False)
    tools = tuple(rng.sample(TOOLS, rng.randint(1, len(TOOLS))))
    mode = rng.choice(("auto", "auto", "auto", "required", "named"))
    choice = ToolChoice(mode, rng.choice(tools).name if mode == "named" else None)
    opts = ChatOptions(tools=tools, tool_choice=choice, parallel_tool_calls=rng.random() < 0.7)
    messages: list[dict[str, Any]] = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    if rng.random() < 0.5:
        messages.insert(0, {"role": "system", "content": "You are helpful."})
    plan = plan_chat(template, messages, opts)
    prompt = engine.tokenize(plan.prompt.text, add_special=plan.prompt.add_bos, parse_special=True)
    return request(prompt, sampling(rng, **grammar_fields(plan.grammar)), rng)


def grammar_case(engine: Engine, rng: random.Random) -> GenerateRequest:
    prompt = engine.tokenize(
        f"<|im_start|>user\n{rng.choice(QUESTIONS)}<|im_end|>\n<|im_start|>assistant\n",
        add_special=False,
        parse_special=True,
    )
    if rng.random() < 0.5:
        from chat.schema import schema_to_gbnf

        return request(prompt, sampling(rng, grammar=schema_to_gbnf(rng.choice(SCHEMAS))), rng)
    gbnf = rng.choice(RAW)
    if rng.random() < 0.5:
        return request(prompt, sampling(rng, grammar=gbnf), rng)
    word = rng.choice(("the", "I", ",", "\n", " a", "zzz"))
    patterns = (r"[\s\S]*?(" + json.dumps(word)[1:-1].replace("\\n", "\n") + r")[\s\S]*",)
    tokens = tuple(rng.sample(range(engine.info.n_vocab), 2)) if rng.random() < 0.3 else ()
    lazy = {"grammar": gbnf, "grammar_lazy": True, "grammar_trigger_patterns": patterns,
            "grammar_trigger_tokens": tokens}  # fmt: skip
    return request(prompt, sampling(rng, **lazy), rng)


def request(prompt: list[int], params: SamplingParams, rng: random.Random) -> GenerateRequest:
    return GenerateRequest(
        uuid.uuid4().hex, tuple(prompt), sampling=params, max_tokens=rng.choice((8, 16, 32))
    )


async def drive(engine: Engine, req: GenerateRequest) -> FinishReason | None:
    reason = None
    started = time.monotonic()
    try:
        async for _, out in await engine.generate([req]):
            if out.finish_reason is not None:
                reason = out.finish_reason
    except InvalidRequestError:
        return None
    if os.environ.get("KVSERVE_FUZZ_VERBOSE"):
        p = req.sampling
        print(f"{time.monotonic() - started:6.1f}s {reason} lazy={p.grammar_lazy} "
              f"t={p.temperature} eos={p.ignore_eos} {p.grammar_trigger_patterns}", flush=True)  # fmt: skip
    return reason


def issue_case(engine: Engine, root: Path, seed: int) -> GenerateRequest:
    """Issue 10's report: a Llama 3.x template, tools, tool_choice auto, default
    sampling; with the grammar accepting blindly, seed 0 already killed the process."""
    source = (root / "meta-llama-Llama-3.3-70B-Instruct.jinja").read_text()
    template = ChatTemplate(source, bos_token="", eos_token="", add_bos=False)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    plan = plan_chat(template, messages, ChatOptions(tools=TOOLS[:1]))
    prompt = engine.tokenize(plan.prompt.text, add_special=False, parse_special=True)
    params = SamplingParams(seed=seed, **grammar_fields(plan.grammar))  # type: ignore[arg-type]
    return GenerateRequest(uuid.uuid4().hex, tuple(prompt), sampling=params, max_tokens=96)


async def main(seed: int, cases: int, mode: str = "random") -> None:
    rng = random.Random(seed)
    root = templates_dir()
    engine = await start(n_seq_max=4, n_threads=1)
    try:
        reqs = []
        for i in range(cases):
            if mode == "issue":
                reqs.append(issue_case(engine, root, seed + i))
            elif rng.random() < 0.65:
                reqs.append(chat_case(engine, rng, root))
            else:
                reqs.append(grammar_case(engine, rng))
        reasons = await asyncio.gather(*(drive(engine, r) for r in reqs))
        if os.environ.get("KVSERVE_FUZZ_VERBOSE"):
            print(reasons, flush=True)
        assert FinishReason.ERROR not in reasons, reasons
        # The engine is still whole: a plain request after all of that.
        after = await drive(engine, grammar_case(engine, rng))
        assert after is not FinishReason.ERROR
    finally:
        engine.close()
    print(f"SURVIVED {cases}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:4]))
