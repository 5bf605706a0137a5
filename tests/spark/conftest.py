import pytest


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the in-process Spark tests of a test process (starting one is a JVM
    start: seconds of CPU). local[2,2]: two cores, a failed task is retried once (the retry test needs
    that); Arrow batches of 500 rows (the partitioner tests count on several per task)."""
    from spark_util import make_session
    s = make_session("kbroker-spark-tests", master="local[2,2]",
                     extra={"spark.sql.execution.arrow.maxRecordsPerBatch": "500"})
    yield s
    s.stop()
