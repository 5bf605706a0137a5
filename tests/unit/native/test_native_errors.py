"""ext/errors.pxd (the Kafka error codes native code uses) holds the same names and numbers as
kbroker.protocol.errors.Errors, the table the reference path answers with."""
import re
from pathlib import Path

from kbroker.protocol.errors import Errors

PXD = Path(__file__).resolve().parent.parent / "ext" / "errors.pxd"


def codes() -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+ERR_(\w+) = (-?\d+)\s*$", PXD.read_text(), re.M)}


def test_native_error_codes_match_the_protocol_table():
    found = codes()
    assert found, "no ERR_ constants parsed from ext/errors.pxd"
    for name, value in found.items():
        assert name in Errors.__members__, f"ERR_{name} is not a Kafka error of kbroker.protocol.errors"
        assert Errors[name] == value, f"ERR_{name} = {value}, Errors.{name} = {int(Errors[name])}"


def test_every_enum_line_parsed():
    # a line the pattern above skipped (a typo, a comment after the value) would escape the check
    body = PXD.read_text().split("cdef enum:", 1)[1]
    lines = [line for line in body.splitlines() if line.strip()]
    assert len(lines) == len(codes())
