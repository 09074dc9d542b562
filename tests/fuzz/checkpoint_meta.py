"""libFuzzer (atheris) target for the checkpoint `meta` parser
(flowjit.checkpoint.parse_meta): any text either parses to (shape of
non-negative ints, dtype name) or raises ValueError; what parses with a
known dtype formats back (format_meta) to text that parses to the same.
Run by `tools/dev.sh fuzz checkpoint_meta` with libFuzzer's arguments."""
import sys

import atheris

from flowjit import checkpoint  # noqa: E402  (not instrumented: numpy and the extension are big)

# Coverage from the parser's own functions only.
for _name in ("parse_meta", "_tokens", "_int", "format_meta"):
    setattr(checkpoint, _name, atheris.instrument_func(getattr(checkpoint, _name)))


def test_one_input(data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # load_variables reports undecodable meta as a CheckpointError before parsing
    try:
        shape, dtype = checkpoint.parse_meta(text)
    except ValueError:
        return
    assert isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape), shape
    assert isinstance(dtype, str), dtype
    np_dtype = checkpoint._TO_NUMPY.get(dtype)
    if np_dtype is None or dtype == "kChar":
        return
    again = checkpoint.parse_meta(checkpoint.format_meta(shape, checkpoint._numpy_dtype(dtype, "v", "fuzz")))
    assert again == (shape, dtype), (shape, dtype, again)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
