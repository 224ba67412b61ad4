import os

# JAX takes most of the GPU's memory when it first runs unless told not to; the GPU tests share
# the device between torch, CuPy and JAX.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
