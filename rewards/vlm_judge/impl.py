"""The ``vlm_judge`` Reward: chat-completions requests with PNG data URLs, bounded retries, a thread pool
of requests, and one-line errors naming the fix for every way a server or its answer can fail."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from PIL import Image

from vgrpo_platform.errors import RewardError
from vgrpo_platform.protocols import Samples
from vgrpo_platform.retrying import TransientError

from .._clip_common import check_images
from .._condition import source_images
from .._http import JsonPoster
from .atoms import questions

if TYPE_CHECKING:
    from . import Config

T = TypeVar("T")
R = TypeVar("R")

NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
# "Image 3: 7", "**Image 3**: 7.5", "image #3 = 7", "Image 3 - 7"
IMAGE_LINE = re.compile(
    r"image\s*#?\s*(\d+)\s*\**\s*[:=\-\u2013]\s*\**\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))", re.I
)
JSON_LIST = re.compile(r"\[[^\[\]]*\]")
SPACE_MARKERS = str.maketrans({"\u0120": " ", "\u2581": " "})  # byte-level BPE "Ġ", SentencePiece "▁"
START_HINT = "`vllm serve Qwen/Qwen2.5-VL-7B-Instruct --port 8000`"


def _snippet(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _fmt(x: float) -> str:
    return f"{x:g}"


class VlmJudgeReward(JsonPoster):
    """Asks the judge at ``base_url`` about each image (pointwise) or each prompt's images (groupwise).

    ``score`` returns ``{"score": [B] in [0, 1], detail: [B]}``: the detail is ``raw`` (the judge's
    number before normalisation) for ``score_rule = "number"`` and ``yes_no_mass`` (``P(yes) + P(no)``
    among the top logprobs: how much of the first token's probability answered in the expected form)
    for ``"yes_probability"``. Mode ``vqa`` scores the mean (or geometric mean) of the atoms' P(yes) and
    adds ``min_atom`` (the weakest atom) and ``atoms`` (how many were asked); its detail is the atoms'
    mean yes/no mass.
    """

    modalities = frozenset({"image"})
    error_prefix = "vlm_judge: "
    not_json_fix = "point options.base_url at an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1"
    timeout_fix = "raise options.timeout_s, or lower options.concurrency or options.image_size"
    unreachable_fix = f"start it (e.g. {START_HINT}) or fix options.base_url"

    def __init__(self, config: Config) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self.server, self.replier = f"the judge server at {self.base_url}", f"the judge at {self.base_url}"
        self.url = f"{self.base_url}/chat/completions"
        self.api_key = _api_key(config)
        self.template = config.template()
        self.yes_rule = config.score_rule == "yes_probability"
        self.detail = "yes_no_mass" if self.yes_rule else "raw"
        self.max_tokens = config.max_tokens or (1 if self.yes_rule else 512)

    # ------------------------------------------------------------------ scoring

    def score(
        self, samples: Samples, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        data = check_images(samples, prompts, "vlm_judge")
        device, batch = data.device, int(data.shape[0])
        if batch == 0:
            keys = ("score", self.detail, *(("min_atom", "atoms") if self.config.mode == "vqa" else ()))
            return {k: torch.zeros(0, device=device) for k in keys}
        # one copy off the device; PNG encoding happens in the request threads
        pixels = (data.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
        pixels = pixels.cpu().numpy()  # [B, H, W, 3] uint8
        mode = self.config.mode
        if mode == "groupwise":  # samples sharing a prompt string form one group, in batch order
            groups: dict[str, list[int]] = {}
            for i, prompt in enumerate(prompts):
                groups.setdefault(prompt, []).append(i)
            owners = list(groups.values())
            jobs = [Job([pixels[i] for i in idx], prompts[idx[0]]) for idx in owners]
        elif mode == "vqa":  # one request per (sample, atom question)
            owners, jobs = [], []
            for i, (prompt, meta) in enumerate(zip(prompts, metadata, strict=True)):
                for question in self._questions(prompt, meta):
                    owners.append([i])
                    jobs.append(Job([pixels[i]], prompt, question))
        elif mode == "edit":  # the source image first, then the result
            sources = source_images(metadata, "vlm_judge")
            owners = [[i] for i in range(batch)]
            jobs = [Job([_uint8(sources[i]), pixels[i]], prompts[i]) for i in range(batch)]
        else:
            owners = [[i] for i in range(batch)]
            jobs = [Job([pixels[i]], prompts[i]) for i in range(batch)]
        results = self._map(self._judge, jobs)
        answers: list[list[tuple[float, float]]] = [[] for _ in range(batch)]
        for idx, pairs in zip(owners, results, strict=True):
            for i, pair in zip(idx, pairs, strict=True):
                answers[i].append(pair)
        score = [self._join([s for s, _ in a]) for a in answers]
        detail = [sum(d for _, d in a) / len(a) for a in answers]
        out = {
            "score": torch.tensor(score, dtype=torch.float32, device=device),
            self.detail: torch.tensor(detail, dtype=torch.float32, device=device),
        }
        if mode == "vqa":  # the weakest atom, and how many were asked
            out["min_atom"] = torch.tensor([min(s for s, _ in a) for a in answers], device=device)
            out["atoms"] = torch.tensor([float(len(a)) for a in answers], device=device)
        return out

    def _join(self, values: list[float]) -> float:
        """One sample's score from its answers: the one answer, or (mode 'vqa') the atoms' mean."""
        if self.config.mode == "vqa" and self.config.vqa_aggregate == "geometric":
            return math.exp(sum(math.log(max(v, 1e-12)) for v in values) / len(values))
        return sum(values) / len(values)

    def _questions(self, prompt: str, meta: Mapping[str, Any]) -> list[str]:
        try:
            return questions(meta)
        except ValueError as exc:
            raise RewardError(
                f"vlm_judge: prompt {_snippet(prompt, 40)}: {exc}; mode 'vqa' needs a JSONL prompt set whose "
                "lines carry 'questions' or GenEval's 'include' (vgrpo_rewards.geneval.make_prompts)"
            ) from None

    def _map(self, fn: Callable[[T], R], jobs: list[T]) -> list[R]:
        """``fn`` over ``jobs`` with up to ``concurrency`` in flight; results (or the first failure, in
        job order) as if run one by one."""
        workers = min(self.config.concurrency, len(jobs))
        if workers <= 1:
            return [fn(job) for job in jobs]
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vlm_judge")
        try:
            futures = [pool.submit(fn, job) for job in jobs]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _judge(self, job: Job) -> list[tuple[float, float]]:
        """One request; ``(score in [0, 1], detail)`` per scored image (groupwise: each of the group's)."""
        cfg = self.config
        prompt = job.prompt
        text = (
            self.template.replace("{prompt}", prompt)
            .replace("{min_score}", _fmt(cfg.min_score))
            .replace("{max_score}", _fmt(cfg.max_score))
            .replace("{n}", str(len(job.images)))
            .replace("{question}", job.question or "")
        )
        content: list[dict[str, Any]] = []
        for k, image in enumerate(job.images, 1):
            if cfg.mode == "groupwise":
                content.append({"type": "text", "text": f"Image {k}:"})
            content.append({"type": "image_url", "image_url": {"url": self._data_url(image)}})
        content.append({"type": "text", "text": text})
        messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
        if cfg.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": messages,
            "temperature": cfg.temperature,
            "max_tokens": self.max_tokens,
        }
        if cfg.seed is not None:
            body["seed"] = cfg.seed
        if self.yes_rule:
            body["logprobs"] = True
            body["top_logprobs"] = cfg.top_logprobs
        body.update(cfg.extra_body)
        choice = self._choice(self._post(json.dumps(body).encode()))
        if self.yes_rule:
            return [self._yes_probability(choice)]
        reply, finish = _reply_text(choice), choice.get("finish_reason")
        if reply is None:
            raise RewardError(
                f"vlm_judge: the judge at {self.base_url} sent no reply text (finish_reason {finish!r}); "
                "raise options.max_tokens (a reasoning model may spend them all thinking)"
            )
        scored = len(job.images) if cfg.mode == "groupwise" else 1
        numbers = self._numbers(reply, scored, prompt, finish)
        lo, hi = cfg.min_score, cfg.max_score
        for x in numbers:
            if not (lo <= x <= hi):
                raise RewardError(
                    f"vlm_judge: the judge answered {_fmt(x)} (reply {_snippet(reply)}), outside "
                    f"[min_score, max_score] = [{_fmt(lo)}, {_fmt(hi)}]; set options.min_score and "
                    "options.max_score to the scale the prompt template asks for"
                )
        return [((x - lo) / (hi - lo), x) for x in numbers]

    def _data_url(self, image: np.ndarray) -> str:
        """``data:image/png;base64,...`` of one ``[H, W, 3]`` uint8 image, its longer side capped."""
        pil = Image.fromarray(image)
        cap = self.config.image_size
        if cap is not None and max(pil.size) > cap:
            scale = cap / max(pil.size)
            size = (max(1, round(pil.width * scale)), max(1, round(pil.height * scale)))
            pil = pil.resize(size, Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        pil.save(buf, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")

    # ------------------------------------------------------------------ reading the answer

    def _answer(self, reply: str) -> str:
        """The reply's part that holds the score(s): after a ``</think>`` block, after ``score_after``."""
        text = reply.rsplit("</think>", 1)[1] if "</think>" in reply else reply
        marker = self.config.score_after
        if marker is None:
            return text
        pos = text.lower().rfind(marker.lower())
        if pos < 0:
            raise RewardError(
                f"vlm_judge: no {marker!r} in the judge's reply {_snippet(reply)}; make "
                "options.prompt_template ask for it, or fix options.score_after"
            )
        return text[pos + len(marker) :]

    def _numbers(self, reply: str, n: int, prompt: str, finish: Any) -> list[float]:
        text = self._answer(reply)
        length_hint = " or raise options.max_tokens (the reply was cut off)" if finish == "length" else ""
        if self.config.mode != "groupwise":
            match = NUMBER.search(text)
            if match is None:
                raise RewardError(
                    f"vlm_judge: no number in the judge's reply {_snippet(reply)}; make "
                    f"options.prompt_template ask for a number alone{length_hint}"
                )
            return [float(match.group())]
        try:
            return _group_numbers(text, n)
        except ValueError as exc:
            raise RewardError(
                f"vlm_judge: the judge gave {exc} (prompt {_snippet(prompt, 40)}, reply {_snippet(reply)}); "
                f"it must answer one 'Image k: <score>' line per image, or a JSON list of {n} numbers: fix "
                f"options.prompt_template{length_hint}"
            ) from None

    def _yes_probability(self, choice: Mapping[str, Any]) -> tuple[float, float]:
        """``(P(yes) / (P(yes) + P(no)), P(yes) + P(no))`` over the first token's top logprobs."""
        logprobs = choice.get("logprobs")
        first = None
        if (
            isinstance(logprobs, Mapping)
            and isinstance(logprobs.get("content"), list)
            and logprobs["content"]
        ):
            first = logprobs["content"][0]
        tops = first.get("top_logprobs") if isinstance(first, Mapping) else None
        if not isinstance(tops, list) or not tops:
            raise RewardError(
                f"vlm_judge: the judge at {self.base_url} returned no top logprobs for the first token; "
                "score_rule 'yes_probability' needs them (vLLM: --max-logprobs must be >= "
                f"options.top_logprobs = {self.config.top_logprobs}), or use score_rule 'number'"
            )
        candidates: dict[str, float] = {}
        for entry in [*tops, first]:
            if isinstance(entry, Mapping) and isinstance(entry.get("token"), str):
                try:
                    candidates.setdefault(entry["token"], float(entry["logprob"]))
                except (KeyError, TypeError, ValueError):
                    continue
        p_yes = p_no = 0.0
        for token, logprob in candidates.items():
            word = token.translate(SPACE_MARKERS).strip().lower()
            if word == "yes":
                p_yes += math.exp(logprob)
            elif word == "no":
                p_no += math.exp(logprob)
        if p_yes + p_no <= 0.0:
            seen = ", ".join(repr(t) for t in list(candidates)[:5]) or "none"
            raise RewardError(
                f"vlm_judge: neither 'yes' nor 'no' among the first token's top {len(candidates)} "
                f"logprobs (first: {seen}); make options.prompt_template ask for a Yes or No answer, "
                "or raise options.top_logprobs"
            )
        return p_yes / (p_yes + p_no), p_yes + p_no

    def _choice(self, reply: Mapping[str, Any]) -> Mapping[str, Any]:
        choices = reply.get("choices")
        if not (isinstance(choices, list) and choices and isinstance(choices[0], Mapping)):
            raise RewardError(
                f"malformed reply from the judge at {self.base_url}: no 'choices'; point options.base_url "
                "at an OpenAI-compatible server (vLLM, SGLang), e.g. http://127.0.0.1:8000/v1"
            )
        choice = choices[0]
        if not isinstance(choice.get("message"), Mapping):
            raise RewardError(
                f"malformed reply from the judge at {self.base_url}: 'choices[0]' has no 'message'; point "
                "options.base_url at a chat-completions server"
            )
        return choice

    # ------------------------------------------------------------------ HTTP

    def _request(self, body: bytes) -> urllib.request.Request:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(self.url, data=body, headers=headers, method="POST")

    def _http_error(self, code: int, body: bytes) -> Exception:
        where, message = self.server, _error_text(body)
        if code == 429 or code >= 500:
            return TransientError(
                f"vlm_judge: {where} failed (HTTP {code}): {message}; check the server's log"
            )
        if code in (401, 403):
            fix = "set options.api_key_env to the variable holding the server's key (vLLM: --api-key)"
        elif code == 404:
            fix = (
                "check options.base_url (the OpenAI-compatible root, ending in /v1) and options.model "
                f"(the served name; GET {self.base_url}/models lists them)"
            )
        else:
            fix = (
                "check options.model, the images per request the server accepts (vLLM: "
                "--limit-mm-per-prompt) and, for yes_probability, options.top_logprobs "
                "(vLLM: --max-logprobs)"
            )
        return RewardError(f"vlm_judge: {where} refused the request (HTTP {code}): {message}; {fix}")


@dataclass(frozen=True)
class Job:
    """One request: its images (uint8 ``[H, W, 3]``, in the order sent), the prompt, the atom question."""

    images: list[np.ndarray]
    prompt: str
    question: str | None = None


def _uint8(image: torch.Tensor) -> np.ndarray:
    """``[3, H, W]`` in ``[0, 1]`` -> ``[H, W, 3]`` uint8."""
    return (image.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()


def _api_key(config: Config) -> str | None:
    if config.api_key_env is None:
        return config.api_key
    value = os.environ.get(config.api_key_env)
    if not value:
        raise RewardError(
            f"vlm_judge: options.api_key_env names {config.api_key_env}, which is not set; export it "
            "or drop options.api_key_env"
        )
    return value


def _reply_text(choice: Mapping[str, Any]) -> str | None:
    """The message's text: a string, or the text parts of a content list; None when there is none."""
    content = choice["message"].get("content")
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        content = "".join(parts) if parts else None
    return content if isinstance(content, str) and content.strip() else None


def _group_numbers(text: str, n: int) -> list[float]:
    """A groupwise answer's scores, in image order: a JSON list of numbers if the text holds one, else
    ``Image k: <score>`` lines (the first score of each ``k``), else every number of the text. Raises
    ``ValueError`` naming what is wrong when that is not ``n`` scores for images 1..n."""
    numbers: list[float] | None = None
    for match in JSON_LIST.finditer(text):
        try:
            values = json.loads(match.group())
        except ValueError:
            continue
        if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            numbers = [float(v) for v in values]
            break
    if numbers is None:
        lines = IMAGE_LINE.findall(text)
        if lines:
            scores: dict[int, float] = {}
            for k, value in lines:
                scores.setdefault(int(k), float(value))
            if sorted(scores) != list(range(1, n + 1)):
                raise ValueError(f"scores for images {sorted(scores)} of a group of {n} (images 1 to {n})")
            return [scores[k] for k in range(1, n + 1)]
        numbers = [float(m.group()) for m in NUMBER.finditer(text)]
    if len(numbers) != n:
        raise ValueError(f"{len(numbers)} scores for a group of {n} images")
    return numbers


def _error_text(body: bytes) -> str:
    """The message of an OpenAI-style (``{"error": {"message"}}``) or vLLM/FastAPI error body."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for value in (err, obj.get("message"), obj.get("detail")):
            if isinstance(value, str) and value:
                return value
    return body[:200].decode("utf-8", "replace") or "no details"
