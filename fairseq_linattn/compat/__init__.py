"""The fixes to fairseq 0.12 (``fairseq-fixed==0.12.3.1``) that this plugin owns.

Each fix is applied once, when the plugin is imported (``--user-dir`` imports it before fairseq loads any
checkpoint or starts any worker), is narrow, and names the fairseq trap it closes; docs/troubleshooting.md
and docs/reliability.md list them.

* :mod:`.checkpoints`: safe loading (``weights_only=True`` with an allow-list), atomic copies to
  ``checkpoint_last.pt``, resuming from the newest intact checkpoint, a missing ``--restore-file`` is an error.
* :mod:`.distributed`: CPU workers (spawn, torchrun, DDP), workers that die with their parent, a message
  when one dies, FSDP refused without CUDA.
* :mod:`.data`: numpy 2's missing ``np.compat``; "every sample was too long" and "0 tokens evaluated" are errors.
* :mod:`.cli`: ``--help`` lists the options of the arch, task and criterion the command line names; mistakes
  fairseq finds late are one line when the command line is parsed.
* :mod:`.generation`: a length capped at the model's positions is a warning naming the override, a min_len above it
  an error.
* :mod:`.interactive`: fairseq-interactive skips a line too long for the model, and replaces bytes that are not
  UTF-8, with a warning each, and reads on.
* :mod:`.scoring`: no "BLEU on BPE tokens" warning where fairseq-generate scores sentencepiece output as text.
"""
from . import checkpoints, cli, data, distributed, generation, interactive, scoring

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
    _APPLIED = True
