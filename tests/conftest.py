import os
import shutil

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors (tests/test_ms_deform_triton.py).
# Triton reads this when its own modules are first imported, which importing torch's submodules
# already does: it must be set before anything else is imported.
if "TRITON_INTERPRET" not in os.environ and not os.path.exists("/dev/nvidia0"):
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

# two cores are shared by the whole suite; more threads only add contention
torch.set_num_threads(min(2, os.cpu_count() or 1))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module", autouse=True)
def _free_module_tmp_dirs(request, tmp_path_factory):
    """Remove what a module wrote under the base temp dir once it is done, unless one of its tests failed.

    The suite writes about 9 GB (checkpoints, exports, datasets); pytest keeps module-scoped directories
    until the session ends, and a CI disk with a few GB free ran out halfway. Passed tests' `tmp_path`
    directories go at once (`tmp_path_retention_policy = "failed"` in pyproject.toml).
    """
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed == failed_before:
        for path in set(base.iterdir()) - before:
            shutil.rmtree(path, ignore_errors=True)
