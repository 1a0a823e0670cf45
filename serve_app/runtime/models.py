"""A served model from its config, without Ray: the one place that assembles one.

The Ray ingress passes a deployment handle as the token source, the in-process server an
engine backend (`serve_app.engines.make_backend`), the tests either.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from serve_app.config import ModelConfig
from serve_app.core.tokens import TokenSource
from serve_app.families.harmony import HarmonyModel
from serve_app.runtime.images import ImageReader
from serve_app.runtime.turn import ModelFamily, ServedModel, Unavailable
from serve_app.tools.egress import Resolver


def model_family(model: ModelConfig) -> ModelFamily:
    """Prompt rendering and completion parsing for a configured model."""
    if model.family == "harmony":
        return HarmonyModel(prompt_cache_tokens=model.prompt_cache_tokens)
    from serve_app.families.chat_template import ChatTemplateModel
    from serve_app.families.smollm2 import load_tokenizer

    settings = model.chat_template
    assert settings is not None  # the config fills it in for this family
    tokenizer = load_tokenizer(model.tokenizer)
    if model.vision is not None:  # Qwen-VL's tokenizers have them; a replay's text tokenizer gets them
        from serve_app.families.vision import with_vision_tokens

        tokenizer = with_vision_tokens(tokenizer)
    return ChatTemplateModel(
        tokenizer,
        template=settings.template,
        reasoning_parser=settings.reasoning_parser,
        tool_parser=settings.tool_parser,
        template_kwargs=settings.template_kwargs,
        prompt_cache_tokens=model.prompt_cache_tokens,
        vision=model.vision.spec() if model.vision is not None else None,
    )


def image_reader(model: ModelConfig, resolver: Resolver | None = None) -> ImageReader | None:
    """How a vision model reads images (None: a text-only model). `resolver`: tests'."""
    vision = model.vision
    if vision is None:
        return None
    return ImageReader.create(
        vision.spec(),
        fetch_timeout_s=vision.fetch_timeout_s,
        max_redirects=vision.max_redirects,
        decode_timeout_s=vision.decode_timeout_s,
        allow_hosts=vision.allow_hosts,
        resolver=resolver,
    )


def served_model(
    model: ModelConfig,
    source: TokenSource,
    *,
    unavailable: Callable[[str], Awaitable[Unavailable | None]] | None = None,
    resolver: Resolver | None = None,
) -> ServedModel:
    """`model` served from `source`; `unavailable`: why it cannot take requests now, or None;
    `resolver`: host names to addresses for image URLs (tests; default: the machine's)."""
    return ServedModel(
        model.name,
        source,
        model.max_model_len,
        model_family(model),
        unavailable=unavailable,
        tiered=model.tiered,
        raw_prompts=model.raw_prompts,
        images=image_reader(model, resolver),
    )
