"""The causal mechanisms of ``--linear-attention`` besides kernel attention: one module each, registered with
``@register_linear_attention(name)`` (:mod:`..recurrent_state`). Importing this folder imports every module in
it, so a new file here is a new choice of ``--linear-attention``, of ``linear_transformer_lm_<name>`` and of the
benchmarks; :func:`..recurrent_state.linear_attentions` imports it on first use."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
