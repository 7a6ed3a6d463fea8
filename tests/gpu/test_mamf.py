"""The MAMF sweep on a real GPU: its ceiling beside the catalog's (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from tunelab import probe
from tunelab.plan import catalog

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_mamf_reaches_a_plausible_share_of_the_catalog_peak():
    dev = torch.device("cuda")
    flops, shape = probe.measure_mamf(torch.bfloat16, dev, shapes=[(2048, 4096, 4096), (4096, 8192, 8192)])
    props = torch.cuda.get_device_properties(dev)
    row = catalog.match_gpu(props.name, props.total_memory)
    assert shape in [(2048, 4096, 4096), (4096, 8192, 8192)]
    if row is not None:
        # every published MAMF lies between half the dense peak and just over it (catalog/gpus.yaml)
        assert 0.4 * row.peak_flops < flops < 1.2 * max(row.peak_flops, catalog.ceilings(row.id).mamf_flops)
