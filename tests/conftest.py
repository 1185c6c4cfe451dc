import os
import shutil

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors (tests/nn/test_ms_deform_triton.py).
# Triton reads this when its own modules are first imported, which importing torch's submodules
# already does: it must be set before anything else is imported.
if "TRITON_INTERPRET" not in os.environ and not os.path.exists("/dev/nvidia0"):
    os.environ["TRITON_INTERPRET"] = "1"
# make test runs two pytest workers (pytest-xdist) on the two cores: each computes on one thread, and so do the
# tools and DDP ranks they start (they inherit this). Two threads per worker oversubscribe the cores, and a
# small operator then waits a scheduler slice for its descheduled peer: 10-100x slower.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

#: the tests' own support modules (cli_runner, ddp_utils, the reference package, ...) import by name from
#: every folder of the suite, which mirrors the package (tests/models/detr/, tests/integration/, ...)
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

# two cores are shared by the whole suite; more threads only add contention
torch.set_num_threads(1 if WORKERS > 1 else min(2, os.cpu_count() or 1))
# the suite's own callbacks that its tool runs name (--trainer.callbacks+=ddp_utils.KillAfterStep): a config may
# name visiontf's and Lightning's classes only, and the environment admits a user's own (visiontf.cli.config_imports)
os.environ.setdefault("VISIONTF_IMPORTABLE", "batch_record,box_head_pin,ddp_utils,fsdp_probe,test_deterministic_training,"
                                             "test_dino_training,test_restoration_task")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


#: the process's ``torch.use_deterministic_algorithms`` setting before any test ran
_DETERMINISTIC_AT_START = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


@pytest.fixture(autouse=True)
def _restore_deterministic_algorithms():
    """Each test ends with the process's ``torch.use_deterministic_algorithms`` setting as the session found it.

    A ``Trainer(deterministic=True)`` fit in-process (``configs/vit/vit_tiny_synthetic.yaml`` asks for one; some
    files fit in module fixtures) turns it on for the rest of the process, and a later file on that worker then ran
    other kernels than it meant to test (the Triton backward's atomic-free sum in place of the atomic one)."""
    yield
    torch.use_deterministic_algorithms(_DETERMINISTIC_AT_START[0], warn_only=_DETERMINISTIC_AT_START[1])


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


def pytest_collection_modifyitems(config, items):
    """The tiers: everything under tests/integration/ (whole tools, DDP, FSDP, the demo, the web app, the
    documented walkthroughs) is ``integration``; ``slow`` is marked test by test."""
    integration = TESTS / "integration"
    for item in items:
        if integration in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
    _longest_files_first(items)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Files in the order: integration, then those with a ``slow`` test, then the rest (each file's tests kept together
    and in order).

    ``make test`` hands whole files to its two workers in collection order (``--dist loadfile
    --no-loadscope-reorder``; xdist's own reordering puts the files with the most tests first, which are quick
    unit files, and leaves the minute-long DDP and demo files for the end, where one worker runs them while the
    other idles). Long files first and many short ones last keep both workers busy to the end."""
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("integration"):
            return 0
        return 1 if item.path in slow_files else 2

    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    first_seen = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.path, i)
    items.sort(key=lambda item: (rank(item), first_seen[item.path]))
