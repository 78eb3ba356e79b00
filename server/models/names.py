"""Which served model a request's name means, in each API's way of naming one.

OpenAI's and Anthropic's APIs name a configured id or alias exactly (`ModelRegistry.find`);
Ollama's clients write `name:tag`, lower case. The model gate resolves a name before any
route runs, so this lives beside the registry, not in an API's adapter.
"""

from __future__ import annotations

from server.models.served import ModelRegistry, ServedModel


def matching_names(models: ModelRegistry, name: str) -> list[str]:
    """The served names an Ollama name means. Tried in order: the name as it is (an id or
    alias, `smollm2:135m` included); without a `:latest` tag (`SmolLM2-135M-Instruct:latest`);
    with `:latest` added (`smollm2` for an alias `smollm2:latest`): the first that is a
    name. Else every name equal to one of those ignoring case (Ollama's names are lower
    case, Hugging Face's are not): more than one when only case tells them apart."""
    base = name.removesuffix(":latest")
    candidates = [name, base, f"{base}:latest"]
    for candidate in candidates:
        if models.find(candidate) is not None:  # a miss looks at a shared hub cache again
            return [candidate]
    folded = {c.lower() for c in candidates}
    return [n for n in models.names() if n.lower() in folded]


def resolve_ollama_model(models: ModelRegistry, name: str) -> ServedModel | None:
    """The served model an Ollama name means (`matching_names`' first), or None."""
    names = matching_names(models, name)
    return models.get(names[0]) if names else None
