"""The matmul probe: the achieved matmul FLOP/s of the present device, which MFU and plan's local time divide by.

The probe's size follows the device instead of being fixed: a CPU without bf16 units emulates a bf16 matmul
at ~1 GFLOP/s, where one 2048³ product takes minutes, while AMX and GPUs only reach their plateau at large
sizes (benchmarks/README.md, "The matmul probe"). So n doubles from `MIN_N` while one product still fits
several times into a window, up to the device's plateau size, and each (device, dtype) is probed once per
process: every later caller reads the same figure.
"""

from __future__ import annotations

import time

import torch

from .device import synchronize

# A CPU reaches its matmul plateau (oneDNN, AMX) by 2048³; a GPU needs 8192³ (docs/formulas.md's H100/H200 figures).
CPU_MAX_N = 2048
GPU_MAX_N = 8192
MIN_N = 256
PROBE_SECONDS = 2.0
WINDOWS = 8

_cache: dict[tuple[str, torch.dtype], tuple[float, int]] = {}
# The copy probe: a buffer well beyond the last-level cache, so that it reads the memory system, not a cache.
COPY_MIB = 256
_copy_cache: dict[str, float] = {}
# The MAMF sweep (stas00/ml-engineering's mamf-finder.py, shortened to fit a bench run): M over the token counts
# of training micro-batches, N and K over the hidden and MLP widths of 1B-70B models; every shape a multiple of
# 256, as the finder's ranges step.
MAMF_M = (1024, 2048, 4096, 8192)
MAMF_NK = (2048, 4096, 8192, 14336)
MAMF_ITERATIONS = 20
MAMF_WARMUP = 5
_mamf_cache: dict[tuple[str, torch.dtype], tuple[float, tuple[int, int, int]]] = {}
# The product-call probe: a Mixture-of-Experts layer's per-expert products on a CPU (model/moe.Segments), CALL_PRODUCTS
# experts of CALL_ROWS rows each, hidden 256 into a gated width of 512, as one product per expert against one
# product over all the rows.
CALL_PRODUCTS = 32
CALL_ROWS = 64
CALL_K, CALL_N = 256, 512
_call_cache: dict[tuple[str, torch.dtype], float] = {}


def max_size(device: torch.device) -> int:
    return GPU_MAX_N if device.type == "cuda" else CPU_MAX_N


def _time_one(n: int, dtype: torch.dtype, device: torch.device) -> tuple[float, torch.Tensor, torch.Tensor]:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.matmul(a, b)  # warm-up: kernel selection and first-touch allocation
    synchronize(device)
    start = time.perf_counter()
    torch.matmul(a, b)
    synchronize(device)
    return time.perf_counter() - start, a, b


def measure_matmul_peak(
    dtype: torch.dtype,
    device: torch.device,
    seconds: float | None = None,
    windows: int = WINDOWS,
    max_n: int | None = None,
) -> tuple[float, int]:
    """(achieved FLOP/s, n) of an n x n x n matmul in `dtype`: the fastest of `windows` windows that together
    last about `seconds`, alternating between the largest size that fits and half of it.

    An n³ matmul costs 2·n³ FLOPs. n doubles while the next size's product (8x the work) still takes at most
    half a window, so a window always holds two or more products and the whole probe stays near `seconds`
    however slow the dtype is on this device. The fastest window, not the mean: on a shared machine a mean
    counts other processes' time as the device's, and a low peak inflates every MFU divided by it.
    """
    top = max_n or max_size(device)
    window = (PROBE_SECONDS if seconds is None else seconds) / windows  # read now: the test suite shortens it
    n = MIN_N
    elapsed, a, b = _time_one(n, dtype, device)
    while n * 2 <= top and 8 * elapsed <= window / 2:
        n *= 2
        elapsed, a, b = _time_one(n, dtype, device)
    # Half the windows at n/2 as well: where a size dips (fp32 at 2048³ on AVX CPUs reads below 1024³,
    # cache-blocking), the peak is the better of the two sizes, never the dip
    # (benchmarks/design-decisions_cpu_2026-11-22.md#half-size-windows-of-the-matmul-probe).
    sizes = [(n, a, b)]
    if n > MIN_N:
        half = n // 2
        sizes.append((half, a[:half, :half].contiguous(), b[:half, :half].contiguous()))
    best, best_n = 0.0, n
    for i in range(windows):
        size, x, y = sizes[i % len(sizes)]
        start = time.perf_counter()
        runs = 0
        while True:
            torch.matmul(x, y)
            runs += 1
            synchronize(device)
            elapsed = time.perf_counter() - start
            if elapsed >= window:
                rate = 2.0 * size**3 * runs / elapsed
                if rate > best:
                    best, best_n = rate, size
                break
    return best, best_n


def matmul_peak(dtype: torch.dtype, device: torch.device, fresh: bool = False) -> tuple[float, int]:
    """`measure_matmul_peak` at the default budget, once per process for each (device, dtype); `fresh` probes
    again (and keeps the new figure for later callers)."""
    key = (str(device), dtype)
    if fresh or key not in _cache:
        _cache[key] = measure_matmul_peak(dtype, device)
    return _cache[key]


def measure_copy_bandwidth(device: torch.device, mib: int | None = None, windows: int = WINDOWS) -> float:
    """Achieved memory bandwidth (bytes read + written per second) of copying an fp32 buffer of `mib` MiB into
    another that was touched already: the fastest of `windows` copies, for the reason measure_matmul_peak takes
    the fastest window. plan's memory-bound part on a CPU runs against it (at a fitted multiple, plan/fit.py);
    the figure moves with what else the machine's memory serves."""
    n = (COPY_MIB if mib is None else mib) * 2**20 // 4  # read now: the test suite shortens it
    source = torch.randn(n, device=device)
    target = torch.empty_like(source).copy_(source)  # first touch outside the timed copies
    best = 0.0
    for _ in range(windows):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        best = max(best, 2 * 4 * n / (time.perf_counter() - start))
    return best


def copy_bandwidth(device: torch.device, fresh: bool = False) -> float:
    """`measure_copy_bandwidth` once per process for each device; `fresh` probes again (and keeps the figure)."""
    key = str(device)
    if fresh or key not in _copy_cache:
        _copy_cache[key] = measure_copy_bandwidth(device)
    return _copy_cache[key]


def measure_product_call_s(
    dtype: torch.dtype, device: torch.device, windows: int = WINDOWS, products: int = CALL_PRODUCTS
) -> float:
    """Seconds each product of a loop of small products costs beyond its arithmetic: `products` products of
    CALL_ROWS rows, each with its own weight and into its own slice of one output (as model/moe.Segments runs an MoE
    layer's experts on a CPU), less one product over all those rows with one weight, over the products. The
    fastest of `windows` of each. On a CPU every small product pays oneDNN's dispatch and its threads' start, a
    cost the FLOPs do not show (20-40 µs on a 2-core EPYC: plan/steptime.expert_product_calls counts them)."""
    rows = products * CALL_ROWS
    x = torch.randn(rows, CALL_K, device=device).to(dtype)
    w = torch.randn(products, CALL_K, CALL_N, device=device).to(dtype)
    out = torch.empty(rows, CALL_N, device=device, dtype=dtype)

    def loop():
        for e in range(products):
            a = e * CALL_ROWS
            torch.mm(x[a : a + CALL_ROWS], w[e], out=out[a : a + CALL_ROWS])

    def one():
        torch.mm(x, w[0], out=out)

    budget = PROBE_SECONDS / 8  # read now: the test suite shortens it; a dtype a CPU emulates stops after 2 windows
    best = {}
    for run in (loop, one):
        run()  # warm-up: kernel creation and first touch
        fastest, began = float("inf"), time.perf_counter()
        for i in range(windows):
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            fastest = min(fastest, time.perf_counter() - start)
            if i >= 1 and time.perf_counter() - began > budget:
                break
        best[run.__name__] = fastest
    return max(0.0, (best["loop"] - best["one"]) / products)


def product_call_s(dtype: torch.dtype, device: torch.device, fresh: bool = False) -> float:
    """`measure_product_call_s` once per process for each (device, dtype); `fresh` probes again."""
    key = (str(device), dtype)
    if fresh or key not in _call_cache:
        _call_cache[key] = measure_product_call_s(dtype, device)
    return _call_cache[key]


def mamf_shapes() -> list[tuple[int, int, int]]:
    """(m, n, k) of the MAMF sweep."""
    return [(m, n, k) for m in MAMF_M for n in MAMF_NK for k in MAMF_NK]


def measure_mamf(
    dtype: torch.dtype,
    device: torch.device,
    shapes: list[tuple[int, int, int]] | None = None,
    iterations: int = MAMF_ITERATIONS,
    warmup: int = MAMF_WARMUP,
) -> tuple[float, tuple[int, int, int]]:
    """(the Maximum Achievable Matmul FLOP/s, the (m, n, k) that reached it): the best of the shapes' mean rates,
    each over `iterations` products into a preallocated output after `warmup` (mamf-finder.py's measure: a
    mean per shape, the maximum over shapes). plan's unmeasured GPUs scale by this ceiling (catalog.ceilings);
    bench records it for every GPU it runs on, so that each GPU measured adds its own."""
    best, best_shape = 0.0, (0, 0, 0)
    for m, n, k in shapes or mamf_shapes():
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        for _ in range(warmup):
            torch.matmul(a, b, out=out)
        synchronize(device)
        start = time.perf_counter()
        for _ in range(iterations):
            torch.matmul(a, b, out=out)
        synchronize(device)
        rate = 2.0 * m * n * k * iterations / (time.perf_counter() - start)
        if rate > best:
            best, best_shape = rate, (m, n, k)
        del a, b, out
    return best, best_shape


def mamf(dtype: torch.dtype, device: torch.device, fresh: bool = False) -> tuple[float, tuple[int, int, int]]:
    """`measure_mamf` over the default sweep, once per process for each (device, dtype)."""
    key = (str(device), dtype)
    if fresh or key not in _mamf_cache:
        _mamf_cache[key] = measure_mamf(dtype, device)
    return _mamf_cache[key]
