"""fairseq's hub loader (``RobertaModel.from_pretrained``, ``TransformerLanguageModel.from_pretrained``...) on a
checkpoint of ours without ``bpe=``: fairseq's classes default to GPT-2's BPE, which it downloads ("No module named
'requests'" on a machine without it) and which does not match our sentencepiece dictionaries (with GPT-2's files at
hand, the text would be encoded into the wrong ids, silently). For checkpoints of our models only, the loader says
so at once and names the fix; every other checkpoint loads as fairseq loads it."""
import functools
import os


def our_model_class(path: str):
    """The class of our model that the checkpoint at ``path`` holds, or None (not a file, not ours, unreadable)."""
    if not os.path.isfile(path):
        return None
    from ..checkpoints.fit import model_class, saved_model_cfg

    try:
        return model_class(saved_model_cfg(path))
    except Exception:  # noqa: BLE001 - damaged or foreign: fairseq's own loading reports it
        return None


def naming_sentencepiece(from_pretrained):
    """Wraps ``fairseq.hub_utils.from_pretrained`` (every hub class's ``from_pretrained`` looks it up there)."""

    @functools.wraps(from_pretrained)
    def load(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", archive_map=None, **kwargs):
        if kwargs.get("bpe") == "gpt2":
            first = os.path.join(str(model_name_or_path), str(checkpoint_file).split(os.pathsep)[0])
            ours = our_model_class(first)
            if ours is not None:
                name = ours.__name__
                raise ValueError(
                    f"{first} holds a model of fairseq_linattn, whose dictionaries come from sentencepiece, and the "
                    f"hub loader was asked for GPT-2's BPE (fairseq's default): pass bpe='sentencepiece' (with "
                    f"sentencepiece.bpe.model beside the checkpoint, or sentencepiece_model='...'), or load it with "
                    f"fairseq_linattn's {name}.from_pretrained, which does by default")
        return from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, archive_map, **kwargs)

    load.patched_by_fairseq_linattn = True
    return load


def apply():
    from fairseq import hub_utils

    if not getattr(hub_utils.from_pretrained, "patched_by_fairseq_linattn", False):
        hub_utils.from_pretrained = naming_sentencepiece(hub_utils.from_pretrained)
