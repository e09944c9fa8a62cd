"""LoRA through peft and the frozen reference: the policy starts at the base model, the reference stays it."""

from __future__ import annotations

import torch

from vgrpo_platform import finetune


class TinyAdapter:
    """Only what ``reference_mode`` touches: a denoiser and a predict that uses it."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.denoiser = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 6))

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.denoiser(x)


def test_lora_starts_at_the_base_model_and_reference_mode_disables_it():
    adapter = TinyAdapter()
    x = torch.randn(4, 6)
    base = adapter.predict(x).detach()
    params = finetune.attach_lora(adapter.denoiser, rank=2, alpha=4, target_modules=["0", "2"])
    assert len(params) == 4 and all(p.requires_grad for p in params)
    assert not any(p.requires_grad for n, p in adapter.denoiser.named_parameters() if "lora_" not in n)
    torch.testing.assert_close(adapter.predict(x), base)  # LoRA B starts at zero
    with torch.no_grad():
        for p in params:
            p.add_(0.3)
    moved = adapter.predict(x).detach()
    assert not torch.allclose(moved, base)
    with finetune.reference_mode(adapter):
        torch.testing.assert_close(adapter.predict(x), base)
    torch.testing.assert_close(adapter.predict(x), moved)
    assert set(finetune.trainable_named_parameters(adapter.denoiser)) == {
        n for n, _ in adapter.denoiser.named_parameters() if "lora_" in n
    }


def test_full_finetune_reference_is_the_initial_weights_and_training_state_is_restored():
    adapter = TinyAdapter()
    x = torch.randn(4, 6)
    base = adapter.predict(x).detach()
    params = finetune.enable_full_finetune(adapter.denoiser)
    assert len(params) == 4
    with torch.no_grad():
        for p in params:
            p.mul_(1.5)
    moved = adapter.predict(x).detach()
    with finetune.reference_mode(adapter):
        torch.testing.assert_close(adapter.predict(x), base)
    torch.testing.assert_close(adapter.predict(x), moved)


def test_lora_on_missing_modules_is_a_clear_error():
    adapter = TinyAdapter()
    try:
        finetune.attach_lora(adapter.denoiser, rank=2, alpha=4, target_modules=["nonexistent"])
    except ValueError as exc:
        assert "nonexistent" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected a ValueError")


def test_lora_weights_train_in_fp32_beside_a_bf16_base():
    """peft would create bf16 adapters on a bf16 layer; small AdamW updates would round away."""
    base = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(torch.bfloat16)
    params = finetune.attach_lora(base, rank=2, alpha=2.0, target_modules=["0", "1"])
    assert params and all(p.dtype == torch.float32 for p in params)
    assert all(p.dtype == torch.bfloat16 for n, p in base.named_parameters() if "lora_" not in n)
    out = base(torch.randn(3, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16  # the layer's output keeps the base's dtype
    out.float().square().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)
