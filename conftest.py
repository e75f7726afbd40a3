"""pytest configuration shared by the unit tests and ``pytest --nbval``.

* Cells tagged ``gpu`` are skipped when Warp sees no CUDA device (they must feed no later cell).
* The autotune cache is a fresh, empty file path: a developer's cache must not change which kernels run; on the
  CPU ``auto`` measures nothing (``FOVI_KNN_AUTO_MEASURE=off``): its picks are the estimate's, on every machine.
* stderr streams are not compared: on CPU machines Warp's native driver prints a "could not load
  the CUDA driver" line to stderr, and warnings carry paths; what a notebook teaches goes to stdout.
"""

import os
import tempfile

os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
# a tune cache of the developer's (python -m fovi_lab tune) must not change which kernels the tests run
os.environ["FOVI_TUNE_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="fovi-tests-"), "tune.json")
# on the CPU auto runs the estimate's pick, the same on every machine (tests that measure turn it on themselves)
os.environ.setdefault("FOVI_KNN_AUTO_MEASURE", "off")


def _cuda_available() -> bool:
    try:
        from fovi_lab.kernels.common import init_warp, wp

        init_warp()                     # quietly: no missing-driver line on a CPU machine
        return wp.is_cuda_available()
    except Exception:
        return False


def _drop_stderr(outputs):
    return [o for o in outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]


try:
    from nbval.plugin import IPyNbCell
except ImportError:  # nbval not installed: plain unit-test runs
    IPyNbCell = None
else:
    _compare = IPyNbCell.compare_outputs

    def _compare_without_stderr(self, test, ref, skip_compare=None):
        return _compare(self, _drop_stderr(test), _drop_stderr(ref), skip_compare)

    IPyNbCell.compare_outputs = _compare_without_stderr


def pytest_collection_modifyitems(config, items):
    if IPyNbCell is None:
        return
    gpu = None
    for item in items:
        if isinstance(item, IPyNbCell) and "gpu" in (item.cell.metadata.get("tags") or []):
            if gpu is None:
                gpu = _cuda_available()
            if not gpu:
                item.options["skip"] = True
