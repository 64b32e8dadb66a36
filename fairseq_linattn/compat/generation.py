"""fairseq's generation says when it stops short of the length asked for.

``SequenceGenerator`` caps every output at the model's ``max_decoder_positions() - 1`` tokens (63 for a language
model trained on 64-token samples), whatever ``max_len_a`` / ``max_len_b`` ask for, and says nothing; a ``min_len``
above the cap failed with a bare assertion ("min_len cannot be larger than max_len"). Our decoders are recurrent (a
state of one size at every position: kernel attention, the decaying and delta-rule states, the translation
decoder's source summary), so their only limit is the positions they are loaded with, ``max_target_positions``:
``from_pretrained(..., max_target_positions=N)`` and ``--model-overrides "{'max_target_positions': N}"`` raise it
(sinusoidal positions, fairseq's default, extend to any length; a checkpoint with learned positions refuses the
override when it is loaded, naming them). So:

* a capped length is one warning (once per generator: a hub call, a fairseq-generate or fairseq-interactive run)
  that names the cap and the override;
* ``min_len`` above the cap is an error that names the same (one line from fairseq-generate and
  fairseq-interactive, a ValueError from the hub).

Only for our models (:mod:`.scope`): fairseq's own (softmax ``transformer_lm``...) generate as fairseq made them,
silently capped and with its assertion, unless ``FAIRSEQ_LINATTN_ALL_MODELS=1`` (then the warning comes without the
advice: more positions there mean a key/value cache that grows with them, and positions never trained at).

The check runs in ``SequenceGenerator.generate``, the entry of the hub, fairseq-generate and fairseq-interactive
(``task.inference_step``), and not in ``_generate``, which TorchScript compiles with ``forward``: a Python wrapper there
made ``torch.jit.script(SequenceGenerator(...))`` fail for every model.
"""
import logging
import sys

from . import scope

logger = logging.getLogger(__name__)

COMMANDS = ("fairseq-generate", "fairseq-interactive")  # their main()s turn GenerationLengthError into one line


class GenerationLengthError(ValueError):
    pass


def model_overrides(key: str, value: int) -> str:
    """The command-line option that loads a checkpoint with ``key`` (a model option) set to ``value``."""
    return f"--model-overrides \"{{'{key}': {value}}}\""


def _longer(value: int) -> str:
    return (f"linear_transformer_lm and linear_transformer decode as an RNN (a state of one size at every position) "
            f"and go further when loaded with more positions: from_pretrained(..., max_target_positions={value}) or "
            f"{model_overrides('max_target_positions', value)}")


def check_length(generator, sample):
    """Before ``generator`` runs on ``sample``: warn once if fairseq will cap the output below the length asked
    for; raise :class:`GenerationLengthError` if ``min_len`` is above that cap (fairseq would assert)."""
    if generator.match_source_len:
        return
    net_input = sample["net_input"]
    source = next((net_input[k] for k in ("src_tokens", "source", "features") if k in net_input), None)
    if source is None:  # fairseq's own error follows
        return
    ours = scope.models_are_ours(generator.model.models)
    if not (ours or scope.applies()):  # fairseq's own models: capped silently, as fairseq made them
        return
    asked = int(generator.max_len_a * source.size(1) + generator.max_len_b)
    cap = generator.max_len - 1
    why = f"fairseq stops every output at the model's max_target_positions ({generator.max_len}) - 1"
    if generator.min_len > cap:
        advice = f": {_longer(generator.min_len + 1)}" if ours else ""
        raise GenerationLengthError(f"min_len={generator.min_len} asks for more than the {cap} tokens this model "
                                    f"generates ({why}){advice}")
    if asked > cap and not getattr(generator, "_length_cap_said", False):
        generator._length_cap_said = True
        advice = f". {_longer(asked + 1)}" if ours else ""
        logger.warning(f"generating at most {cap} tokens, not the {asked} asked for (max_len_a * source length + "
                       f"max_len_b): {why}{advice}")


def saying_when_capped(generate):
    """Wraps ``SequenceGenerator.generate(models, sample, ...)`` with :func:`check_length`."""

    def checked_generate(self, models, sample, **kwargs):
        check_length(self, sample)
        return generate(self, models, sample, **kwargs)

    checked_generate.__wrapped__ = generate
    return checked_generate


def one_line_length_errors(main, command):
    """Wraps a command's ``main(cfg)``: the command is a :func:`.scope.run`, and a :class:`GenerationLengthError` is
    argparse's ``<command>: error: <message>`` and exit status 2 (the command line asked for it), not a traceback."""

    def run(cfg, *args, **kwargs):
        try:
            with scope.run(cfg):
                return main(cfg, *args, **kwargs)
        except GenerationLengthError as error:
            sys.stdout.flush()
            sys.stderr.write(f"{command}: error: {error}\n")
            sys.exit(2)

    run.__wrapped__ = main
    return run


def apply():
    from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

    for generator in (SequenceGenerator, SequenceGeneratorWithAlignment):  # (the second has its own generate)
        generator.generate = saying_when_capped(generator.generate)
    import fairseq_cli.generate
    import fairseq_cli.interactive

    for command, module in zip(COMMANDS, (fairseq_cli.generate, fairseq_cli.interactive)):
        module.main = one_line_length_errors(module.main, command)
