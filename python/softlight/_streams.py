"""Stream handles from the objects users pass: ints, cuda.core Streams, anything with
``__cuda_stream__``, torch and CuPy streams. cuda-python (cuda.core) does the synchronising."""


from ._errors import ArgumentTypeError, InvalidArgumentError


def stream_handle(stream):
    """The raw CUstream/cudaStream_t handle (an int) that `stream` stands for."""
    if isinstance(stream, bool):
        raise ArgumentTypeError("softlight: stream must be an int handle or a stream object, not a bool")
    if isinstance(stream, int):
        if stream < 0:
            raise InvalidArgumentError(f"softlight: stream handle must be non-negative, got {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        version, handle = proto() if callable(proto) else proto
        return int(handle)
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy Stream, others
        h = getattr(stream, attr, None)
        if h is not None:
            return int(h)
    raise ArgumentTypeError(f"softlight: cannot take a CUDA stream from {type(stream).__qualname__}; pass an int "
                    "handle, a cuda.core Stream or an object with __cuda_stream__")


def _cuda_core():
    try:
        import cuda.core as cc
        cc.Device  # noqa: B018 - older releases keep the API under cuda.core.experimental
    except (ImportError, AttributeError):
        try:
            import cuda.core.experimental as cc
        except ImportError as e:
            raise ImportError("softlight: this needs cuda-python (streams, events, the GPU demo and bench): "
                              "pip install 'softlight[cuda]'") from e
    return cc


def synchronize(handle, device_id):
    """Wait on the host until the work queued on stream `handle` of device `device_id` is done."""
    cc = _cuda_core()
    dev = cc.Device(device_id)
    dev.set_current()
    if handle == 0:
        dev.sync()
    else:
        cc.Stream.from_handle(handle).sync()
