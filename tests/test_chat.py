"""strata.chat: templates rendered like transformers' `apply_chat_template`, outputs written out by hand."""

import datetime

import pytest

from strata.chat import CHATML_TEMPLATE, MIXTRAL_TEMPLATE, ChatTemplate, ChatTemplateError, render

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]


def test_chatml():
    assert render(CHATML_TEMPLATE, CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert render(CHATML_TEMPLATE, CHAT[:2], add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_fallback_is_chatml():
    assert render(None, CHAT) == render(CHATML_TEMPLATE, CHAT) == render("", CHAT)


def test_mixtral():
    out = render(MIXTRAL_TEMPLATE, CHAT[1:], bos_token="<s>", eos_token="</s>")
    assert out == "<s>[INST] Hi [/INST]Hello!</s>[INST] 2+2? [/INST]"
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render(MIXTRAL_TEMPLATE, CHAT, bos_token="<s>", eos_token="</s>")   # a system turn first


def test_trim_and_lstrip_blocks():
    # trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one
    src = ("{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n"
           "{% endfor %}")
    assert render(src, CHAT) == "U:Hi\nU:2+2?\n"


def test_hf_globals_and_filters():
    src = ("{{ tools | tojson }}|{{ tools | tojson(indent=1) }}|{% for m in messages %}"
           "{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|"
           "{% generation %}{{ enable_thinking }}{% endgeneration %}"
           "|{{ strftime_now('%Y') }}")
    out = render(src, CHAT, tools=[{"name": "f", "desc": "é<&>"}], enable_thinking=False)
    year = datetime.datetime.now().strftime("%Y")   # the template reads the clock itself
    assert out == ('[{"name": "f", "desc": "é<&>"}]|[\n {\n  "name": "f",\n  "desc": "é<&>"\n }\n]|system'
                   f"|False|{year}")


def test_errors_are_clear():
    with pytest.raises(ChatTemplateError, match=r"does not compile \(line 1\)"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="raised: nope"):
        render("{{ raise_exception('nope') }}", CHAT)
    with pytest.raises(ChatTemplateError, match="SecurityError|unsafe"):
        render("{{ messages.append(1) }}", CHAT)   # the sandbox is immutable
    with pytest.raises(ChatTemplateError, match="failed while rendering"):
        render("{{ messages[0].content + 1 }}", CHAT)
