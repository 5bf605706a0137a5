"""kbroker: a Kafka-compatible broker (ZooKeeper mode) with a Python control plane and a Cython data path."""
import importlib.util as _util

__version__ = "0.1.0"


def _require_native() -> None:
    """The data path is native only (ext/, installed as kbroker._native): a source tree on sys.path
    without that build fails here, with the command that builds it, not deep in some import."""
    try:
        built = _util.find_spec("kbroker._native.batch") is not None
    except ImportError:
        built = False
    if not built:
        raise ImportError("kbroker's native extensions (kbroker._native) are not built: run scripts/setup.sh, "
                          "or 'pip install .' ('pip install -e .' for a working tree)")


_require_native()
