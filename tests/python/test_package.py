"""The package as a user imports it: `import softdot` imports neither torch nor
dask nor mpi4py, and softdot.torch, softdot.dask and softdot.distributed load
on first attribute access (PEP 562), as docs/python.md and the README write
them. Each check runs in a fresh interpreter, since this one has torch and
dask imported already."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_python(code: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=HERE
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_softdot_imports_no_optional_library():
    out = run_python(
        "import sys, softdot\n"
        "heavy = ('torch', 'dask', 'distributed', 'mpi4py', 'softdot.torch', 'softdot.dask',\n"
        "         'softdot.distributed')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    assert out == "[]"


def test_softdot_torch_after_plain_import():
    out = run_python(
        "import sys, softdot\n"
        "x = [[1.0, 2.0, 3.0]]\n"
        "import torch\n"
        "assert 'softdot.torch' not in sys.modules\n"
        "t = torch.tensor(x, dtype=torch.float64, requires_grad=True)\n"
        "y = softdot.torch.softmax(t, dim=-1)\n"
        "assert 'softdot.torch' in sys.modules\n"
        "assert softdot.torch is sys.modules['softdot.torch']\n"
        "y[0, 2].backward()\n"
        "ref = torch.softmax(t.detach(), dim=-1)\n"
        "assert torch.equal(y.detach(), softdot.softmax(t.detach()))\n"
        "g = ref[0, 2] * ((torch.arange(3) == 2).double() - ref[0])\n"
        "torch.testing.assert_close(t.grad[0], g, rtol=1e-15, atol=1e-16)\n"
        "print(type(y).__name__, softdot.torch.log_softmax.__module__)\n"
    )
    assert out == "Tensor softdot.torch"


def test_softdot_dask_after_plain_import():
    out = run_python(
        "import sys, numpy as np, softdot\n"
        "assert 'dask' not in sys.modules\n"
        "import dask.array as da\n"
        "x = np.array([[0.0, 1.0], [2.0, 2.0]])\n"
        "y = softdot.dask.softmax(da.from_array(x, chunks=1), axis=-1).compute(\n"
        "    scheduler='synchronous')\n"
        "assert np.array_equal(y, softdot.softmax(x)), y\n"
        "print('softdot.dask' in sys.modules, y[1, 0])\n"
    )
    assert out == "True 0.5"


def test_dir_lists_the_lazy_submodules_and_unknown_names_raise():
    out = run_python(
        "import sys, softdot\n"
        "d = dir(softdot)\n"
        "assert {'torch', 'dask', 'distributed', 'softmax', '__version__'} <= set(d), d\n"
        "assert d == sorted(d)\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n"
        "    softdot.frobnicate\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    assert out == "module 'softdot' has no attribute 'frobnicate'"


def test_lazy_dask_without_dask_says_what_to_install():
    out = run_python(
        "import sys\n"
        "sys.modules['dask'] = None\n"
        "import softdot\n"
        "try:\n"
        "    softdot.dask\n"
        "except ImportError as e:\n"
        "    print(str(e).splitlines()[0])\n"
    )
    assert out == (
        "softdot.dask needs dask's array module: pip install 'dask[array]' "
        "(and 'distributed' to run on a cluster)"
    )


def test_lazy_distributed_is_the_import_statement():
    """softdot.distributed by attribute gives what `import softdot.distributed`
    gives: the module where mpi4py and the MPI core are there, else the same
    ImportError saying what to install."""
    code = (
        "import softdot\n"
        "try:\n"
        "    {}\n"
        "    print('module', m.__name__, sorted(m.__all__)[:2])\n"
        "except ImportError as e:\n"
        "    print('ImportError', e)\n"
    )
    by_attribute = run_python(code.format("m = softdot.distributed"))
    by_import = run_python(code.format("import softdot.distributed as m"))
    assert by_attribute == by_import
    assert by_attribute.startswith(("module softdot.distributed", "ImportError"))
