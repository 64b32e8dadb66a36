"""The short convolution: a decoding step (one token, a weighted sum over the cached window) against the whole
sequence through conv1d, and several tokens at a time from a cache."""
import torch

from fairseq_linattn.attention.short_conv import ShortConvolution
from tests.reference import assert_matches_reference


def test_token_by_token_equals_the_whole_sequence():
    torch.manual_seed(0)
    conv = ShortConvolution(6, 4).double()
    torch.nn.init.normal_(conv.bias)
    x = torch.randn(3, 9, 6, dtype=torch.float64)
    whole, last_cache = conv(x)
    cache, steps = None, []
    for t in range(x.size(1)):
        out, cache = conv(x[:, t : t + 1], cache)
        steps.append(out)
    assert_matches_reference(torch.cat(steps, 1), whole, 1e-14, "token by token")
    assert torch.equal(cache, last_cache)


def test_a_few_tokens_from_a_cache_equal_the_whole_sequence():
    torch.manual_seed(1)
    conv = ShortConvolution(5, 3).double()
    x = torch.randn(2, 10, 5, dtype=torch.float64)
    whole, _ = conv(x)
    head, cache = conv(x[:, :6])
    tail, _ = conv(x[:, 6:], cache)
    assert_matches_reference(torch.cat([head, tail], 1), whole, 1e-14, "prefix then the rest")
