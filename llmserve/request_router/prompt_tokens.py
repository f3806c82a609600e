"""The token ids an engine will prefill for a request, computed at the router for cache-aware
routing: the model's own tokenizer (`tokenizers`, Rust, no torch) and chat template (jinja2, set
up as transformers sets it up for `apply_chat_template`), with vLLM's defaults (a chat prompt is
encoded without special tokens, a completion prompt with them, text parts joined by newlines).

Routing only needs the tokens to match where the prompt's start matches: a request this module
renders differently from vLLM (tools with defaults vLLM fills in, templates that read the clock)
misses the cache index and is routed by load, never wrongly answered. Requests it cannot render
(images, `continue_final_message`, several prompts) give None.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from llmserve.protocol.replica_call import CHAT_PATH, COMPLETIONS_PATH


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "\n".join(p["text"] for p in content)
    return None


class PromptTokens:
    """One model's tokenizer and chat template, read from its folder (tokenizer.json,
    tokenizer_config.json, chat_template.jinja) or given as the server's `chat_template`."""

    def __init__(self, model_dir: str | Path, chat_template: str | None = None) -> None:
        folder = Path(model_dir)
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template = chat_template
        if template is not None and Path(template).is_file():
            template = Path(template).read_text()
        if template is None and (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text()
        if template is None:
            template = config.get("chat_template")
        self._template = _environment().from_string(template) if template else None
        self._special = {
            k: (v["content"] if isinstance(v, dict) else v)
            for k, v in config.items()
            if k.endswith("_token") and isinstance(v, (str, dict))
        }

    def token_ids(self, path: str, body: dict[str, Any]) -> list[int] | None:
        if path == CHAT_PATH:
            return self._chat(body)
        if path == COMPLETIONS_PATH:
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                add = body.get("add_special_tokens", True) is not False
                return self._tokenizer.encode(prompt, add_special_tokens=add).ids
            if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                return prompt
        return None

    def _chat(self, body: dict[str, Any]) -> list[int] | None:
        messages = body.get("messages")
        if self._template is None or not isinstance(messages, list) or not messages:
            return None
        if body.get("continue_final_message"):
            return None
        conversation = []
        for m in messages:
            if not isinstance(m, dict):
                return None
            text = _text(m.get("content", ""))
            if text is None:
                return None
            conversation.append({**m, "content": text})
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            return None
        try:
            rendered = self._template.render(
                **self._special,
                **kwargs,
                messages=conversation,
                tools=body.get("tools"),
                documents=body.get("documents"),
                add_generation_prompt=body.get("add_generation_prompt", True) is not False,
            )
        except Exception:  # a template that refuses this conversation: vLLM will say why
            return None
        add = body.get("add_special_tokens", False) is True
        return self._tokenizer.encode(rendered, add_special_tokens=add).ids
