"""Entry module of the ``vlm_judge`` reward: a vision-language model, served behind an OpenAI-compatible
``/chat/completions`` endpoint (vLLM, SGLang), judges each image against its prompt.

Why a client rather than an in-process model: a 7B judge (UnifiedReward, Qwen2.5-VL) wants its own GPU
and an inference server's batching; training only sends PNG images and reads the judge's answer. Two
score rules turn the answer into a number: ``number`` (the first number of the reply, normalised from
``[min_score, max_score]`` to ``[0, 1]``) and ``yes_probability`` (``P(yes) / (P(yes) + P(no))`` over the
first reply token's top logprobs). ``groupwise`` sends the images of one prompt in one request, so the
judge compares them. ``vqa`` asks one yes/no question per atom of the prompt's metadata (objects, counts,
colours, positions: GenEval2's Soft-TIFA) and averages P(yes); ``edit`` sends the source image and the
result with the edit instruction. No torch here: the client loads in the factory; docs/rewards.md has
the details.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from vgrpo_platform.hookspecs import hookimpl
from vgrpo_platform.registry import Component, PluginConfig

# The placeholders a template may use: {prompt}, {min_score}, {max_score} and (groupwise) {n}, the
# number of images in the request. Only these are replaced; other braces stay as written.
POINTWISE_NUMBER_TEMPLATE = (
    "You are judging an AI-generated image against the text prompt it was generated from.\n"
    'Prompt: "{prompt}"\n'
    "Rate how well the image matches the prompt and how good it looks, on a scale from {min_score} "
    "(worst) to {max_score} (best). Answer with the number only."
)
POINTWISE_YES_TEMPLATE = (
    "You are judging an AI-generated image against the text prompt it was generated from.\n"
    'Prompt: "{prompt}"\n'
    "Does the image match the prompt faithfully and look good? Answer Yes or No."
)
VQA_TEMPLATE = "Answer the question about the image with Yes or No.\nQuestion: {question}"
EDIT_NUMBER_TEMPLATE = (
    "The first image is a source image, the second the result of editing it with this instruction:\n"
    '"{prompt}"\n'
    "Rate from {min_score} (worst) to {max_score} (best) how well the result follows the instruction while "
    "keeping everything the instruction does not ask to change as in the source. Answer with the number only."
)
EDIT_YES_TEMPLATE = (
    "The first image is a source image, the second the result of editing it with this instruction:\n"
    '"{prompt}"\n'
    "Does the result follow the instruction and keep everything else as in the source? Answer Yes or No."
)
GROUPWISE_NUMBER_TEMPLATE = (
    "You are judging {n} AI-generated images, Image 1 to Image {n} above, all generated from the same "
    "text prompt.\n"
    'Prompt: "{prompt}"\n'
    "Compare the images with each other and score each one from {min_score} (worst) to {max_score} "
    "(best) for how well it matches the prompt and how good it looks. Answer with one line per image "
    "and nothing else, in this form:\n"
    "Image 1: <score>\n"
    "Image 2: <score>"
)


class Config(PluginConfig):
    """Options of ``[rewards.options]`` for ``name = "vlm_judge"``."""

    modalities: ClassVar[frozenset[str]] = frozenset({"image"})

    base_url: str = Field(
        ...,
        pattern=r"^https?://",
        description="The server's OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (requests go "
        "to BASE_URL/chat/completions).",
    )
    model: str = Field(
        ..., min_length=1, description="The served model name (vLLM: the model id or --served-model-name)."
    )
    api_key: str | None = Field(
        None,
        description="Bearer token for the server (vLLM --api-key); it is saved with the resolved recipe, "
        "so prefer api_key_env.",
    )
    api_key_env: str | None = Field(
        None, min_length=1, description="Name of an environment variable holding the bearer token."
    )
    mode: Literal["pointwise", "groupwise", "vqa", "edit"] = Field(
        "pointwise",
        description="'pointwise': one request per image; 'groupwise': the images of one prompt in one "
        "request, scored together (score_rule 'number' only); 'vqa': one yes/no question per atom of the "
        "prompt's metadata, the score their mean P(yes) (Soft-TIFA; score_rule 'yes_probability'); 'edit': "
        "the source image (metadata) and the result in one request, with the instruction.",
    )
    vqa_aggregate: Literal["mean", "geometric"] = Field(
        "mean",
        description="How mode 'vqa' joins the atoms' P(yes): their arithmetic mean (Soft-TIFA's atom score) "
        "or geometric mean (near 0 when any atom fails).",
    )
    score_rule: Literal["number", "yes_probability"] = Field(
        "number",
        description="'number': the first number of the reply, normalised from [min_score, max_score] to "
        "[0, 1]; 'yes_probability': P(yes) / (P(yes) + P(no)) over the first token's top logprobs.",
    )
    prompt_template: str | None = Field(
        None,
        description="The text sent with the image(s); {prompt}, {min_score}, {max_score}, {n} (images in "
        "the request) and {question} (mode 'vqa') are filled in. null = the default of the mode and score "
        "rule (docs/rewards.md).",
    )
    system_prompt: str | None = Field(None, description="A system message sent first; null = none.")
    min_score: float = Field(0.0, description="The lowest score the template asks for (score_rule 'number').")
    max_score: float = Field(
        10.0, description="The highest score the template asks for (score_rule 'number')."
    )
    score_after: str | None = Field(
        None,
        min_length=1,
        description="Read the number(s) after the last occurrence of this text in the reply (e.g. "
        "'Final Score:' for UnifiedReward), case-insensitive; null = the whole reply.",
    )
    top_logprobs: int = Field(
        20,
        ge=1,
        le=100,
        description="Top logprobs requested for the first token (score_rule 'yes_probability'; OpenAI "
        "and vLLM's default --max-logprobs allow at most 20).",
    )
    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature; 0 = greedy, deterministic.")
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="Reply length cap; null = 1 for 'yes_probability' (only the first token is read), "
        "else 512.",
    )
    seed: int | None = Field(0, description="Sent as the request's 'seed'; null = not sent.")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="More fields merged into each request body, e.g. {chat_template_kwargs = "
        "{enable_thinking = false}}.",
    )
    image_size: int | None = Field(
        None, ge=8, description="Downscale images whose longer side exceeds this (bicubic); null = as is."
    )
    timeout_s: float = Field(120.0, gt=0, description="Seconds to wait for one request's reply.")
    retries: int = Field(
        2,
        ge=0,
        le=10,
        description="Extra tries after a connection failure, a timeout, an HTTP 429 or a 5xx reply.",
    )
    backoff_s: float = Field(
        1.0, ge=0, le=60, description="Wait before the first retry; doubles with each further one."
    )
    concurrency: int = Field(
        8, ge=1, le=256, description="Requests in flight at once (images pointwise, groups groupwise)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        if self.min_score >= self.max_score:
            raise ValueError(f"min_score ({self.min_score:g}) must be below max_score ({self.max_score:g})")
        if self.mode == "groupwise" and self.score_rule == "yes_probability":
            raise ValueError(
                "score_rule 'yes_probability' reads one answer's first token: use mode 'pointwise', or "
                "score_rule 'number' with mode 'groupwise'"
            )
        if self.mode == "vqa" and self.score_rule != "yes_probability":
            raise ValueError(
                "mode 'vqa' averages P(yes) over the atoms' questions: set score_rule 'yes_probability'"
            )
        needed = "{question}" if self.mode == "vqa" else "{prompt}"
        if self.prompt_template is not None and needed not in self.prompt_template:
            raise ValueError(f"prompt_template must contain the placeholder {needed} (mode {self.mode!r})")
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError("set api_key or api_key_env, not both")
        if {"model", "messages"} & set(self.extra_body):
            raise ValueError(
                "extra_body must not set 'model' or 'messages': use the options model and prompt_template"
            )
        return self

    def template(self) -> str:
        """The prompt template in use: ``prompt_template``, else the default of the mode and rule."""
        if self.prompt_template is not None:
            return self.prompt_template
        if self.mode == "groupwise":
            return GROUPWISE_NUMBER_TEMPLATE
        if self.mode == "vqa":
            return VQA_TEMPLATE
        if self.mode == "edit":
            return EDIT_YES_TEMPLATE if self.score_rule == "yes_probability" else EDIT_NUMBER_TEMPLATE
        return POINTWISE_YES_TEMPLATE if self.score_rule == "yes_probability" else POINTWISE_NUMBER_TEMPLATE


def build(config: Config, context: Any) -> Any:
    """Factory: the HTTP client (and torch) load only when a run builds the reward."""
    from .impl import VlmJudgeReward

    return VlmJudgeReward(config)


@hookimpl
def register_components() -> list[Component]:
    return [
        Component(
            "reward",
            "vlm_judge",
            build,
            Config,
            summary="A VLM judge behind an OpenAI-compatible chat API (vLLM, SGLang): a score, P(yes), "
            "Soft-TIFA atoms or an edit.",
        ),
    ]
