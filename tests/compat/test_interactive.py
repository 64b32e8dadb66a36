"""fairseq-interactive's reader (compat/interactive.py) on an --input file: bytes that are not UTF-8 become U+FFFD
with one warning naming the line, and each buffer knows its first line's number (the end-to-end tests read stdin)."""
import logging

from fairseq_linattn.compat import interactive


def test_an_input_file_that_is_not_utf8_is_read_with_replacements(tmp_path, caplog):
    path = tmp_path / "input.txt"
    path.write_bytes(b"one\ncaf\xe9 au lait\n three \n\xff\n")  # fairseq's reader raised UnicodeDecodeError
    with caplog.at_level(logging.WARNING, logger=interactive.logger.name):
        buffers = list(interactive.buffered_read(str(path), 2))
    assert buffers == [["one", "caf\ufffd au lait"], ["three", "\ufffd"]]
    assert [buffer.first for buffer in buffers] == [1, 3]
    warnings = [record.getMessage() for record in caplog.records if record.name == interactive.logger.name]
    assert [w.split(" (")[0] for w in warnings] == ["line 2 is not UTF-8", "line 4 is not UTF-8"]
    assert "read with U+FFFD in place of the bytes that are not (the S-1 line shows what the model got)" in warnings[0]
