"""The benchmarks, on one runner (:mod:`.runner`): each module declares its cases, lengths and ratios, and
``python scripts/bench_<name>.py`` runs it side by side and
writes ``results/<name>.md``, ``.json`` and ``.png``.

* :mod:`.causal_op`: the causal linear-attention op against its reference, SDPA and fast-transformers;
* :mod:`.lm_training`: a training step of linear_transformer_lm against transformer_lm, with floors;
* :mod:`.decoding`: per-token latency against position (RNN state against KV cache);
* :mod:`.linformer`: the Linformer paper's Table 3 against RoBERTa and fairseq's examples/linformer.
"""
