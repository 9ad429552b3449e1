"""The model's cross-entropy equals PyTorch's in value and gradient, for every logits dtype, and with
positions that have no target (a chat prompt's) left out of the loss and its mean."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptcore.model.cross_entropy import IGNORE, cross_entropy


def loss_and_grad(function, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = logits.detach().clone().requires_grad_(True)
    loss = function(leaf, targets)
    (loss * 3.0).backward()  # a non-unit upstream gradient, as a grad scaler gives
    return loss.detach(), leaf.grad


def test_value_and_gradient_equal_torch_cross_entropy_in_fp32() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 500, generator=generator) * 4
    targets = torch.randint(0, 500, (64,), generator=generator)
    ours = loss_and_grad(cross_entropy, logits, targets)
    reference = loss_and_grad(F.cross_entropy, logits, targets)
    assert ours[0].dtype == torch.float32
    torch.testing.assert_close(ours[0], reference[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[1], reference[1], rtol=0, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_give_a_float32_loss_and_a_gradient_in_their_own_dtype(
    dtype: torch.dtype,
) -> None:
    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(32, 300, generator=generator) * 3).to(dtype)
    targets = torch.randint(0, 300, (32,), generator=generator)
    loss, grad = loss_and_grad(cross_entropy, logits, targets)
    reference_loss, reference_grad = loss_and_grad(
        lambda x, t: F.cross_entropy(x.float(), t), logits, targets
    )
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, reference_loss, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad, reference_grad)


def test_positions_without_a_target_count_neither_in_the_loss_nor_in_its_gradient() -> None:
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(48, 200, generator=generator) * 3
    targets = torch.randint(0, 200, (48,), generator=generator)
    targets[::3] = IGNORE
    ours = loss_and_grad(cross_entropy, logits, targets)
    reference = loss_and_grad(lambda x, t: F.cross_entropy(x, t, ignore_index=IGNORE), logits, targets)
    torch.testing.assert_close(ours[0], reference[0])  # summed in another order: float32's tolerance
    torch.testing.assert_close(ours[1], reference[1], rtol=0, atol=1e-7)
    assert ours[1][::3].abs().max() == 0
    nothing = loss_and_grad(cross_entropy, logits, torch.full((48,), IGNORE))  # a window of prompt alone
    assert nothing[0] == 0 and nothing[1].abs().max() == 0


def test_a_model_s_loss_in_pieces_is_the_mean_over_the_positions_with_targets() -> None:
    from gptcore.model.config import ModelConfig
    from gptcore.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=300)).eval()
    tokens = torch.randint(0, 300, (3, 17))
    targets = tokens[:, 1:].clone()
    targets[:, :9] = IGNORE  # the prompt's positions
    whole = model(tokens[:, :-1], targets)[1]
    pieces = model(tokens[:, :-1], targets, loss_only=True)[1]
    logits = model(tokens[:, :-1], targets)[0]
    reference = F.cross_entropy(logits.view(-1, 300), targets.reshape(-1), ignore_index=IGNORE)
    torch.testing.assert_close(whole, reference)
    torch.testing.assert_close(pieces, reference)


def test_a_second_backward_through_the_same_loss_is_refused() -> None:
    logits = torch.randn(4, 10, requires_grad=True)
    loss = cross_entropy(logits, torch.tensor([1, 2, 3, 4]))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="ran twice"):
        loss.backward()


def test_mismatched_shapes_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"\(N, V\) logits and \(N,\) targets"):
        cross_entropy(torch.randn(2, 3, 5), torch.tensor([0, 1]))
