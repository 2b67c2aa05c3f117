import torch

from workbench.engine.memory import is_oom


def test_is_oom_recognises_out_of_memory_errors_only():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert is_oom(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: 8 bytes"))
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom(ValueError("CUDA out of memory."))  # not a runtime error: a bug, not memory
