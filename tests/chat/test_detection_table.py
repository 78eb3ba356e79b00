"""Which call format kvserve's detection picks for each template llama.cpp ships
(models/templates/, copied to tests/chat/templates/): a table, so that a change of
detection shows here. "generic" is the JSON envelope of chat/formats.py, for the
templates whose own syntax kvserve does not speak yet (docs/tools.md, "Call formats")."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat.formats import detect_format

TEMPLATES = Path(__file__).parent / "templates"

EXPECTED = {
    "Apertus-8B-Instruct.jinja": "apertus",
    "Apriel-1.6-15b-Thinker-fixed.jinja": "apriel-1.6",
    "Bielik-11B-v3.0-Instruct.jinja": "hermes",
    "ByteDance-Seed-OSS.jinja": "seed-oss",
    "Cohere2MoE.jinja": "cohere2-moe",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "command-r-plus",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command-r7b",
    "GLM-4.6.jinja": "glm-4.5",
    "GLM-4.7-Flash.jinja": "glm-4.7",
    "GigaChat3-10B-A1.8B.jinja": "gigachat3",
    "GigaChat3.1-10B-A1.8B.jinja": "gigachat3.1",
    "HuggingFaceTB-SmolLM3-3B.jinja": "generic",
    "Kimi-K2-Instruct.jinja": "kimi-k2",
    "Kimi-K2-Thinking.jinja": "kimi-k2",
    "Kimi-K3.jinja": "kimi-k3",
    "LFM2-8B-A1B.jinja": "lfm2",
    "LFM2.5-8B-A1B.jinja": "lfm2.5",
    "LFM2.5-Instruct.jinja": "lfm2.5",
    "MiMo-VL.jinja": "hermes",
    "MiniMax-M1.jinja": "minimax-m1",
    "MiniMax-M2.jinja": "minimax-m2",
    "MiniMax-M3.jinja": "minimax-m3",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral-small-3.2",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3-xml",
    "NVIDIA-Nemotron-Nano-v2.jinja": "nemotron-v2",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen-QwQ-32B.jinja": "hermes",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3-coder",
    "Qwen3.5-4B.jinja": "qwen3-xml",
    "Reka-Edge.jinja": "hermes",
    "Spark2.5.jinja": "glm-4.7",
    "StepFun3.5-Flash.jinja": "qwen3-xml",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "generic",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek-r1",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek-v3.1",
    "deepseek-ai-DeepSeek-V3.2.jinja": "deepseek-v3.2",
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "deepseek-v4",
    "deepseek-ai-DeepSeek-V4.jinja": "deepseek-v4",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction-v2",
    "google-gemma-2-2b-it.jinja": "generic",
    "google-gemma-4-31B-it-interleaved.jinja": "gemma4",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "ibm-granite-granite-4.0.jinja": "hermes",
    "ibm-granite-granite-4.1.jinja": "hermes",
    "inclusionai-ling-3.0-flash.jinja": "glm-4.5",
    "llama-cpp-deepseek-r1.jinja": "deepseek-r1",
    "llama-cpp-rwkv-world.jinja": "generic",
    "meetkai-functionary-medium-v3.1.jinja": "llama3",
    "meetkai-functionary-medium-v3.2.jinja": "functionary-v3.2",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3.2",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3",
    "microsoft-Phi-3.5-mini-instruct.jinja": "generic",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "ministral-3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "moonshotai-Kimi-K2.jinja": "kimi-k2",
    "muse-glimmer.jinja": "muse-glimmer",
    "openai-gpt-oss-120b.jinja": "harmony",
    "openbmb-MiniCPM5-1B.jinja": "minicpm5",
    "poolside-Laguna-S-2.1.jinja": "glm-4.7",
    "poolside-Laguna-XS-2.1.jinja": "glm-4.5",
    "poolside-Laguna-XS.2.jinja": "glm-4.5",
    "tencent-Hy3.jinja": "hy3",
    "unsloth-Apriel-1.5.jinja": "hermes",
    "unsloth-mistral-Devstral-Small-2507.jinja": "ministral-3",
    "upstage-Solar-Open-100B.jinja": "solar-open",
}


def test_the_table_covers_every_template() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in TEMPLATES.glob("*.jinja"))


@pytest.mark.parametrize(("name", "fmt"), EXPECTED.items())
def test_detected_format(name: str, fmt: str) -> None:
    assert detect_format((TEMPLATES / name).read_text()).name == fmt
