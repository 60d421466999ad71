"""CPU backend (Cython kernels). Kernels are added as ``.pyx`` files beside this one."""
