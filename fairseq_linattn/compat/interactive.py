"""fairseq-interactive reads on after a line it cannot use, saying so in one warning line.

fairseq 0.12 ended the whole session (the model loaded, the lines before) with a traceback on:

* a line longer than the model's positions: "Size of sample #0 is invalid" without
  ``--skip-invalid-size-inputs-valid-test``, and with it the plugin's NothingToEvaluateError (the buffer holds one
  line, and all of it was dropped: the refusal meant for fairseq-eval-lm and fairseq-validate). Such a line is now
  skipped with a warning that names the option which lets the model read it, and the session goes on; with the
  flag or without (it is meant for data sets: a session should not end for one line).
* bytes that are not UTF-8 (a Latin-1 file, a binary pasted in): sentencepiece failed on the surrogate-escaped
  string ("Unable to cast Python instance of type <class 'str'>"), or fairseq's reader raised UnicodeDecodeError
  (``--input`` files, strict locales). Each line is now read as bytes and decoded with U+FFFD in place of what is
  not UTF-8, with a warning. Replaced rather than refused: the rest of the line is still the user's text (one
  Latin-1 "é" should not cost the whole line), and every input line keeps its output, numbered as fairseq numbers
  them (S-n, H-n), for whoever pairs outputs with inputs. What the model then reads depends on the tokenizer:
  sentencepiece drops U+FFFD (the S- line shows the text without it), a plain dictionary makes it <unk>.

Both apply to sessions of our models (:mod:`.scope`; fairseq-interactive runs inside a scope's ``run``); fairseq's own
models read their lines as fairseq reads them, unless ``FAIRSEQ_LINATTN_ALL_MODELS=1``. A standard input that is a text
stream (fairseq's own tests set a ``StringIO``) has no bytes to decode: its lines are read as they are.
"""
import functools
import logging
import sys

from . import data, scope
from .generation import model_overrides

logger = logging.getLogger("fairseq_cli.interactive")


class Lines(list):
    """A buffer of input lines, knowing the line number of its first one (for the warnings)."""

    def __init__(self, first: int):
        super().__init__()
        self.first = first


def buffered_read(input, buffer_size):
    """fairseq's ``buffered_read`` (lines of ``--input``, ``-`` for stdin, stripped, in buffers of
    ``buffer_size``), reading bytes and replacing what is not UTF-8."""
    buffer = Lines(first=1)
    for number, line in enumerate(_decoded_lines(input), 1):
        buffer.append(line.strip())
        if len(buffer) >= buffer_size:
            yield buffer
            buffer = Lines(first=number + 1)
    if len(buffer) > 0:
        yield buffer


def _decoded_lines(input):
    """The lines of ``input`` as text: bytes decoded as UTF-8, with U+FFFD (and a warning) for what is not."""
    if input == "-" and not hasattr(sys.stdin, "buffer"):  # a text stream put in place of stdin: already decoded
        yield from sys.stdin
        return
    stream = sys.stdin.buffer if input == "-" else open(input, "rb")
    try:
        for number, raw in enumerate(stream, 1):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as error:
                logger.warning(f"line {number} is not UTF-8 ({error.reason} at byte {error.start + 1}): read with "
                               f"U+FFFD in place of the bytes that are not (the S-{number - 1} line shows what the "
                               f"model got)")
                yield raw.decode("utf-8", errors="replace")
    finally:
        if input != "-":
            stream.close()


def ours_or_fairseqs(ours, fairseqs):
    """``ours`` in a session of our models (:func:`.scope.applies`), fairseq's function otherwise."""

    def read_or_batch(*args, **kwargs):
        return (ours if scope.applies() else fairseqs)(*args, **kwargs)

    read_or_batch.__wrapped__ = fairseqs
    return read_or_batch


def skipping_long_lines(make_batches):
    """Wraps fairseq-interactive's ``make_batches``: lines longer than the model accepts are skipped with a warning
    (:func:`say_skipped`) instead of ending the session."""

    def batches(lines, cfg, task, max_positions, encode_fn):
        token = data.ON_TOO_LONG.set(functools.partial(say_skipped, getattr(lines, "first", 1), task))
        try:
            yield from make_batches(lines, cfg, task, max_positions, encode_fn)
        finally:
            data.ON_TOO_LONG.reset(token)

    batches.__wrapped__ = make_batches
    return batches


def say_skipped(first, task, dataset, ignored, max_positions):
    """One warning per line too long for the model: its size, the limit, and how to load the model to read it."""
    for index in ignored:
        size = dataset.size(index)
        size = size[0] if isinstance(size, tuple) else size  # translation: (source, target); a line has no target
        if isinstance(max_positions, tuple):
            limit, key = max_positions[0], "max_source_positions"
        else:
            limit, key = max_positions, "max_target_positions"
        wanted = 1 << (int(size) - 1).bit_length()  # the next power of two
        option = model_overrides(key, wanted)
        if task.max_positions() is not None:  # the task's limit (from this command line) counts too
            option = f"--{key.replace('_', '-')} {wanted} {option}"
        logger.warning(f"line {first + int(index)} skipped: {int(size)} tokens, more than the {limit} positions "
                       f"allowed; linear_transformer_lm and linear_transformer (linear in the length, with positions "
                       f"that extend) read it with {option}")


def apply():
    import fairseq_cli.interactive

    make_batches = fairseq_cli.interactive.make_batches
    fairseq_cli.interactive.buffered_read = ours_or_fairseqs(buffered_read, fairseq_cli.interactive.buffered_read)
    fairseq_cli.interactive.make_batches = ours_or_fairseqs(skipping_long_lines(make_batches), make_batches)
