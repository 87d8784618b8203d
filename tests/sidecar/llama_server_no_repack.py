"""Run llama-cpp-python's server (same arguments as `python -m llama_cpp.server`) with weight
repacking off, as llama-server's `--no-repack` does.

Why: llama.cpp built with -march=native on a machine whose CPUID advertises AMX repacks weights
for AMX tile kernels; where the hypervisor does not really enable AMX (the Firecracker VMs these
tests run on), the first generation dies of SIGILL (`tilezero`). Plain AVX-512 kernels answer the
same, and for a 270M model just as fast.
"""

import runpy

from llama_cpp import llama_cpp

_default_model_params = llama_cpp.llama_model_default_params


def _without_repacking() -> llama_cpp.llama_model_params:
    params = _default_model_params()
    params.use_extra_bufts = False  # the "extra buffer types" are the repacked (AMX) weights
    return params


llama_cpp.llama_model_default_params = _without_repacking
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
