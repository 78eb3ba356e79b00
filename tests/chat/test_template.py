from __future__ import annotations

import pytest

from chat.template import CHATML, ChatTemplate, TemplateError

SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make(source: str | None, **kw: object) -> ChatTemplate:
    return ChatTemplate(
        source,
        bos_token=kw.get("bos", "<s>"),
        eos_token="</s>",
        add_bos=bool(kw.get("add_bos", True)),
    )  # type: ignore[arg-type]


def test_default_model_template_renders() -> None:
    out = make(SMOL, add_bos=False).render([{"role": "user", "content": "Hi"}])
    assert out.text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out.add_bos is False


def test_missing_template_falls_back_to_chatml() -> None:
    assert make(None).source == CHATML


def test_bos_written_by_the_template_is_not_added_again() -> None:
    t = make("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    out = t.render([{"role": "user", "content": "x"}])
    assert out.text == "<s>x" and out.add_bos is False
    t = make("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert t.render([{"role": "user", "content": "x"}]).add_bos is True


def test_raise_exception_becomes_template_error() -> None:
    t = make("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        t.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "hostile",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_sandbox_blocks_escapes(hostile: str) -> None:
    with pytest.raises(TemplateError):
        make(hostile).render([{"role": "user", "content": "x"}])


def test_template_that_does_not_compile() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        make("{% for %}")
