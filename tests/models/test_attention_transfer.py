"""--criterion attention_transfer: each kernel attention's output against softmax attention's over the same
projections, the loss that trains a learned feature map to mimic softmax (the first step of converting a trained
softmax model)."""
import math

import pytest
import torch

from fairseq_linattn.attention import KernelAttention, KernelCrossAttention
from fairseq_linattn.attention.ops.linear_attn.bidirectional import attend_to_summary
from fairseq_linattn.attention.ops.softmax import softmax_attention
from fairseq_linattn.criterions.attention_transfer import AttentionTransferCriterion

from .builders import SMALL_DECODER, build


def test_the_transfer_loss_is_the_difference_from_softmax_over_the_same_projections():
    torch.manual_seed(0)
    attn = KernelAttention(32, 4, feature_map="hedgehog", causal=True).double()
    x = torch.randn(9, 2, 32, dtype=torch.float64)
    attn.transfer = True
    out, _ = attn(x)
    q, k, v = (attn.split_heads(proj(x)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    future = torch.ones(9, 9, dtype=torch.bool).triu(1)
    teacher, _ = softmax_attention(q, k, v, attn_mask=future, scale=8 ** -0.5)
    linear = attn.attend(x, None, None, None, False)[0]
    torch.testing.assert_close(attn.transfer_loss, (linear - teacher).pow(2).mean().float())
    attn.transfer_loss.backward()
    assert attn.feature_map.weight.grad.abs().sum() > 0
    assert out.shape == x.shape


def test_pads_are_left_out_of_the_transfer_loss():
    torch.manual_seed(0)
    attn = KernelAttention(32, 4, feature_map="t2r", causal=True).double()
    attn.transfer = True
    x = torch.randn(6, 1, 32, dtype=torch.float64)
    attn(x)
    alone = attn.transfer_loss
    padded = torch.cat([torch.randn(3, 1, 32, dtype=torch.float64) * 50, x])
    attn(padded, key_padding_mask=torch.tensor([[True] * 3 + [False] * 6]))
    torch.testing.assert_close(attn.transfer_loss, alone)


def test_cross_attention_transfers_to_softmax_over_the_source():
    """Encoder-decoder kernel attention: softmax over the source (its pads left out) is the teacher, at every target
    position (the decoder does not tell the cross-attention which targets are pads)."""
    torch.manual_seed(0)
    attn = KernelCrossAttention(32, 4, source_dim=24, feature_map="hedgehog").double()
    attn.transfer = True
    target, source = torch.randn(5, 2, 32, dtype=torch.float64), torch.randn(7, 2, 24, dtype=torch.float64)
    pads = torch.tensor([[False] * 7, [True] * 2 + [False] * 5])
    out, _ = attn(target, source, source, key_padding_mask=pads)
    q = attn.split_heads(attn.q_proj(target))
    k, v = attn.split_heads(attn.k_proj(source)), attn.split_heads(attn.v_proj(source))
    teacher, _ = softmax_attention(q, k, v, key_padding_mask=pads, scale=8 ** -0.5)
    with torch.no_grad():  # the heads before the output projection, recomputed
        linear = attend_to_summary(attn.feature_map(q, is_query=True), attn.source_summary(source, pads, None), attn.eps)
    torch.testing.assert_close(attn.transfer_loss.detach(), (linear - teacher).pow(2).mean().float())
    attn.transfer_loss.backward()
    assert attn.feature_map.weight.grad.abs().sum() > 0 and out.shape == target.shape


def sample(task, batch=4, length=24):
    tokens = torch.randint(4, len(task.dictionary), (batch, length + 1))
    return {"net_input": {"src_tokens": tokens[:, :-1], "src_lengths": torch.full((batch,), length)},
            "target": tokens[:, 1:], "ntokens": batch * length}


def test_the_task_loss_is_logged_as_the_tasks_criterion_logs_it():
    """Base 2, per target that is not padding (a masked LM's masked positions, not every token of the sample)."""
    from fairseq import metrics

    torch.manual_seed(0)
    model, task = build("linear_transformer_lm", feature_map="hedgehog", **SMALL_DECODER)
    batch = sample(task)
    batch["target"][:, ::3] = task.dictionary.pad()  # as a masked LM's targets: most positions not scored
    _, _, log = AttentionTransferCriterion(task)(model, batch)
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(**batch["net_input"]), log_probs=True)
    real = batch["target"].ne(task.dictionary.pad())
    expected = -lprobs.gather(-1, batch["target"].clamp(min=0).unsqueeze(-1)).squeeze(-1)[real].mean() / math.log(2)
    assert log["targets"] == int(real.sum()) < batch["ntokens"]
    with metrics.aggregate() as agg:
        AttentionTransferCriterion.reduce_metrics([log])
    assert agg.get_smoothed_values()["task_loss"] == pytest.approx(float(expected), abs=1e-3)


def test_the_criterion_trains_the_feature_maps_alone_toward_softmax():
    torch.manual_seed(0)
    model, task = build("linear_transformer_lm", feature_map="hedgehog", **SMALL_DECODER)
    criterion = AttentionTransferCriterion(task)
    batch = sample(task)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    first, _, log = criterion(model, batch)
    assert log["layers"] == SMALL_DECODER["decoder_layers"] and log["task_loss"] > 0
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(30):
        loss, _, _ = criterion(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    last, _, _ = criterion(model, batch)
    assert last < 0.8 * first
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("feature_map" in n for n in changed)


@pytest.mark.parametrize("options,message", [
    (dict(feature_map="elu"), "the feature map has no weights to train"),
    (dict(linear_attention="gated-delta"), "needs kernel attention layers"),
])
def test_what_it_cannot_train_is_one_clear_error(options, message):
    model, task = build("linear_transformer_lm", **options, **SMALL_DECODER)
    with pytest.raises(ValueError, match=message):
        AttentionTransferCriterion(task)(model, sample(task))
