"""Attempt-duration percentiles from the histograms of the console's per-minute rollup
(delivery_minutes.durations, schema/011_delivery_minutes.sql).

Bucket 0 holds 0 ms; bucket k (1..len(BOUNDS)) holds the durations from BOUNDS[k - 1] up
to BOUNDS[k] (the last one, from 881,744 ms or 14.7 minutes, open-ended): four buckets per
doubling of the duration, so the k-th smallest duration is placed within one bucket, at
most 19 % wide (below the last one). The SQL function
duration_bucket_bounds() holds the same list (tests/test_delivery_minutes.py compares
them); bisect_right here is width_bucket() there.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

BOUNDS: tuple[int, ...] = (
    1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 23, 27, 32, 39, 46, 54, 64, 77, 91, 108,
    128, 153, 182, 216, 256, 305, 363, 431, 512, 609, 725, 862, 1024, 1218, 1449, 1723,
    2048, 2436, 2897, 3445, 4096, 4871, 5793, 6889, 8192, 9742, 11586, 13778, 16384,
    19484, 23171, 27555, 32768, 38968, 46341, 55109, 65536, 77936, 92682, 110218, 131072,
    155872, 185364, 220436, 262144, 311744, 370728, 440872, 524288, 623488, 741456,
    881744,
)
BUCKETS = len(BOUNDS) + 1


def bucket_of(duration_ms: int) -> int:
    return bisect_right(BOUNDS, duration_ms)


def _bucket_range(bucket: int, lowest: int, highest: int) -> tuple[float, float]:
    """The whole milliseconds bucket `bucket` can hold, within the observed [lowest,
    highest] (which makes a window of equal durations exact)."""
    low = 0 if bucket == 0 else BOUNDS[bucket - 1]
    high = BOUNDS[bucket] - 1 if bucket < len(BOUNDS) else highest
    return float(max(low, lowest)), float(max(min(high, highest), max(low, lowest)))


def percentile(
    counts: Sequence[int], q: float, lowest: int | None, highest: int | None
) -> float | None:
    """The q-quantile (0..1) as percentile_cont computes it (interpolating between the
    two durations around rank q * (n - 1)), with each duration estimated from its bucket:
    the n durations of a bucket spread evenly over its range. None without durations."""
    total = sum(counts)
    if total == 0 or lowest is None or highest is None:
        return None
    rank = q * (total - 1)
    below = int(rank)
    low = _nth(counts, below, lowest, highest)
    if rank == below:
        return low
    return low + (rank - below) * (_nth(counts, below + 1, lowest, highest) - low)


def _nth(counts: Sequence[int], n: int, lowest: int, highest: int) -> float:
    """The estimate of the n-th smallest duration (0-based)."""
    seen = 0
    for bucket, count in enumerate(counts):
        if count and n < seen + count:
            low, high = _bucket_range(bucket, lowest, highest)
            if count == 1:
                return (low + high) / 2
            return low + (high - low) * (n - seen) / (count - 1)
        seen += count
    raise ValueError(f"rank {n} beyond the histogram's {seen} durations")
