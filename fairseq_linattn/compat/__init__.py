"""The fixes to fairseq 0.12 (``fairseq-fixed==0.12.3.1``) that this plugin owns, and the rule they follow.

The rule: a plugin adds; it never alters. Importing it must not change what fairseq does for its own models.

1. **Process-wide, only what fairseq needs to run at all on this stack**: loading checkpoints under torch >= 2.6
   (``weights_only=True`` with fairseq's allow-list, :mod:`.checkpoints`), numpy 2's missing ``np.compat``
   (:mod:`.data`), ``--bf16`` without torch_xla and CPU workers (torchrun, DDP, ``--cpu --distributed-world-size``,
   :mod:`.distributed`), and what writes or ends the same work more safely (atomic copies to ``checkpoint_last.pt``,
   workers that die with their parent).
2. **Process-wide, the same failure told sooner**: where fairseq fails anyway, the plugin may fail at start-up with one
   line naming the cause instead (a ``--path`` that is missing or no checkpoint, fully sharded training without
   CUDA, a checkpoint error behind fairseq's "Cannot load model parameters"). Whether a command fails never changes.
3. **Every behaviour change applies to the plugin's own runs only** (:mod:`.scope`: its models, tasks and criteria,
   checkpoints of its models), or to every run with the one opt-in ``FAIRSEQ_LINATTN_ALL_MODELS=1``: resuming from
   an older checkpoint, refusing a missing ``--restore-file``, skipping too-long or undecodable interactive lines,
   warnings about capped lengths, option checks at start-up, ``--help`` with the model's options, refusing to
   evaluate zero tokens, dropping a wrong BLEU warning.

Where a patch is needed at all it goes to the narrowest public place (a module attribute a command looks up, a
public method), never to a method TorchScript compiles (``SequenceGenerator._generate``). Each fix is applied once,
when the plugin is imported (``--user-dir`` imports it before fairseq loads any checkpoint or starts any worker).
``scripts/fairseq_upstream_tests.py`` runs fairseq's own tests with and without the plugin; docs/reliability.md
lists what it ran and what differs.

* :mod:`.checkpoints`: safe loading, atomic copies (1); resuming from the newest intact checkpoint, a missing
  ``--restore-file`` is an error (3).
* :mod:`.distributed`: CPU workers, workers that die with their parent (1); a message when one dies, FSDP refused
  without CUDA (2); every command started through ``call_main`` runs in a :func:`.scope.run`.
* :mod:`.data`: ``np.compat`` (1); "every sample was too long" and "0 tokens evaluated" are errors (3).
* :mod:`.cli`: a ``--path`` that cannot be loaded is one line (2); ``--help`` lists the named model's options, and
  mistakes fairseq finds late are one line when the command line is parsed (3).
* :mod:`.generation`: a length capped at the model's positions is a warning naming the override, a min_len above it
  an error (3).
* :mod:`.interactive`: fairseq-interactive skips a line too long for the model, and replaces bytes that are not
  UTF-8, with a warning each, and reads on (3).
* :mod:`.scoring`: no "BLEU on BPE tokens" warning where fairseq-generate scores sentencepiece output as text (3).
* :mod:`.registry`: a module that registers one of our model names (fairseq's ``examples/linformer``) gets it.
* :mod:`.hub`: fairseq's hub classes on a checkpoint of ours without ``bpe=`` (GPT-2's BPE) say
  ``bpe='sentencepiece'`` at once (2).
"""
from . import checkpoints, cli, data, distributed, generation, hub, interactive, registry, scoring

_APPLIED = False


def apply_fairseq_fixes():
    global _APPLIED
    if _APPLIED:
        return
    checkpoints.apply()
    distributed.apply()
    data.apply()
    cli.apply()
    generation.apply()
    interactive.apply()
    scoring.apply()
    registry.apply()
    hub.apply()
    _APPLIED = True
