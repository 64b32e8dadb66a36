"""The attention math without the layers: tensors in, tensors out, each fast op beside its plain reference.

* :mod:`.linear_attn`: kernelized linear attention (chunked causal op, recurrent step, bidirectional form,
  ``naive`` references);
* :mod:`.gated_linear_attn`: linear attention with a decaying state (RetNet's fixed decay, GLA's gates): chunked
  op, recurrent step, token-by-token reference;
* :mod:`.delta_rule`: the (gated) delta rule of DeltaNet / Gated DeltaNet: chunked by the WY/UT transform,
  recurrent step, token-by-token reference;
* :mod:`.gdn2`: Gated DeltaNet-2 (erase and write gates, a decay per key channel): chunked by the WY/UT
  transform, recurrent step, token-by-token reference;
* :mod:`.softmax`: softmax attention over (possibly compressed) keys (PyTorch's fused kernel and an fp32
  reference).
"""
