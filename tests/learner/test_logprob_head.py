"""`agentrl.learner.logprob_head.head_logprobs`: hand-computed values, gradients against autograd on the
plain ops (float64), chunk boundaries, temperature, bias, empty input; and the model split
(`prefix_share.decoder_and_head`) refusing heads that are not a plain linear map."""

import math

import pytest
import torch

from agentrl.learner import logprob_head
from agentrl.learner.logprob_head import head_logprobs


def _head(weight, bias=None):
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                           dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight)
        if bias is not None:
            head.bias.copy_(bias)
    return head


def test_hand_computed_two_token_vocabulary():
    # E = 1, V = 2, W = [[1], [0]]: logits (h, 0); h = ln 3 gives p = (3/4, 1/4).
    head = _head(torch.tensor([[1.0], [0.0]]))
    h = torch.tensor([[math.log(3.0)], [math.log(3.0)]], requires_grad=True)
    lp, ent = head_logprobs(h, head, torch.tensor([0, 1]))
    assert lp.tolist() == pytest.approx([math.log(0.75), math.log(0.25)], abs=1e-6)
    h_bits = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert ent.tolist() == pytest.approx([h_bits, h_bits], abs=1e-6)
    assert not ent.requires_grad
    lp.sum().backward()
    # d logp / d z = onehot - p; z0 = h w0, so d/dh = (onehot - p)_0 * 1 = (1/4, -3/4)
    assert h.grad.flatten().tolist() == pytest.approx([0.25, -0.75], abs=1e-6)
    # d/dW0 = sum_rows (onehot - p)_0 * h = (1/4 - 3/4) ln 3; d/dW1 = (-1/4 + 3/4) ln 3
    assert head.weight.grad.flatten().tolist() == pytest.approx(
        [-0.5 * math.log(3.0), 0.5 * math.log(3.0)], abs=1e-6)


def test_temperature_divides_the_logits():
    head = _head(torch.tensor([[2.0], [0.0]]))
    h = torch.tensor([[math.log(3.0)]], requires_grad=True)
    lp, _ = head_logprobs(h, head, torch.tensor([0]), temperature=2.0)  # logits (ln 3, 0)
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    lp.backward()
    assert h.grad.item() == pytest.approx(0.25 * 2.0 / 2.0, abs=1e-6)  # (1 - p) * w / T
    lp0, _ = head_logprobs(h, head, torch.tensor([0]), temperature=0.0)  # 0 means 1
    lp1, _ = head_logprobs(h, head, torch.tensor([0]), temperature=1.0)
    assert lp0.item() == lp1.item()


@pytest.mark.parametrize("chunk", [2, 3, 512])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_the_plain_ops(monkeypatch, chunk, bias):
    monkeypatch.setattr(logprob_head, "CHUNK_ROWS", chunk)
    g = torch.Generator().manual_seed(0)
    N, E, V, T = 7, 5, 11, 0.7
    weight = torch.randn(V, E, generator=g, dtype=torch.float64)
    b = torch.randn(V, generator=g, dtype=torch.float64) if bias else None
    hidden = torch.randn(N, E, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (N,), generator=g)
    coef = torch.randn(N, generator=g, dtype=torch.float64)
    grads = []
    for fused in (False, True):
        head = _head(weight, b)
        h = hidden.clone().requires_grad_(True)
        if fused:
            lp, ent = head_logprobs(h, head, targets, temperature=T)
        else:
            z = head(h) / T
            lp = z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
            ent = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
        (lp * coef).sum().backward()
        grads.append((lp.detach(), ent.detach(), h.grad, head.weight.grad,
                      head.bias.grad if bias else None))
    (lp0, e0, gh0, gw0, gb0), (lp1, e1, gh1, gw1, gb1) = grads
    # float64 in and out of the GEMMs; the function's own math is float32
    assert torch.allclose(lp1.double(), lp0, atol=1e-5)
    assert torch.allclose(e1.double(), e0, atol=1e-5)
    assert torch.allclose(gh1, gh0, atol=1e-5)
    assert torch.allclose(gw1, gw0, atol=1e-5)
    if bias:
        assert torch.allclose(gb1, gb0, atol=1e-5)


def test_frozen_head_gets_no_gradient_and_empty_input():
    head = _head(torch.randn(4, 3))
    head.weight.requires_grad_(False)
    h = torch.randn(2, 3, requires_grad=True)
    lp, _ = head_logprobs(h, head, torch.tensor([1, 2]))
    lp.sum().backward()
    assert head.weight.grad is None and h.grad is not None and bool(h.grad.abs().sum() > 0)
    lp, ent = head_logprobs(torch.zeros(0, 3), head, torch.zeros(0, dtype=torch.long))
    assert lp.shape == (0,) and ent.shape == (0,)


def test_decoder_and_head_refuses_a_scaled_head(tiny_model_dir):
    from agentrl.learner.prefix_share import decoder_and_head
    from agentrl.models.tiny import load_model

    model, _ = load_model(tiny_model_dir)
    split = decoder_and_head(model)
    assert split is not None and split[1] is model.lm_head and split[0] is model.model

    class Scaled(torch.nn.Linear):  # e.g. a logit scale or soft-capping inside the head
        def forward(self, x):
            return 2.0 * super().forward(x)

    other, _ = load_model(tiny_model_dir)
    head = Scaled(other.lm_head.in_features, other.lm_head.out_features, bias=False)
    head.weight = other.lm_head.weight
    other.lm_head = head
    assert decoder_and_head(other) is None  # not a plain nn.Linear

    third, _ = load_model(tiny_model_dir)
    inner = third.forward

    def doubled(*a, **kw):  # logits the head alone does not give
        out = inner(*a, **kw)
        out.logits = out.logits * 2.0
        return out

    third.forward = doubled
    assert decoder_and_head(third) is None  # the check on a 3-token input catches it


def test_decoder_and_head_rechecks_a_replaced_head_and_keeps_module_modes(tiny_model_dir):
    from agentrl.learner.prefix_share import decoder_and_head
    from agentrl.models.tiny import load_model

    model, _ = load_model(tiny_model_dir)
    model.train()
    model.model.layers[0].eval()  # a submodule the user put in eval mode
    assert decoder_and_head(model)[1] is model.lm_head
    assert model.training and not model.model.layers[0].training and model.model.layers[1].training

    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2.0 * super().forward(x)

    head = Scaled(model.lm_head.in_features, model.lm_head.out_features, bias=False)
    head.weight = model.lm_head.weight
    model.set_output_embeddings(head)  # same model object, new head: checked again
    assert decoder_and_head(model) is None
    plain = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
    plain.weight = head.weight
    model.set_output_embeddings(plain)
    assert decoder_and_head(model)[1] is plain


def test_retained_graph_backward_twice_and_no_double_backward():
    head = _head(torch.randn(5, 3))
    h = torch.randn(4, 3, requires_grad=True)
    lp, _ = head_logprobs(h, head, torch.tensor([0, 1, 2, 3]))
    lp.sum().backward(retain_graph=True)
    first = h.grad.clone()
    lp.sum().backward()
    assert torch.allclose(h.grad, 2 * first)
    lp, _ = head_logprobs(h, head, torch.tensor([0, 1, 2, 3]))
    (gh,) = torch.autograd.grad(lp.sum(), h, create_graph=True)
    with pytest.raises(RuntimeError):
        gh.pow(2).sum().backward()
