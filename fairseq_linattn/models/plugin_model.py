"""What every model family of the plugin adds to its fairseq class (``class X(PluginModel, RobertaModel)``): a
checkpoint that does not fit is refused with its causes (:class:`..checkpoints.fit.ChecksCheckpointFit`), the
hub loader defaults to sentencepiece and says what is missing before fairseq fails on it, and TorchScript is refused
in one line."""
import os

from ..checkpoints.fit import ChecksCheckpointFit
from .registry import registered_name

SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"  # the name fairseq's hub loader looks for beside a checkpoint


class NotScriptableError(RuntimeError):
    pass


class PluginModel(ChecksCheckpointFit):
    def __prepare_scriptable__(self):
        """``torch.jit.script`` calls this on every module it is about to compile (a ``SequenceGenerator`` over our
        model included): our attention layers are eager PyTorch (recurrent states, chunked ops, per-mechanism Python),
        which TorchScript fails on deep inside with an error about some unsupported construct. Said at once instead."""
        raise NotScriptableError(
            f"{registered_name(type(self))} cannot be compiled by TorchScript (torch.jit.script): its attention layers "
            "are eager PyTorch. Generate with the SequenceGenerator as it is (fairseq-generate, fairseq-interactive, "
            "the hub's generate), which runs it eagerly")

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        bpe="sentencepiece", **kwargs):
        """fairseq's hub loader (``RobertaHubInterface`` for the encoders, ``GeneratorHubInterface`` with
        ``sample()``, ``translate()`` for the others). The tokenizer is sentencepiece by default (GPT-2's BPE
        would need a download): ``sentencepiece.bpe.model`` beside the checkpoint, or ``sentencepiece_model=``;
        ``bpe=None`` for none. ``max_target_positions=N`` and other model options override the checkpoint's."""
        check_hub_files(model_name_or_path, checkpoint_file, bpe, kwargs)
        return super().from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, bpe=bpe, **kwargs)


def check_hub_files(folder, checkpoint_file, bpe, kwargs):
    """The files from_pretrained needs, named with what to do when one is missing (fairseq fails on them with a
    TypeError about a NoneType, or inside sentencepiece)."""
    if not os.path.isdir(folder):
        if os.path.isfile(folder):  # an archive (model.tar.gz): fairseq unpacks it
            return
        raise FileNotFoundError(f"from_pretrained: {folder!r} is not a folder: pass the folder that holds the "
                                f"checkpoint ({checkpoint_file}), e.g. the --save-dir of fairseq-train")
    for name in checkpoint_file.split(os.pathsep):
        if not os.path.isfile(os.path.join(folder, name)):
            present = sorted(f for f in os.listdir(folder) if f.endswith(".pt"))
            raise FileNotFoundError(f"from_pretrained: no {name} in {folder}; its checkpoints: "
                                    f"{', '.join(present) or 'none'} (pass one as checkpoint_file)")
    if bpe == "sentencepiece" and not kwargs.get("sentencepiece_model"):
        if not os.path.isfile(os.path.join(folder, SENTENCEPIECE_MODEL)):
            raise FileNotFoundError(
                f"from_pretrained: no {SENTENCEPIECE_MODEL} in {folder}: copy the sentencepiece model the data was "
                f"encoded with there, or pass sentencepiece_model='path/to/its.model' (bpe=None: no tokenizer)")
