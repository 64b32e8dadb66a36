"""The attention math without the layers: tensors in, tensors out, each fast op beside its plain reference.

* :mod:`.linear_attn`: kernelized linear attention (chunked causal op, recurrent step, bidirectional form,
  ``naive`` references);
* :mod:`.softmax`: softmax attention over (possibly compressed) keys (PyTorch's fused kernel and an fp32
  reference).
"""
