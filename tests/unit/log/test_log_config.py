"""LogConfig accepts cleanup.policy as the broker config's list or Kafka's comma-separated text."""
import pytest

from kbroker.log.log import LogConfig


@pytest.mark.parametrize("value, expected", [
    (["compact"], {"compact"}),
    (["compact", "delete"], {"compact", "delete"}),
    ("compact,delete", {"compact", "delete"}),
    ("delete", {"delete"}),
])
def test_cleanup_policy_forms(value, expected):
    assert LogConfig({"cleanup.policy": value}).cleanup_policy == expected


def test_compact_only_is_not_mistaken_for_delete():
    # A substring test on "['compact']" would have found no "delete"; "compact,delete" must keep it.
    assert "delete" not in LogConfig({"cleanup.policy": ["compact"]}).cleanup_policy
    assert "delete" in LogConfig({"cleanup.policy": "compact, delete"}).cleanup_policy
