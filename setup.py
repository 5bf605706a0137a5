"""Build of kbroker's native data path.

Every ``ext/<name>.pyx`` becomes the extension ``kbroker._native.<name>``; the small C
helpers in ``ext/*.c`` (CRC32C) are compiled into each module that needs them. The native
build is required: a compiler or Cython error fails ``pip install`` loudly, there is no
slow pure-Python fallback in production.

Environment:
  KBROKER_DEBUG=1   annotate HTML, line tracing, bounds checks, -O0 -g
  KBROKER_OPT=-O0   the C optimisation level of a normal build (default -O3; -O0 compiles ~4x faster)
"""
import glob
import os
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DEBUG = os.environ.get("KBROKER_DEBUG") == "1"
OPT = os.environ.get("KBROKER_OPT", "-O3")

# The installable package is kbroker/; the other top-level folders are mapped into it so
# the layout shows the data flow while one `pip install .` ships everything.
PACKAGE_DIR = {
    "kbroker._native": "ext",
    "kbroker.zk": "zk",
    "kbroker.spark": "spark",
    "kbroker.perf": "perf",
}

# C sources each extension links (beyond its own .pyx).
C_DEPS = {
    "crc": ["ext/crc32c.c"],
    "batch": ["ext/crc32c.c"],
    "segment": ["ext/crc32c.c"],
    "cleaner": ["ext/crc32c.c"],
    "arrow": ["ext/crc32c.c"],
}

# Extensions that link a system library and are built only when its headers are found: without
# them the broker works on a slower path (tls: TLS records read through Python's ssl).
OPTIONAL = {"tls": ("openssl/ssl.h", ["ssl", "crypto"])}


def extensions():
    cflags = ["-Wall", "-Wno-unused-function", "-Wno-unreachable-code"]
    cflags += ["-O0", "-g"] if DEBUG else [OPT]
    macros = [("CYTHON_TRACE", "1")] if DEBUG else []
    exts = []
    include_dirs = compiler_include_dirs()
    for pyx in sorted(glob.glob("ext/*.pyx")):
        name = os.path.splitext(os.path.basename(pyx))[0]
        header, libraries = OPTIONAL.get(name, (None, []))
        if header and not any(os.path.isfile(os.path.join(d, header)) for d in include_dirs):
            print(f"kbroker: {header} not found: kbroker._native.{name} is not built")
            continue
        exts.append(Extension(
            f"kbroker._native.{name}",
            [pyx] + C_DEPS.get(name, []),
            include_dirs=["ext"],
            libraries=libraries,
            extra_compile_args=cflags,
            define_macros=macros,
        ))
    return exts


# C headers of the compression libraries ext/ links (zlib, liblz4, libzstd) -> their Debian package.
COMPRESSION_HEADERS = {"zlib.h": "zlib1g-dev", "lz4.h": "liblz4-dev", "zstd.h": "libzstd-dev"}


def compiler_include_dirs(extra=()) -> list[str]:
    """Where the C compiler looks for system headers: ``extra`` (build_ext --include-dirs), CPATH and
    C_INCLUDE_PATH, then the standard directories (with Debian's multiarch one)."""
    dirs = list(extra)
    for var in ("CPATH", "C_INCLUDE_PATH"):
        dirs += [d for d in os.environ.get(var, "").split(os.pathsep) if d]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    dirs += ["/usr/local/include"] + ([f"/usr/include/{multiarch}"] if multiarch else []) + ["/usr/include"]
    return dirs


def check_compression_headers(include_dirs) -> None:
    """Stop the build with one line naming the packages to install when a compression header is
    missing, before the compiler would fail on it with a page of errors."""
    missing = [h for h in COMPRESSION_HEADERS
               if not any(os.path.isfile(os.path.join(d, h)) for d in include_dirs)]
    if missing:
        raise SystemExit(f"kbroker: the C headers {', '.join(missing)} are missing; install them with "
                         f"'apt-get install {' '.join(COMPRESSION_HEADERS.values())}' (or run scripts/setup.sh)")


def _pxd_tree() -> str:
    """Cython finds a module's .pxd by its dotted name (kbroker/_native/<name>.pxd on the include path),
    but ext/ is mapped to kbroker._native only at install time. Mirror ext/*.pxd into a package-shaped
    tree under build/ so each module gets its own .pxd and others can cimport kbroker._native.<name>."""
    root = os.path.join("build", "pxd")
    pkg = os.path.join(root, "kbroker", "_native")
    os.makedirs(pkg, exist_ok=True)
    for init in (os.path.join(root, "kbroker", "__init__.pxd"), os.path.join(pkg, "__init__.pxd")):
        open(init, "a").close()
    for pxd in glob.glob("ext/*.pxd"):
        link = os.path.join(pkg, os.path.basename(pxd))
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.abspath(pxd), link)
    return root


class BuildExt(build_ext):
    """Cythonize at build time with the project's directives set in one place."""

    def finalize_options(self):
        from Cython.Build import cythonize

        check_compression_headers(compiler_include_dirs(self.include_dirs or ()))

        directives = {
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
        }
        if DEBUG:
            directives.update(linetrace=True, boundscheck=True, wraparound=True)
        self.distribution.ext_modules = cythonize(
            self.distribution.ext_modules,
            compiler_directives=directives,
            include_path=[_pxd_tree(), "ext"],
            annotate=DEBUG,
            quiet=True,
            nthreads=os.cpu_count() or 1,
        )
        if OPT != "-O3" and self.build_temp is None:
            # objects of another level apart: a later default build must not link them as up to date
            self.build_temp = os.path.join("build", f"temp{OPT}")
        if self.parallel is None:
            # the C compiles are independent: one job per core (2 cores: ~half the build time)
            self.parallel = os.cpu_count() or 1
        super().finalize_options()


def _packages():
    pkgs = []
    for root, dirs, files in os.walk("kbroker"):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        if "__init__.py" in files:
            pkgs.append(root.replace(os.sep, "."))
    return pkgs + list(PACKAGE_DIR)


# build_meta (pip) and `python setup.py` run this file as __main__; tests import its checks.
if __name__ == "__main__":
    setup(
        packages=_packages(),
        # Spark 4 auto-registers the DefaultSource of an installed top-level module pyspark_<name>.
        py_modules=["pyspark_kbroker"],
        package_dir=PACKAGE_DIR,
        package_data={
            "kbroker._native": ["*.pyi", "*.pxd", "py.typed"],
            "kbroker.zk": ["*.cfg.in"],
            "kbroker": ["py.typed", "config/*.properties"],
        },
        ext_modules=extensions(),
        cmdclass={"build_ext": BuildExt},
        zip_safe=False,
    )
