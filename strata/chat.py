"""Chat templates (`tokenizer.chat_template`, jinja2) rendered the way Hugging Face transformers renders them.

Environment as in transformers' `_compile_jinja_template`: an immutable sandbox, `trim_blocks` and
`lstrip_blocks`, the loop-control extension, a `{% generation %}` block that just renders its body, the
globals `raise_exception(msg)` and `strftime_now(fmt)`, and a `tojson` filter that is plain `json.dumps`
(non-ASCII kept, no HTML escaping, optional indent). Variables: `messages`, `add_generation_prompt`,
`bos_token`, `eos_token` and any extra keyword (`tools`, `enable_thinking`, ...).

Without a template (a GGUF lacking `tokenizer.chat_template`) we use ChatML, as llama.cpp's
`llama_chat_apply_template` does when it is given none.

A template that writes `bos_token` itself (Mixtral's) plus a vocabulary that adds BOS (SentencePiece) gives
two BOS tokens; llama.cpp's chat code drops the template's leading BOS text before tokenizing, so callers
that want its prompts should do the same (or encode with add_special=False).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML as Qwen uses it (our wording of the well-known format), also the fallback.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Mixtral-Instruct's format: BOS, then "[INST] user [/INST]" and "assistant</s>" turns, strictly alternating.
MIXTRAL_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}"
    "{% endfor %}"
)
FALLBACK_TEMPLATE = CHATML_TEMPLATE


class ChatTemplateError(ValueError):
    """A chat template that does not compile, or fails (or raises) while rendering."""


class _TemplateException(Exception):
    pass


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message):
    raise _TemplateException(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str
    compiled: jinja2.Template = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        try:
            t = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template does not compile (line {e.lineno}): {e.message}") from e
        object.__setattr__(self, "compiled", t)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, bos_token: str = "",
               eos_token: str = "", **extra) -> str:
        try:
            return self.compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=bos_token, eos_token=eos_token, **extra)
        except _TemplateException as e:
            raise ChatTemplateError(f"chat template raised: {e}") from e
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError, ValueError) as e:
            raise ChatTemplateError(f"chat template failed while rendering: {type(e).__name__}: {e}") from e


def render(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", **extra) -> str:
    """Render `messages` with `template` (jinja2 source); None or "" renders the ChatML fallback."""
    return ChatTemplate(template or FALLBACK_TEMPLATE).render(
        messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token,
        **extra
    )
