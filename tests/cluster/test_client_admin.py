"""kbroker's own admin client against a real broker: incremental and legacy config changes land on the
topic (DescribeConfigs shows them), and a bad key comes back as INVALID_CONFIG."""
import asyncio
import uuid

import pytest

from kbroker.client import Admin, ConfigResource, KafkaError, NewTopic
from kbroker.client.admin import DELETE, SET
from kbroker.protocol.errors import Errors


def test_alter_configs_incremental_and_legacy(bootstrap):
    topic = f"cfg-{uuid.uuid4().hex[:8]}"
    res = ConfigResource.topic(topic)

    async def go():
        async with Admin(bootstrap) as admin:
            await admin.create_topics([NewTopic(topic, 1, 1)])

            async def overrides():
                entries = (await admin.describe_configs([res]))[res]
                return {k: e.value for k, e in entries.items() if k in ("retention.ms", "segment.bytes")}

            await admin.incremental_alter_configs({res: {"retention.ms": (SET, "3600000"),
                                                         "segment.bytes": (SET, "1048576")}})
            after_set = await overrides()
            await admin.incremental_alter_configs({res: {"segment.bytes": (DELETE, None)}})
            after_delete = await overrides()
            # The legacy API replaces the whole override set: retention.ms goes back to the default.
            await admin.alter_configs({res: {"segment.bytes": "2097152"}})
            after_replace = await overrides()
            with pytest.raises(KafkaError) as bad:
                await admin.incremental_alter_configs({res: {"no.such.config": (SET, "1")}})
            return after_set, after_delete, after_replace, bad.value

    after_set, after_delete, after_replace, bad = asyncio.run(asyncio.wait_for(go(), 60))
    assert after_set == {"retention.ms": "3600000", "segment.bytes": "1048576"}
    assert after_delete["retention.ms"] == "3600000" and after_delete["segment.bytes"] == "1073741824"
    assert after_replace["segment.bytes"] == "2097152" and after_replace["retention.ms"] == "604800000"
    assert bad.error == Errors.INVALID_CONFIG and "no.such.config" in str(bad)
