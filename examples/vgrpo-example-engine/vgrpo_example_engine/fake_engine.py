"""A fake generation engine: the ``http_engine`` contract served by vgrpo's own sampler, for tests.

It builds the recipe's adapter and fine-tuning setup (so the pushed weights' names fit), loads each
pushed safetensors file into its trainable weights, and answers ``/generate`` with the adapter's own
ODE sampler, from the trainer's noise when sent, else from noise it draws from each row's seed. A real
engine (a serving stack with its own kernels, caches and batching) keeps the same three routes.

    python -m vgrpo_example_engine.fake_engine recipe.toml --port 8100
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from safetensors.torch import load
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from vgrpo_example_engine.wire import pack, unpack
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.finetune import make_trainable
from vgrpo_platform.protocols import BuildContext, SamplerSpec


class FakeEngine:
    """The engine's state: one adapter copy, its trainable weights and their version."""

    def __init__(self, recipe: str, overrides: list[str] | None = None) -> None:
        resolved = resolve_recipe(recipe, overrides or [])
        torch.manual_seed(resolved.recipe.run.seed)
        self.adapter = resolved.adapter.spec.factory(resolved.adapter.config, BuildContext())
        self.trainable = make_trainable(self.adapter, resolved.recipe.train)
        self.version = -1

    def load_weights(self, body: bytes, version: int) -> None:
        weights = load(body)
        with torch.no_grad():
            for name, param in self.trainable.items():
                param.copy_(weights[name])
        self.version = version

    def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        prompts, chunk = payload["prompts"], int(payload["chunk_size"])
        shape = self.adapter.latent_shape()
        drawn = "noise" not in payload
        if drawn:  # the engine's own draw, one generator per row's seed
            rows = [torch.randn(shape, generator=torch.Generator().manual_seed(s)) for s in payload["seeds"]]
            noise = torch.stack(rows)
        else:
            noise = unpack(payload["noise"])
        sampler = SamplerSpec(payload["sampler"], int(payload["steps"]))
        cond = self.adapter.encode_prompts(prompts)
        parts = []
        for start in range(0, len(prompts), chunk):
            part = slice(start, start + chunk)
            parts.append(self.adapter.sample(noise[part], {k: v[part] for k, v in cond.items()}, sampler))
        answer = {"latents": pack(torch.cat(parts)), "weights_version": self.version}
        if drawn:
            answer["noise"] = pack(noise)
        answer["seconds"] = time.perf_counter() - t0
        return answer

    def __call__(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        if request.path == "/health":
            response = Response(json.dumps({"ok": True}), mimetype="application/json")
        elif request.path == "/weights" and request.method == "POST":
            self.load_weights(request.get_data(), int(request.headers["X-Weights-Version"]))
            response = Response("ok")
        elif request.path == "/generate" and request.method == "POST":
            answer = self.generate(json.loads(request.get_data()))
            response = Response(json.dumps(answer), mimetype="application/json")
        else:
            response = Response("not found", status=404)
        return response(environ, start_response)


def serve(engine: FakeEngine, host: str = "127.0.0.1", port: int = 8100) -> Any:
    """A werkzeug server of ``engine``, one request at a time in arrival order (not started yet);
    ``server.port`` is the bound port (``port = 0``: a free one)."""
    return make_server(host, port, engine, threaded=False)


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake generation engine for the http_engine backend.")
    parser.add_argument("recipe")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    server = serve(FakeEngine(args.recipe, args.overrides), port=args.port)
    print(f"fake engine on http://127.0.0.1:{server.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
