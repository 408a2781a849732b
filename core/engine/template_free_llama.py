"""The `Llama` Hearthside constructs: llama-cpp-python never compiles the file's chat templates.

`Llama.__init__` reads the model's metadata and compiles every `tokenizer.chat_template*` text
in it with its own Jinja environment, whether or not its chat handlers are ever used (Hearthside
renders prompts itself, `templates.py`). That compile has no bound: Jinja folds constant
expressions while compiling, so `{{ 'a'|center(4000000) }}` repeated builds gigabytes before
the constructor returns; one file drove the `models add` check to 17.5 GB and the kernel's OOM
killer (issue 36). The constructor assigns `self.metadata` once and only then looks for
templates, so intercepting that one assignment (as tensor_overrides.py does for the model
params) keeps the templates from it; Hearthside reads the template from the file itself
(`gguf_validator`) and compiles it in its capped sandbox (`chat_template_for`).
"""

from __future__ import annotations

import llama_cpp

from hearthside.core.engine.templates import ChatTemplate

CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


class TemplateFreeLlama(llama_cpp.Llama):
    """A `Llama` whose `metadata` holds no chat template, so its constructor compiles none."""

    @property
    def metadata(self) -> dict[str, str]:
        return self._metadata_without_templates

    @metadata.setter
    def metadata(self, values: dict[str, str]) -> None:
        self._metadata_without_templates = {
            key: value for key, value in values.items() if not is_chat_template_key(key)
        }


def is_chat_template_key(key: str) -> bool:
    """The default template's key and named ones (`tokenizer.chat_template.tool_use`)."""
    return key == CHAT_TEMPLATE_KEY or key.startswith(CHAT_TEMPLATE_KEY + ".")


def special_token_texts(llama: llama_cpp.Llama) -> tuple[str, str]:
    """The text of the model's BOS and EOS tokens ("" where it has none), for its template."""
    bos, eos = llama.token_bos(), llama.token_eos()
    model = llama._model
    return (
        model.token_get_text(bos) if bos >= 0 else "",
        model.token_get_text(eos) if eos >= 0 else "",
    )


def chat_template_for(llama: llama_cpp.Llama, source: str | None) -> ChatTemplate:
    """Hearthside's capped template for a loaded model; `source` is the file's template text."""
    bos, eos = special_token_texts(llama)
    return ChatTemplate(source, bos_token=bos, eos_token=eos)
