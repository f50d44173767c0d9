"""Run-time compilation and launch of the CUDA C++ kernels in ``csrc/`` (NVRTC through ``cuda.core``; optional:
``pip install speechkernels[cuda]``, Hopper or newer for the thread-block clusters).

The kernels are compiled per configuration: their sizes and options are integer ``#define``s put in front of the
source, so that every loop over them unrolls. A cluster kernel's text is its ``#define``s, then the shared device
helpers of ``csrc/cluster_common.cuh`` (cluster rank, DSMEM addresses, mbarriers, the fast tanh), then its own
``.cu`` file, each after a blank line. ``cuda.core`` is imported only when a kernel is compiled or launched.
"""

from __future__ import annotations

import importlib.resources

import torch

CLUSTER_HEADER = "cluster_common.cuh"  # the device helpers every cluster kernel is compiled after


def clusters_available() -> bool:
    """Whether the cluster kernels can run here: cuda.core importable and a CUDA GPU of compute capability 9.0
    or newer (queried when called, never at import)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        import cuda.core  # noqa: F401
    except ImportError:
        return False
    return True


def cuda_core():
    """The ``cuda.core`` module (cuda-core < 0.4 kept the API under ``cuda.core.experimental``)."""
    try:
        import cuda.core as core
    except ImportError:
        import cuda.core.experimental as core
    return core


def device_arch(device=None) -> str:
    """NVRTC's target for ``device``: "sm_90" on an H100."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def read_source(filename: str) -> str:
    """The text of ``csrc/<filename>``, shipped as package data."""
    return importlib.resources.files(__package__).joinpath("csrc", filename).read_text()


def compile_kernel(name: str, source: str, arch: str, defines: dict | None = None, cluster_size: int = 1):
    """Kernel ``name`` compiled by NVRTC for ``arch`` from the integer ``#define``s followed by ``source``;
    clusters of more than 8 CTAs allowed where ``cluster_size`` asks for them."""
    core = cuda_core()
    text = "".join(f"#define {k} {int(v)}\n" for k, v in (defines or {}).items()) + source
    opts = core.ProgramOptions(arch=arch, std="c++17", name=name)
    kernel = core.Program(text, "c++", opts).compile("cubin").get_kernel(name)
    allow_cluster_size(kernel, cluster_size)
    return kernel


def compile_cluster_kernel(
    name: str, filename: str, arch: str, defines: dict, cluster_size: int, headers: tuple[str, ...] = ()
):
    """Kernel ``name`` of ``csrc/<filename>``, compiled after ``csrc/cluster_common.cuh`` and then ``headers``
    (see ``compile_kernel``). The header's ``ACQ`` (the mbarrier wait's semantics) is 0 unless ``defines`` sets
    it."""
    if "ACQ" not in defines:
        defines = {**defines, "ACQ": 0}
    source = "".join("\n" + read_source(f) for f in (CLUSTER_HEADER, *headers, filename))
    return compile_kernel(name, source, arch, defines, cluster_size)


def allow_cluster_size(kernel, cluster_size: int) -> None:
    """Clusters of more than 8 CTAs are opt-in (Hopper allows 16)."""
    if cluster_size > 8:
        _set_attribute(
            kernel,
            "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED",
            1,
            f"clusters of C={cluster_size} CTAs are not available here",
        )


def set_dynamic_shared_memory(kernel, nbytes: int, what: str) -> None:
    """Let ``kernel`` be launched with ``nbytes`` of dynamic shared memory (above 48 KB it is opt-in)."""
    _set_attribute(
        kernel,
        "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES",
        nbytes,
        f"{what} cannot have {nbytes} B of shared memory",
    )


def _set_attribute(kernel, attribute: str, value: int, message: str) -> None:
    from cuda.bindings import driver

    attr = getattr(driver.CUfunction_attribute, attribute)
    dev = driver.CUdevice(torch.cuda.current_device())
    (err,) = driver.cuKernelSetAttribute(attr, value, kernel.handle, dev)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise ValueError(f"{message} ({err})")


def max_active_clusters(kernel, block: int, cluster: int, shmem: int) -> int | None:
    """The driver's count of clusters of ``cluster`` CTAs of ``block`` threads (``shmem`` bytes of dynamic shared
    memory each) that the current GPU runs at once; None where the query is unavailable."""
    try:
        from cuda.bindings import driver

        err, func = driver.cuKernelGetFunction(kernel.handle)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = cluster, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
        cfg.sharedMemBytes = shmem
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        err, n = driver.cuOccupancyMaxActiveClusters(func, cfg)
        return int(n) if err == driver.CUresult.CUDA_SUCCESS else None
    except Exception:  # an older cuda-bindings without these entry points
        return None


class _TorchStream:
    """A stream handle in the __cuda_stream__ protocol (cuda-core releases without Stream.from_handle)."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def current_stream(device=None):
    """PyTorch's current stream on ``device`` as a cuda.core stream, for ``cuda.core.launch``."""
    handle = torch.cuda.current_stream(device).cuda_stream
    stream_cls = getattr(cuda_core(), "Stream", None)
    if hasattr(stream_cls, "from_handle"):
        return stream_cls.from_handle(handle)
    return _TorchStream(handle)


def launch(kernel, device, grid: int, block: int, args, cluster: int = 0, shmem: int = 0) -> None:
    """One launch on PyTorch's current stream of ``device``; with ``cluster``, ``grid`` counts clusters."""
    core = cuda_core()
    core.Device(device.index or 0).set_current()
    extra = {"cluster": cluster} if cluster else {}
    if shmem:
        extra["shmem_size"] = shmem
    core.launch(current_stream(device), core.LaunchConfig(grid=grid, block=block, **extra), kernel, *args)
