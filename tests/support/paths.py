"""Where the tests find the repository and their data files, wherever a test file sits under tests/."""
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
DATA = TESTS / "support" / "data"
